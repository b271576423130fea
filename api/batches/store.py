"""The Redis side of the Batch API: batch records (`BatchRecord`), their line results and
leases (`BatchStore`); the Lua scripts that change them are `inferq.shared.lua.batches`.

A batch record is a hash of plain strings (`keys.batch`, TTL `INFERQ_BATCH_FILE_TTL_S`);
its counts `completed` and `failed` move only together with the line results they count
(`RECORD`: HSETNX per line, so a line recorded twice counts once), and every status change
is a guarded script: from the statuses it may leave, never out of a final one.

Cluster slots: a batch's keys share the tag `{batch id}`, so each script and MULTI here
touches one slot. The tenant's index and `BATCHES_ACTIVE` are in slots of their own and are
written in steps of their own, after the record (`create`, `deactivate`): an id is listed
or active only once its record exists, and readers drop an entry whose record is gone
(`page`) or, from `BATCHES_ACTIVE`, final (`BatchLeases`).

The routes (`inferq.api.routes.batches`) create, read and cancel records; the batch leases
(`inferq.api.batches.leases`) and runs (`inferq.api.batches.run`) take leases, record
results and end batches.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from inferq.api.batches.files import index_ids, index_rank
from inferq.api.batches.pending import Pending
from inferq.shared import keys, lua
from inferq.shared.errors import JobConflict, JobNotFound
from inferq.shared.lua import batches as scripts
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.schema import BATCH_FINAL, BatchField, BatchStatus

WINDOWS = {"24h": 86_400}  # completion_window → seconds; OpenAI offers only 24h
RESULTS_GRACE_S = 300  # line results kept after the files are written (see BATCH_END)
#: The record fields a status change stamps (`<status>_at`), as OpenAI's batch object has.
TIMESTAMPS = tuple(st.timestamp for st in BatchStatus if st is not BatchStatus.VALIDATING)


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
        return self.fields[BatchField.ID]

    @property
    def tenant(self) -> str:
        return self.fields.get(BatchField.TENANT, "")

    @property
    def status(self) -> str:
        return self.fields[BatchField.STATUS]

    @property
    def endpoint(self) -> str:
        return self.fields[BatchField.ENDPOINT]

    @property
    def input_file_id(self) -> str:
        return self.fields[BatchField.INPUT_FILE_ID]

    @property
    def expires_at(self) -> int:
        return int(self.fields[BatchField.EXPIRES_AT])

    @property
    def final(self) -> bool:
        return self.status in BATCH_FINAL

    def _int(self, name: str) -> int | None:
        v = self.fields.get(name)
        return int(v) if v else None

    def view(self) -> dict[str, Any]:
        """OpenAI's batch object."""
        f = self.fields
        errors = f.get(BatchField.ERRORS)
        metadata = f.get(BatchField.METADATA)
        body: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": orjson.loads(errors) if errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": f[BatchField.COMPLETION_WINDOW],
            "status": self.status,
            "output_file_id": f.get(BatchField.OUTPUT_FILE_ID) or None,
            "error_file_id": f.get(BatchField.ERROR_FILE_ID) or None,
            "created_at": int(f[BatchField.CREATED_AT]),
            "expires_at": self.expires_at,
        }
        body |= {t: self._int(t) for t in TIMESTAMPS}
        body["request_counts"] = {
            "total": int(f.get(BatchField.TOTAL, 0)),
            "completed": int(f.get(BatchField.COMPLETED, 0)),
            "failed": int(f.get(BatchField.FAILED, 0)),
        }
        body["metadata"] = orjson.loads(metadata) if metadata else None
        return body


class BatchStore:
    """Batch records, their line results and their leases. Redis failures leave every
    method as QueueUnavailable."""

    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._advance = redis.register_script(lua.source(scripts.ADVANCE))
        self._record = redis.register_script(lua.source(scripts.RECORD))
        self._end = redis.register_script(lua.source(scripts.BATCH_END))
        self._renew = redis.register_script(lua.source(scripts.RENEW))
        self._release = redis.register_script(lua.source(scripts.RELEASE))
        self._keep = redis.register_script(lua.source(scripts.KEEP))
        self._creating = Pending()  # this process's creations under way

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
        batch_id: str = "",
    ) -> BatchRecord:
        now = time.time()
        created = int(now)
        fields = {
            BatchField.ID: batch_id or new_batch_id(),
            BatchField.TENANT: tenant,
            BatchField.STATUS: BatchStatus.VALIDATING,
            BatchField.ENDPOINT: endpoint,
            BatchField.INPUT_FILE_ID: input_file_id,
            BatchField.COMPLETION_WINDOW: window,
            BatchField.CREATED_AT: str(created),
            BatchField.EXPIRES_AT: str(created + WINDOWS[window]),
            BatchField.TOTAL: str(total),
            BatchField.COMPLETED: "0",
            BatchField.FAILED: "0",
            BatchField.METADATA: orjson.dumps(metadata).decode() if metadata else "",
        }
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
        return BatchRecord({as_str(k): as_str(v) for k, v in raw.items()}) if raw else None

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
        recs = [BatchRecord({as_str(k): as_str(v) for k, v in raw.items()}) for raw in raws if raw]
        return recs[:limit], len(ids) > limit

    @unavailable
    async def advance(self, batch_id: str, to: str, *sources: str) -> str:
        """Move to `to` (stamping `<to>_at`) if the status is one of `sources`; the status after."""
        now = str(int(time.time()))
        args = [to, BatchStatus(to).timestamp, now, *sources]
        return as_str(await self._advance(keys=[keys.batch(batch_id)], args=args))

    async def cancel(self, batch_id: str, tenant: str) -> BatchRecord:
        rec = await self.get(batch_id, tenant)
        status = await self.advance(
            batch_id, BatchStatus.CANCELLING, BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS
        )
        if status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            raise JobConflict(f"batch {batch_id!r} is {status}: there is nothing left to cancel")
        return await self.get(batch_id, rec.tenant)

    # --- the runner's side ---
    @unavailable
    async def active(self) -> list[str]:
        return sorted(as_str(b) for b in await self.redis.smembers(keys.BATCHES_ACTIVE))

    @unavailable
    async def active_with_tenants(self) -> list[tuple[str, str]]:
        """(id, tenant) of every batch in `BATCHES_ACTIVE` whose record is there and not
        final (one record read each, pipelined: another slot each on a cluster)."""
        ids = await self.active()
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as p:
            for b in ids:
                p.hmget(keys.batch(b), [BatchField.TENANT, BatchField.STATUS])
            rows = await p.execute()
        return [
            (b, as_str(tenant or b""))
            for b, (tenant, status) in zip(ids, rows, strict=True)
            if status is not None and as_str(status) not in BATCH_FINAL
        ]

    async def running(self, tenant: str) -> int:
        """Batches of `tenant` not final yet (what `INFERQ_TENANT_MAX_BATCHES` caps)."""
        return len(await self._running_ids(tenant))

    async def running_with_creating(self, tenant: str) -> int:
        """`running` plus this process's creations of the tenant that it did not see
        (`inferq.api.batches.pending`): what a new batch's quota check counts."""
        count, _ = await self._creating.count(tenant, lambda: self._running_ids(tenant))
        return count

    def creating(self, tenant: str, batch_id: str) -> contextlib.AbstractContextManager[None]:
        """Count the batch `batch_id` in `running_with_creating` until it is created (or its
        creation fails); entered with no await after the quota check."""
        return self._creating.adding(tenant, batch_id)

    async def _running_ids(self, tenant: str) -> dict[str, int]:
        return {b: 1 for b, t in await self.active_with_tenants() if t == tenant}

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
        return as_str(await self.redis.get(key) or b"") == owner

    @unavailable
    async def unleased(self, batch_ids: Sequence[str]) -> set[str]:
        """Those of `batch_ids` no process holds a lease on (pipelined: a slot each)."""
        if not batch_ids:
            return set()
        async with self.redis.pipeline(transaction=False) as p:
            for b in batch_ids:
                p.exists(keys.batch_lease(b))
            held = await p.execute()
        return {b for b, n in zip(batch_ids, held, strict=True) if not n}

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
        now = str(int(time.time()))
        stamp = BatchStatus(status).timestamp
        args = [status, stamp, now, output_file_id, error_file_id, body, RESULTS_GRACE_S]
        script_keys = [keys.batch(batch_id), keys.batch_results(batch_id)]
        return bool(await self._end(keys=script_keys, args=args))
