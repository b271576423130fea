"""The Redis side of the Batch API: batch records (`BatchRecord`), their line results and
leases (`BatchStore`), and the Lua scripts that change them.

A batch record is a hash of plain strings (`keys.batch`, TTL `INFERQ_BATCH_FILE_TTL_S`);
its counts `completed` and `failed` move only together with the line results they count
(`RECORD`: HSETNX per line, so a line recorded twice counts once), and every status change
is a guarded script: from the statuses it may leave, never out of a final one.

Cluster slots: a batch's keys share the tag `{batch id}`, so each script and MULTI here
touches one slot. The tenant's index and `BATCHES_ACTIVE` are in slots of their own and are
written in steps of their own, after the record (`create`, `deactivate`): an id is listed
or active only once its record exists, and readers drop an entry whose record is gone
(`page`) or, from `BATCHES_ACTIVE`, final (`BatchRunner`).

The routes (`inferq.api.batches`) create, read and cancel records; the batch runner
(`inferq.api.batch_runner`, `inferq.api.batch_run`) takes leases, records results and ends
batches. Lua lives here rather than in `inferq.shared.scripts` because only the API's batch
runner runs it; like those, it is built from constants only.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from inferq.api.files import BATCH_FINAL, index_ids, index_rank
from inferq.shared import keys
from inferq.shared.errors import JobConflict, JobNotFound
from inferq.shared.redis_conn import unavailable

FINAL = BATCH_FINAL
WINDOWS = {"24h": 86_400}  # completion_window → seconds; OpenAI offers only 24h
RESULTS_GRACE_S = 300  # line results kept after the files are written (see FINISH)
TIMESTAMPS = (
    "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
    "cancelling_at", "cancelled_at",
)  # fmt: skip
_LUA_FINAL = "local FINAL = {" + ", ".join(f"['{s}']=true" for s in FINAL) + "}\n"

# KEYS: batch. ARGV: to, timestamp field, now, from... → the status after the call.
ADVANCE = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return '' end
for i = 4, #ARGV do
  if st == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[2], ARGV[3])
    return ARGV[1]
  end
end
return st
"""

# KEYS: results, batch. ARGV: ttl_s, then (line, value) pairs; a value's first byte is its
# kind (o: output, e: error). A line already recorded is left alone and not counted again;
# nothing is recorded once the batch is final. → {new outputs, new errors}.
RECORD = (
    _LUA_FINAL
    + """
local st = redis.call('HGET', KEYS[2], 'status')
if not st or FINAL[st] then return {0, 0} end
local ok, err = 0, 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    if string.sub(ARGV[i + 1], 1, 1) == 'o' then ok = ok + 1 else err = err + 1 end
  end
end
if ok > 0 then redis.call('HINCRBY', KEYS[2], 'completed', ok) end
if err > 0 then redis.call('HINCRBY', KEYS[2], 'failed', err) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {ok, err}
"""
)

# KEYS: batch, results. ARGV: status, timestamp field, now, output file id, error file id,
# errors JSON ('' for none), grace s. The files hold the results now; the hash stays
# `RESULTS_GRACE_S` more, so a paused ex-holder that finalizes late still writes the same
# bytes. → 1 if this call ended the batch, 0 if it had ended already. `BATCHES_ACTIVE` is in
# another slot, so the batch leaves it in a step of its own (`BatchStore.deactivate`).
FINISH = (
    _LUA_FINAL
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st or FINAL[st] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[2], ARGV[3],
  'output_file_id', ARGV[4], 'error_file_id', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'errors', ARGV[6]) end
redis.call('EXPIRE', KEYS[2], ARGV[7])
return 1
"""
)

# KEYS: file, its content. ARGV: ttl_s, expires_at. A batch's input must outlive the batch
# (a runner that takes over reads it again): keep it as long, if it is still there (a file
# deleted meanwhile is not brought back as a hash of one field). → 1 if it is there.
KEEP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""

# KEYS: lease. ARGV: owner, ms. Extend the lease only if we still hold it.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(16)}"


def output_ids(batch_id: str) -> tuple[str, str]:
    """The batch's output and error file ids: derived, so a finalize that is re-run after a
    crash rewrites the same files instead of leaving orphans."""
    out = []
    for kind in ("output", "error"):
        out.append("file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:32])
    return out[0], out[1]


@dataclass(slots=True)
class BatchRecord:
    fields: dict[str, str]

    @property
    def id(self) -> str:
        return self.fields["id"]

    @property
    def tenant(self) -> str:
        return self.fields.get("tenant", "")

    @property
    def status(self) -> str:
        return self.fields["status"]

    @property
    def endpoint(self) -> str:
        return self.fields["endpoint"]

    @property
    def input_file_id(self) -> str:
        return self.fields["input_file_id"]

    @property
    def expires_at(self) -> int:
        return int(self.fields["expires_at"])

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def _int(self, name: str) -> int | None:
        v = self.fields.get(name)
        return int(v) if v else None

    def view(self) -> dict[str, Any]:
        """OpenAI's batch object."""
        f = self.fields
        errors = orjson.loads(f["errors"]) if f.get("errors") else None
        body: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
            "input_file_id": self.input_file_id, "completion_window": f["completion_window"],
            "status": self.status, "output_file_id": f.get("output_file_id") or None,
            "error_file_id": f.get("error_file_id") or None,
            "created_at": int(f["created_at"]), "expires_at": self.expires_at,
        }  # fmt: skip
        body |= {t: self._int(t) for t in TIMESTAMPS}
        body["request_counts"] = {
            "total": int(f.get("total", 0)),
            "completed": int(f.get("completed", 0)),
            "failed": int(f.get("failed", 0)),
        }
        body["metadata"] = orjson.loads(f["metadata"]) if f.get("metadata") else None
        return body


class BatchStore:
    """Batch records, their line results and their leases. Redis failures leave every
    method as QueueUnavailable."""

    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._advance = redis.register_script(ADVANCE)
        self._record = redis.register_script(RECORD)
        self._finish = redis.register_script(FINISH)
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._keep = redis.register_script(KEEP)

    # --- records ---
    @unavailable
    async def create(
        self,
        tenant: str,
        *,
        input_file_id: str,
        endpoint: str,
        window: str,
        total: int,
        metadata: dict[str, str] | None,
    ) -> BatchRecord:
        now = time.time()
        created = int(now)
        fields = {
            "id": new_batch_id(), "tenant": tenant, "status": "validating",
            "endpoint": endpoint, "input_file_id": input_file_id, "completion_window": window,
            "created_at": str(created), "expires_at": str(created + WINDOWS[window]),
            "total": str(total), "completed": "0", "failed": "0",
            "metadata": orjson.dumps(metadata).decode() if metadata else "",
        }  # fmt: skip
        rec = BatchRecord(fields)
        # One slot per step (a cluster runs a script or a MULTI on one slot only), in an
        # order that leaves, wherever this process dies, only what readers already handle:
        # 1. the input file is kept as long as the batch: alone, a file lives longer;
        # 2. the record: alone, a batch nobody was told of, gone after its TTL;
        # 3. BATCHES_ACTIVE: only once the record is there, so a runner that finds the id
        #    finds the record (a runner drops an id whose record is gone or final);
        # 4. the tenant's index, last: a batch that runs is at worst unlisted (readable by
        #    id), never listed and left `validating` with no runner to start it. An index
        #    entry whose record is gone is dropped by `page`.
        kept = await self._keep(
            keys=[keys.file(input_file_id), keys.file_content(input_file_id)],
            args=[self.ttl_s, str(created + self.ttl_s)],
        )
        if not kept:
            raise JobNotFound(f"no file {input_file_id!r}")  # deleted since the route read it
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.batch(rec.id), mapping=fields)  # type: ignore[arg-type]
            p.expire(keys.batch(rec.id), self.ttl_s)
            await p.execute()
        await self.redis.sadd(keys.BATCHES_ACTIVE, rec.id)
        index = keys.batches(tenant)
        async with self.redis.pipeline(transaction=True) as p:
            p.zadd(index, {rec.id: now})
            p.zremrangebyscore(index, "-inf", f"({now - self.ttl_s}")
            p.expire(index, self.ttl_s)
            await p.execute()
        return rec

    @unavailable
    async def load(self, batch_id: str) -> BatchRecord | None:
        raw = await self.redis.hgetall(keys.batch(batch_id))
        return BatchRecord({_s(k): _s(v) for k, v in raw.items()}) if raw else None

    async def get(self, batch_id: str, tenant: str) -> BatchRecord:
        rec = await self.load(batch_id)
        if rec is None or rec.tenant != tenant:
            raise JobNotFound(f"no batch {batch_id!r}")
        return rec

    @unavailable
    async def page(
        self, tenant: str, *, limit: int, after: str | None
    ) -> tuple[list[BatchRecord], bool]:
        """The tenant's batches, newest first, after the id `after`; and whether more follow."""
        index = keys.batches(tenant)
        start = 0
        if after:
            rank = await index_rank(self.redis, index, after, desc=True)
            if rank is None:
                return [], False  # an unknown cursor: nothing after it
            start = rank + 1
        ids = await index_ids(self.redis, index, start, start + limit, desc=True)
        async with self.redis.pipeline(transaction=False) as p:
            for i in ids:
                p.hgetall(keys.batch(i))
            raws = await p.execute()
        if gone := [i for i, raw in zip(ids, raws, strict=True) if not raw]:
            await self.redis.zrem(index, *gone)  # expired records: drop them from the index
        recs = [BatchRecord({_s(k): _s(v) for k, v in raw.items()}) for raw in raws if raw]
        return recs[:limit], len(ids) > limit

    @unavailable
    async def advance(self, batch_id: str, to: str, *sources: str) -> str:
        """Move to `to` (stamping `<to>_at`) if the status is one of `sources`; the status after."""
        now = str(int(time.time()))
        args = [to, f"{to}_at", now, *sources]
        return _s(await self._advance(keys=[keys.batch(batch_id)], args=args))

    async def cancel(self, batch_id: str, tenant: str) -> BatchRecord:
        rec = await self.get(batch_id, tenant)
        status = await self.advance(batch_id, "cancelling", "validating", "in_progress")
        if status not in ("cancelling", "cancelled"):
            raise JobConflict(f"batch {batch_id!r} is {status}: there is nothing left to cancel")
        return await self.get(batch_id, rec.tenant)

    # --- the runner's side ---
    @unavailable
    async def active(self) -> list[str]:
        return sorted(_s(b) for b in await self.redis.smembers(keys.BATCHES_ACTIVE))

    @unavailable
    async def deactivate(self, batch_id: str) -> None:
        """Drop a batch whose record is final or gone from `BATCHES_ACTIVE`: a step of its
        own after `finish` (another slot); if it never comes, the next runner to take the
        batch finds the record final and does it."""
        await self.redis.srem(keys.BATCHES_ACTIVE, batch_id)

    @unavailable
    async def acquire(self, batch_id: str, owner: str, lease_ms: int) -> bool:
        key = keys.batch_lease(batch_id)
        if await self.redis.set(key, owner, nx=True, px=lease_ms):
            return True
        # A retried SET whose first try got through reads back as refused: check who holds it.
        return _s(await self.redis.get(key) or b"") == owner

    @unavailable
    async def renew(self, batch_id: str, owner: str, lease_ms: int) -> bool:
        return bool(await self._renew(keys=[keys.batch_lease(batch_id)], args=[owner, lease_ms]))

    @unavailable
    async def release(self, batch_id: str, owner: str) -> None:
        await self._release(keys=[keys.batch_lease(batch_id)], args=[owner])

    @unavailable
    async def done_lines(self, batch_id: str) -> set[int]:
        return {int(k) for k in await self.redis.hkeys(keys.batch_results(batch_id))}

    @unavailable
    async def record(
        self, batch_id: str, results: Sequence[tuple[int, bytes, bytes]]
    ) -> tuple[int, int]:
        """Record (line, kind, line JSON) results; → (new outputs, new errors) counted."""
        ok = err = 0
        for start in range(0, len(results), 64):  # bounded script calls
            args: list[bytes | str | int] = [self.ttl_s]
            for number, kind, line in results[start : start + 64]:
                args += [number, kind + line]
            new = await self._record(
                keys=[keys.batch_results(batch_id), keys.batch(batch_id)], args=args
            )
            ok, err = ok + int(new[0]), err + int(new[1])
        return ok, err

    @unavailable
    async def results(self, batch_id: str, numbers: Sequence[int]) -> list[bytes | None]:
        if not numbers:
            return []
        return list(await self.redis.hmget(keys.batch_results(batch_id), list(numbers)))  # type: ignore[arg-type]

    @unavailable
    async def finish(
        self,
        batch_id: str,
        status: str,
        *,
        output_file_id: str = "",
        error_file_id: str = "",
        errors: list[dict[str, Any]] | None = None,
    ) -> bool:
        """End the batch (its slot only); its runner then drops it from `BATCHES_ACTIVE`."""
        body = orjson.dumps({"object": "list", "data": errors}).decode() if errors else ""
        args: list[str | int] = [
            status, f"{status}_at", str(int(time.time())), output_file_id, error_file_id, body,
            RESULTS_GRACE_S,
        ]  # fmt: skip
        script_keys = [keys.batch(batch_id), keys.batch_results(batch_id)]
        return bool(await self._finish(keys=script_keys, args=args))
