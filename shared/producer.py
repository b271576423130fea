"""The API's side of the queue: admit and enqueue a job, record a cached answer, read a job,
end one that never ran, ask a worker to stop one, and the reads that describe a model's queue
(depth, position, lanes, a tenant's holdings) for admission, health and ETAs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis

from inferq.shared import keys, lua
from inferq.shared.jobs import Job, decode_job, encode_submit, input_bytes
from inferq.shared.lua import queue as scripts
from inferq.shared.queue import Final, Idempotency, QueueClient, Submitted, shard_of
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.replicas import call_and_wait
from inferq.shared.schema import JobField

_NO_KEY = Idempotency("")  # a submit without an Idempotency-Key: built once, not per call


def _entry_ms(entry_id: bytes | str) -> int:
    """Milliseconds part of a stream entry id `<ms>-<seq>`."""
    return int(as_str(entry_id).split("-", 1)[0])


class JobProducer(QueueClient):
    """What the API process does with the queue."""

    def __init__(
        self, redis: Redis, *, result_ttl_s: int, shards: int = 1, keep_inputs: bool = False
    ) -> None:
        super().__init__(redis, result_ttl_s=result_ttl_s, shards=shards, keep_inputs=keep_inputs)
        self._submit = redis.register_script(lua.source(scripts.SUBMIT))
        self._request_cancel = redis.register_script(lua.source(scripts.REQUEST_CANCEL))
        self._cached = redis.register_script(lua.source(scripts.CACHED))

    @unavailable
    async def submit(
        self,
        job: Job,
        *,
        max_queue: int = 2**62,
        max_bytes: int = 2**62,
        idempotency: Idempotency | None = None,
        wait: tuple[int, int] = (0, 0),  # (replicas, timeout ms) to WAIT for: shared/replicas
        tenant_caps: tuple[int, int] = (0, 0),  # (items, bytes) the tenant may hold; 0: uncounted
    ) -> Submitted:
        """Admit, record and enqueue atomically (retry-safe: keyed by job id / idempotency key).
        `depth` of a refusal: what its cap counts (the shard's, or the tenant's on it)."""
        size = sum(input_bytes(v) for v in job.inputs)
        argv: list[bytes | str | int] = [job.id, len(job.inputs), max_queue]
        idem = idempotency or _NO_KEY
        argv += [idem.ttl_s, size, max_bytes, *tenant_caps, idem.fingerprint, job.created_ms]
        for k, v in encode_submit(job).items():
            argv += [k, v]
        shard = shard_of(job.id)
        script_keys = [
            keys.job(job.id),
            keys.stream(job.model, job.priority, shard, self.shards),
            keys.queued_items(job.model, shard, self.shards),
            keys.queued_bytes(job.model, shard, self.shards),
            keys.tenant_items(job.model, shard, self.shards, job.tenant),
            keys.tenant_bytes(job.model, shard, self.shards, job.tenant),
            keys.tenant_jobs(job.model, shard, self.shards, job.tenant),
        ]
        if idempotency is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency.key_hash, job.model, shard, self.shards)
            )
        renew = (script_keys[-1], idem.ttl_s) if idempotency is not None else None
        (outcome, value), acked = await call_and_wait(
            self.redis, self._submit, script_keys, argv, wait, renew
        )
        outcome, value = as_str(outcome), as_str(value)
        if outcome == "ok":
            job.entry = value
            return Submitted("created", job.id, value, replicas=acked)
        if outcome == "dup":
            return Submitted("duplicate", value, replicas=acked)
        if outcome == "conflict":  # the key's job was made by another request
            return Submitted("conflict", value, replicas=acked)
        return Submitted(outcome, depth=int(value))  # full, full_bytes, tenant_full, tenant_bytes

    @unavailable
    async def record_cached(
        self,
        job: Job,
        fields: dict[str, bytes],
        *,
        idempotency: Idempotency | None = None,
    ) -> Submitted:
        """Record a job that is final at birth (answered from the result cache): never queued,
        never counted against admission; idempotency and webhooks as for any job."""
        ttl = job.result_ttl_s or self.result_ttl_s
        idem = idempotency or _NO_KEY
        argv: list[bytes | str | int] = [job.id, ttl, idem.ttl_s, idem.fingerprint, job.created_ms]
        for k, v in fields.items():
            if k != JobField.INPUTS or self.keep_inputs:
                argv += [k, v]
        shard = shard_of(job.id)
        script_keys = [
            keys.job(job.id),
            keys.webhooks(job.model, shard, self.shards),
            keys.tenant_webhooks(job.model, shard, self.shards, job.tenant),
            keys.tenant_jobs(job.model, shard, self.shards, job.tenant),
        ]
        if idempotency is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency.key_hash, job.model, shard, self.shards)
            )
        outcome, value = await self._cached(keys=script_keys, args=argv)
        if as_str(outcome) in ("dup", "conflict"):
            return Submitted("duplicate" if as_str(outcome) == "dup" else "conflict", as_str(value))
        return Submitted("created", job.id)

    @unavailable
    async def get(self, job_id: str) -> Job | None:
        raw = await self.redis.hgetall(keys.job(job_id))
        return decode_job(raw) if raw else None

    @unavailable
    async def cancel(self, job: Job, fields: dict[str, bytes], *, only_if_queued: bool) -> int:
        """Finalise a job from outside a worker (cancel/expire); same guard as `finish`."""
        final = Final(job.model, "", "", job.id, fields, tenant=job.tenant)
        script_keys, argv = self._finish_args(job.model, shard_of(job.id), [final], only_if_queued)
        return int((await self._finish(keys=script_keys, args=argv))[0])

    @unavailable
    async def request_cancel(self, job_id: str) -> str:
        """Ask the worker running `job_id` to end it (scripts.REQUEST_CANCEL); its status as
        this call found it ('' if gone): only a `running` job is marked."""
        return as_str(await self._request_cancel(keys=[keys.job(job_id)]))

    # --- what the queue looks like from outside (reads only; a model's shards add up) ---
    @unavailable
    async def queue_depth(self, model: str) -> int:
        """Jobs waiting or running: acked entries are deleted, so stream lengths are it."""
        async with self.redis.pipeline(transaction=False) as p:
            for s in self.streams(model):
                p.xlen(s)
            return sum(int(n) for n in await p.execute())

    async def _sum(self, key: Callable[[str, int, int], str], model: str) -> int:
        async with self.redis.pipeline(transaction=False) as p:
            for shard in range(self.shards):
                p.get(key(model, shard, self.shards))
            return sum(int(n or 0) for n in await p.execute())

    @unavailable
    async def queued_items(self, model: str) -> int:
        return await self._sum(keys.queued_items, model)

    @unavailable
    async def queued_bytes(self, model: str) -> int:
        return await self._sum(keys.queued_bytes, model)

    @unavailable
    async def tenant_held(self, model: str, tenant: str) -> tuple[int, int, int]:
        """(items, input bytes, webhook deliveries) `tenant` holds on `model`'s shards."""
        per_tenant = (keys.tenant_items, keys.tenant_bytes, keys.tenant_webhooks)
        async with self.redis.pipeline(transaction=False) as p:
            for key in per_tenant:
                for shard in range(self.shards):
                    p.get(key(model, shard, self.shards, tenant))
            replies = [int(n or 0) for n in await p.execute()]
        n = self.shards
        return sum(replies[:n]), sum(replies[n : 2 * n]), sum(replies[2 * n :])

    @unavailable
    async def position(self, job: Job, limit: int = 1000) -> int:
        """Entries ahead of `job`: all of higher lanes plus the older ones of its own (capped),
        over every shard (entry ids of other shards compare by their time part)."""
        ahead = 0
        async with self.redis.pipeline(transaction=False) as p:
            for shard in range(self.shards):
                for lane in keys.LANES[: keys.LANES.index(job.priority)]:
                    p.xlen(keys.stream(job.model, lane, shard, self.shards))
                if job.entry:
                    own = keys.stream(job.model, job.priority, shard, self.shards)
                    p.xrange(own, "-", f"({job.entry}", count=limit)
            replies = await p.execute()
        for r in replies:
            ahead += len(r) if isinstance(r, list) else int(r)
        return ahead

    @unavailable
    async def ping(self) -> float:
        """Round trip to Redis, in ms."""
        started = time.perf_counter()
        await self.redis.ping()
        return round((time.perf_counter() - started) * 1000, 3)

    @unavailable
    async def lanes(self, models: Sequence[str]) -> dict[str, tuple[int, int | None]]:
        """Per model, over all lanes: (entries, ms timestamp of the oldest entry or None)."""
        n = len(keys.LANES) * self.shards
        async with self.redis.pipeline(transaction=False) as p:
            for m in models:
                for s in self.streams(m):
                    p.xlen(s)
                    p.xrange(s, "-", "+", count=1)
            replies = await p.execute()
        out: dict[str, tuple[int, int | None]] = {}
        for i, m in enumerate(models):
            mine = replies[2 * n * i : 2 * n * (i + 1)]
            firsts = [_entry_ms(first[0][0]) for first in mine[1::2] if first]
            out[m] = (sum(int(d) for d in mine[::2]), min(firsts) if firsts else None)
        return out
