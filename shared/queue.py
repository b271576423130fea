"""The queue client: how jobs enter Redis, get claimed, and become final.

Writes that matter are Lua scripts, so each is atomic and safe to retry:
- `submit`: admission cap + idempotency key + record + stream entry, all or nothing; a
  no-op if the job id (or the idempotency key) already exists;
- `claim`: a worker marks jobs running (only from `queued`) and reads them, in one trip;
- `start`: right before a batch, counts each job's first device start on the broker
  (`attempts`, so a crash that never returns still counts) and returns live statuses;
- `finish`: writes the final fields, sets the TTL, releases the admission count and
  publishes (and dead-letters, for a poisoned job), unless the job is already final: a
  duplicate delivery after a crash can never clobber a result, and it is published once;
- `hand_back`: a stopping worker re-queues a job it never started, at once.
Order on the worker is result → notify → XACK (reliability guide #7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.shared import keys
from inferq.shared.jobs import FINAL, Job, decode_job, encode_submit, pack_field

_FINAL_LUA = "{" + ", ".join(f"['{s}']=true" for s in sorted(FINAL)) + "}"

# KEYS: job, stream, counter[, idempotency]. ARGV: id, items, max_queue, idem_ttl_s, fields...
# Returns {status, value}: ok → entry id; dup → existing job id; full → current depth.
SUBMIT_LUA = """
if #KEYS == 4 then
  local prior = redis.call('GET', KEYS[4])
  if prior then return {'dup', prior} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'dup', ARGV[1]} end
local depth = tonumber(redis.call('GET', KEYS[3]) or '0')
if depth + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {'full', tostring(depth)} end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
local eid = redis.call('XADD', KEYS[2], '*', 'job', ARGV[1])
redis.call('HSET', KEYS[1], 'entry', cmsgpack.pack(eid))
redis.call('INCRBY', KEYS[3], ARGV[2])
if #KEYS == 4 then redis.call('SET', KEYS[4], ARGV[1], 'EX', ARGV[4]) end
return {'ok', eid}
"""

# ARGV[1] = packed now_ms. Returns one HGETALL-style array per key ({} if missing).
CLAIM_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local raw = redis.call('HGET', key, 'status')
  if not raw then
    out[i] = {}
  else
    if cmsgpack.unpack(raw) == 'queued' then
      redis.call('HSET', key, 'status', cmsgpack.pack('running'), 'started_ms', ARGV[1])
    end
    out[i] = redis.call('HGETALL', key)
  end
end
return out
"""

# KEYS: jobs about to run on the device. ARGV[i] = '1' if job i starts its first item in this
# worker: counted in `attempts` (device starts). A job whose worker dies while it is on the
# device comes back with one more attempt; one that merely waited in a dead worker's hands
# does not, so only the job that kills workers is ever dead-lettered. Returns raw statuses.
START_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local raw = redis.call('HGET', key, 'status')
  out[i] = raw or ''
  if raw and ARGV[i] == '1' and not FINAL[cmsgpack.unpack(raw)] then
    local attempts = redis.call('HGET', key, 'attempts')
    redis.call('HSET', key, 'attempts', cmsgpack.pack((attempts and cmsgpack.unpack(attempts) or 0) + 1))
  end
end
return out
"""

# Final outcomes for a batch of jobs in one call (a script call costs Redis far more than
# the writes inside it). KEYS: counter, dead-letter stream, job 1, job 2, ... ARGV: ttl_s,
# only_if_queued (0|1), then per job: channel, dead (0|1), 2n, n field/value pairs.
# Returns per job: 1 written, 0 already final, 2 not queued (only_if_queued), -1 no such job.
FINISH_LUA = """
local out, a = {}, 3
for i = 3, #KEYS do
  local key, channel, dead, n = KEYS[i], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local first, last = a + 3, a + 2 + n
  a = last + 1
  local raw = redis.call('HGET', key, 'status')
  local status = raw and cmsgpack.unpack(raw)
  if not raw then
    out[#out + 1] = -1
  elseif FINAL[status] then
    out[#out + 1] = 0
  elseif ARGV[2] == '1' and status ~= 'queued' then
    out[#out + 1] = 2
  else
    redis.call('HSET', key, unpack(ARGV, first, last))
    redis.call('EXPIRE', key, ARGV[1])
    local items = redis.call('HGET', key, 'items')
    if items then
      if redis.call('DECRBY', KEYS[1], cmsgpack.unpack(items)) < 0 then redis.call('SET', KEYS[1], 0) end
    end
    if dead == '1' then
      redis.call('XADD', KEYS[2], '*', 'job', cmsgpack.unpack(redis.call('HGET', key, 'id')))
    end
    redis.call('PUBLISH', channel, 'final')
    out[#out + 1] = 1
  end
end
return out
"""

# KEYS: job, stream. ARGV: group, old entry id, job id.
# Re-queues a not-final, never-started job at the tail; acks the old entry.
HAND_BACK_LUA = """
local raw = redis.call('HGET', KEYS[1], 'status')
if raw and not FINAL[cmsgpack.unpack(raw)] then
  local eid = redis.call('XADD', KEYS[2], '*', 'job', ARGV[3])
  redis.call('HSET', KEYS[1], 'status', cmsgpack.pack('queued'), 'entry', cmsgpack.pack(eid))
  redis.call('HDEL', KEYS[1], 'started_ms')
end
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[2])
return raw and 1 or 0
"""


def _with_final(body: str) -> str:
    return f"local FINAL = {_FINAL_LUA}\n{body}"


@dataclass(slots=True)
class Entry:
    """One stream entry as read by a worker."""

    stream: str
    entry_id: str
    job_id: str


@dataclass(slots=True)
class Final:
    """A final outcome to write for one job, with the stream entry to ack after it."""

    model: str
    stream: str
    entry_id: str
    job_id: str
    fields: dict[str, bytes]
    dead_letter: bool = False


@dataclass(slots=True)
class Submitted:
    """What `submit` did: `created`, or `duplicate` of `job_id`, or `full` at `depth`."""

    outcome: str
    job_id: str = ""
    entry_id: str = ""
    depth: int = 0


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class JobQueue:
    """Thin async wrapper over one Redis client; both the API and the worker use it."""

    def __init__(self, redis: Redis, *, result_ttl_s: int) -> None:
        self.redis = redis
        self.result_ttl_s = result_ttl_s
        self._submit = redis.register_script(SUBMIT_LUA)
        self._claim = redis.register_script(_with_final(CLAIM_LUA))
        self._finish = redis.register_script(_with_final(FINISH_LUA))
        self._hand_back = redis.register_script(_with_final(HAND_BACK_LUA))
        self._start = redis.register_script(_with_final(START_LUA))

    # --- API side ---
    async def submit(
        self,
        job: Job,
        *,
        max_queue: int = 2**62,
        idempotency_key: str | None = None,
        idempotency_ttl_s: int = 86_400,
    ) -> Submitted:
        """Admit, record and enqueue atomically (retry-safe: keyed by job id / idempotency key)."""
        argv: list[bytes | str | int] = [job.id, len(job.inputs), max_queue, idempotency_ttl_s]
        for k, v in encode_submit(job).items():
            argv += [k, v]
        script_keys = [
            keys.job(job.id),
            keys.stream(job.model, job.priority),
            keys.queued_items(job.model),
        ]
        if idempotency_key is not None:
            script_keys.append(keys.idempotency(job.tenant, idempotency_key))
        outcome, value = await self._submit(keys=script_keys, args=argv)
        outcome, value = _s(outcome), _s(value)
        if outcome == "ok":
            job.entry = value
            return Submitted("created", job.id, value)
        if outcome == "dup":
            return Submitted("duplicate", value)
        return Submitted("full", depth=int(value))

    async def get(self, job_id: str) -> Job | None:
        raw = await self.redis.hgetall(keys.job(job_id))
        return decode_job(raw) if raw else None

    async def cancel(self, job: Job, fields: dict[str, bytes], *, only_if_queued: bool) -> int:
        """Finalise a job from outside a worker (cancel/expire); same guard as `finish`."""
        final = Final(job.model, "", "", job.id, fields)
        script_keys, argv = self._finish_args(job.model, [final], only_if_queued)
        return int((await self._finish(keys=script_keys, args=argv))[0])

    def _finish_args(
        self, model: str, finals: Sequence[Final], only_if_queued: bool = False
    ) -> tuple[list[str], list[bytes | str | int]]:
        script_keys = [keys.queued_items(model), keys.dead(model)]
        argv: list[bytes | str | int] = [self.result_ttl_s, "1" if only_if_queued else "0"]
        for f in finals:
            script_keys.append(keys.job(f.job_id))
            argv += [keys.done_channel(f.job_id), "1" if f.dead_letter else "0", 2 * len(f.fields)]
            for k, v in f.fields.items():
                argv += [k, v]
        return script_keys, argv

    async def queue_depth(self, model: str) -> int:
        """Jobs waiting or running: acked entries are deleted, so stream lengths are it."""
        async with self.redis.pipeline(transaction=False) as p:
            for s in keys.streams(model):
                p.xlen(s)
            return sum(int(n) for n in await p.execute())

    async def queued_items(self, model: str) -> int:
        return int(await self.redis.get(keys.queued_items(model)) or 0)

    async def position(self, job: Job, limit: int = 1000) -> int:
        """Entries ahead of `job`: all of higher lanes plus the older ones of its own (capped)."""
        ahead = 0
        async with self.redis.pipeline(transaction=False) as p:
            for lane in keys.LANES[: keys.LANES.index(job.priority)]:
                p.xlen(keys.stream(job.model, lane))
            if job.entry:
                p.xrange(keys.stream(job.model, job.priority), "-", f"({job.entry}", count=limit)
            replies = await p.execute()
        for r in replies:
            ahead += len(r) if isinstance(r, list) else int(r)
        return ahead

    async def live_workers(self, model: str, now_ms: int) -> list[str]:
        ids = await self.redis.zrangebyscore(keys.workers(model), now_ms, "+inf")
        return [_s(i) for i in ids]

    async def throughput(self, model: str, now_ms: int) -> float:
        """Items/s over the last few seconds, summed over the model's live workers."""
        ids = await self.live_workers(model, now_ms)
        if not ids:
            return 0.0
        async with self.redis.pipeline(transaction=False) as p:
            for i in ids:
                p.hget(keys.worker(i), "items_per_s")
            values = await p.execute()
        return sum(float(v) for v in values if v)

    # --- worker side ---
    async def ensure_group(self, model: str) -> None:
        """Create streams and group if missing; BUSYGROUP means another worker did."""
        for s in keys.streams(model):
            try:
                await self.redis.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    async def read(
        self,
        model: str,
        consumer: str,
        *,
        count: int,
        block_ms: int | None,
        pending: bool = False,
        lanes: Sequence[str] = keys.LANES,
    ) -> list[Entry]:
        """XREADGROUP over `lanes` in order: new entries ('>'), or our own unacked ('0')."""
        streams = {keys.stream(model, lane): "0" if pending else ">" for lane in lanes}
        reply = await self.redis.xreadgroup(
            keys.GROUP, consumer, streams, count=count, block=None if pending else block_ms
        )
        return self._entries(reply)

    @staticmethod
    def _entries(reply: object) -> list[Entry]:
        entries: list[Entry] = []
        if isinstance(reply, dict):  # RESP3 shape
            reply = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
        for stream, items in reply or []:  # type: ignore[attr-defined]
            for entry_id, fields in items:
                job_id = (fields or {}).get(b"job")
                # A deleted entry still in the PEL reads back with no fields.
                entries.append(Entry(_s(stream), _s(entry_id), job_id.decode() if job_id else ""))
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

    async def start(self, job_ids: Sequence[str], first: Sequence[bool]) -> list[bytes]:
        """Before a batch runs: count first device starts; return each job's raw status."""
        if not job_ids:
            return []
        return await self._start(
            keys=[keys.job(j) for j in job_ids], args=["1" if f else "0" for f in first]
        )

    async def take_over(
        self,
        model: str,
        consumer: str,
        *,
        dead: Sequence[str],
        dead_idle_ms: int,
        stuck_idle_ms: int,
    ) -> list[Entry]:
        """Claim entries of dead consumers (their heartbeat is gone) and of stuck ones.

        The min-idle guard makes racing live workers safe: once one has claimed an entry
        its idle time resets, and the others' XCLAIM skips it.
        """
        taken: list[Entry] = []
        for s in keys.streams(model):
            ids: list[str] = []
            for name in dead:
                pending = await self.redis.xpending_range(
                    s, keys.GROUP, "-", "+", 1000, consumername=name
                )
                ids += [_s(p["message_id"]) for p in pending]
            if ids:
                claimed = await self.redis.xclaim(s, keys.GROUP, consumer, dead_idle_ms, ids)
                taken += self._entries([(s, claimed)])
            cursor = "0-0"
            for _ in range(10):  # bounded per pass; the next pass continues
                reply = await self.redis.xautoclaim(
                    s, keys.GROUP, consumer, stuck_idle_ms, start_id=cursor, count=100
                )
                cursor, claimed = _s(reply[0]), reply[1]
                taken += self._entries([(s, claimed)])
                # reply[2] lists ids deleted while pending: XAUTOCLAIM already dropped them.
                if cursor == "0-0":
                    break
        return taken

    async def consumers(self, model: str) -> dict[str, int]:
        """Consumer name → pending count, over all lanes."""
        out: dict[str, int] = {}
        for s in keys.streams(model):
            try:
                for c in await self.redis.xinfo_consumers(s, keys.GROUP):
                    name = _s(c["name"])
                    out[name] = out.get(name, 0) + int(c.get("pending", 0))
            except ResponseError:
                continue
        return out

    async def ack(self, entries: Sequence[Entry]) -> None:
        if entries:
            async with self.redis.pipeline(transaction=False) as p:
                for e in entries:
                    p.xack(e.stream, keys.GROUP, e.entry_id)
                    p.xdel(e.stream, e.entry_id)
                await p.execute()

    async def hand_back(self, entries: Sequence[Entry]) -> None:
        async with self.redis.pipeline(transaction=False) as p:
            for e in entries:
                await self._hand_back(
                    keys=[keys.job(e.job_id), e.stream],
                    args=[keys.GROUP, e.entry_id, e.job_id],
                    client=p,
                )
            await p.execute()

    async def finish(self, finals: Sequence[Final]) -> list[int]:
        """Write every final outcome, then ack their entries: one atomic round trip in all
        (MULTI/EXEC, so a dead-letter entry, the final state and the ack land together),
        one script call per model and one XACK + XDEL per stream."""
        if not finals:
            return []
        by_model: dict[str, list[Final]] = {}
        by_stream: dict[str, list[str]] = {}
        for f in finals:
            by_model.setdefault(f.model, []).append(f)
            by_stream.setdefault(f.stream, []).append(f.entry_id)
        async with self.redis.pipeline(transaction=True) as p:
            for model, group in by_model.items():
                script_keys, argv = self._finish_args(model, group)
                await self._finish(keys=script_keys, args=argv, client=p)
            for stream, ids in by_stream.items():
                p.xack(stream, keys.GROUP, *ids)
                p.xdel(stream, *ids)
            results = await p.execute()
        outcome = {
            f.job_id: int(r)
            for group, rs in zip(by_model.values(), results, strict=False)
            for f, r in zip(group, rs, strict=True)
        }
        return [outcome[f.job_id] for f in finals]
