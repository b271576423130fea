"""The queue client: how jobs enter Redis, get claimed, and become final.

Writes that matter are Lua scripts, so each is atomic and safe to retry:
- `submit`: record + stream entry together, a no-op if the job id already exists;
- `claim`: a worker marks jobs running (only from `queued`) and reads them in one trip;
- `finish`: writes the final fields, sets the TTL and publishes, unless the job is
  already final, so a duplicate delivery after a crash can never clobber a result.
Order on the worker is result → notify → XACK (reliability guide #7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared import keys
from shared.jobs import FINAL, Job, decode_job, encode_submit, pack_field

_FINAL_LUA = "{" + ", ".join(f"['{s}']=true" for s in sorted(FINAL)) + "}"

SUBMIT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
return 1
"""

# ARGV[1] = packed now_ms. Returns one HGETALL-style array per key ({} if missing).
CLAIM_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local raw = redis.call('HGET', key, 'status')
  if not raw then
    out[i] = {}
  else
    local attempts = redis.call('HGET', key, 'attempts')
    local n = attempts and cmsgpack.unpack(attempts) or 0
    if cmsgpack.unpack(raw) == 'queued' then
      redis.call('HSET', key, 'status', cmsgpack.pack('running'), 'started_ms', ARGV[1],
                 'attempts', cmsgpack.pack(n + 1))
    elseif not FINAL[cmsgpack.unpack(raw)] then
      redis.call('HSET', key, 'attempts', cmsgpack.pack(n + 1))
    end
    out[i] = redis.call('HGETALL', key)
  end
end
return out
"""

# KEYS[1] = job; ARGV[1] = ttl_s, ARGV[2] = channel, ARGV[3..] = field/value pairs.
# Returns 1 written, 0 already final (nothing changed), -1 no such job.
FINISH_LUA = """
local raw = redis.call('HGET', KEYS[1], 'status')
if not raw then return -1 end
if FINAL[cmsgpack.unpack(raw)] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'final')
return 1
"""


def _with_final(body: str) -> str:
    return f"local FINAL = {_FINAL_LUA}\n{body}"


@dataclass(slots=True)
class Entry:
    """One stream entry as read by a worker."""

    entry_id: str
    job_id: str


@dataclass(slots=True)
class Final:
    """A final outcome to write for one job, with the stream entry to ack after it."""

    model: str
    entry_id: str
    job_id: str
    fields: dict[str, bytes]


class JobQueue:
    """Thin async wrapper over one Redis client; both the API and the worker use it."""

    def __init__(self, redis: Redis, *, result_ttl_s: int) -> None:
        self.redis = redis
        self.result_ttl_s = result_ttl_s
        self._submit = redis.register_script(SUBMIT_LUA)
        self._claim = redis.register_script(_with_final(CLAIM_LUA))
        self._finish = redis.register_script(_with_final(FINISH_LUA))

    # --- API side ---
    async def submit(self, job: Job) -> bool:
        """Record + enqueue atomically; False if that id already exists (retry-safe)."""
        fields = encode_submit(job)
        argv: list[bytes | str] = [job.id]
        for k, v in fields.items():
            argv += [k, v]
        done = await self._submit(keys=[keys.job(job.id), keys.stream(job.model)], args=argv)
        return bool(done)

    async def get(self, job_id: str) -> Job | None:
        raw = await self.redis.hgetall(keys.job(job_id))
        return decode_job(raw) if raw else None

    async def queue_depth(self, model: str) -> int:
        """Jobs waiting or running: acked entries are deleted, so the stream length is it."""
        return int(await self.redis.xlen(keys.stream(model)))

    async def live_workers(self, model: str, now_ms: int) -> list[str]:
        ids = await self.redis.zrangebyscore(keys.workers(model), now_ms, "+inf")
        return [i.decode() if isinstance(i, bytes) else i for i in ids]

    # --- worker side ---
    async def ensure_group(self, model: str) -> None:
        """Create stream and group if missing; BUSYGROUP means another worker did."""
        try:
            await self.redis.xgroup_create(keys.stream(model), keys.GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def read(
        self, model: str, consumer: str, *, count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]:
        """XREADGROUP: new entries ('>'), or this consumer's own unacked ones ('0')."""
        reply = await self.redis.xreadgroup(
            keys.GROUP,
            consumer,
            {keys.stream(model): "0" if pending else ">"},
            count=count,
            block=None if pending else block_ms,
        )
        entries: list[Entry] = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                job_id = (fields or {}).get(b"job")
                # A deleted entry still in the PEL reads back with no fields.
                entries.append(Entry(eid, job_id.decode() if job_id else ""))
        return entries

    async def claim(self, job_ids: Sequence[str], now_ms: int) -> list[Job | None]:
        """Mark queued jobs running and read them; None for a job whose record is gone."""
        if not job_ids:
            return []
        replies = await self._claim(keys=[keys.job(j) for j in job_ids], args=[pack_field(now_ms)])
        out: list[Job | None] = []
        for flat in replies:
            if not flat:
                out.append(None)
                continue
            out.append(decode_job(dict(zip(flat[::2], flat[1::2], strict=True))))
        return out

    async def ack(self, model: str, entry_ids: Sequence[str]) -> None:
        if entry_ids:
            async with self.redis.pipeline(transaction=False) as p:
                p.xack(keys.stream(model), keys.GROUP, *entry_ids)
                p.xdel(keys.stream(model), *entry_ids)
                await p.execute()

    async def finish(self, finals: Sequence[Final]) -> list[int]:
        """Write every final outcome, then ack their entries: one round trip in all."""
        if not finals:
            return []
        async with self.redis.pipeline(transaction=False) as p:
            for f in finals:
                argv: list[bytes | str | int] = [self.result_ttl_s, keys.done_channel(f.job_id)]
                for k, v in f.fields.items():
                    argv += [k, v]
                await self._finish(keys=[keys.job(f.job_id)], args=argv, client=p)
            by_model: dict[str, list[str]] = {}
            for f in finals:
                by_model.setdefault(f.model, []).append(f.entry_id)
            for model, ids in by_model.items():
                p.xack(keys.stream(model), keys.GROUP, *ids)
                p.xdel(keys.stream(model), *ids)
            results = await p.execute()
        return [int(r) for r in results[: len(finals)]]
