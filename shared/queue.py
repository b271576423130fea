"""The queue client: how jobs enter Redis, get claimed, and become final.

Writes that matter are the Lua scripts of `inferq.shared.lua.queue` (atomic, retry-safe);
what the calls take and give (`Entry`, `Final`, `Claimed`, `Submitted`) is `queue_types`.
Order on the worker is result → notify → XACK (reliability guide #7). Every public method
turns a Redis failure into `QueueUnavailable` (`inferq.shared.redis_conn.unavailable`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from inferq.shared import keys, lua
from inferq.shared.jobs import Job, decode_job, encode_submit, input_bytes, now_ms, pack_field
from inferq.shared.lua import queue as scripts
from inferq.shared.queue_types import Claimed as Claimed
from inferq.shared.queue_types import Entry as Entry
from inferq.shared.queue_types import Final as Final
from inferq.shared.queue_types import Submitted as Submitted
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.replicas import call_and_wait
from inferq.shared.schema import ENTRY_JOB, JobField

_ENTRY_JOB = ENTRY_JOB.encode()
# FINISH's first KEYS, in its order: one shard's counters, dead letters, webhooks and cache.
# Per job, after its record: its tenant's counters (FINISH frees what SUBMIT counted).
_TENANT_KEYS = (keys.tenant_items, keys.tenant_bytes, keys.tenant_webhooks)
_FINISH_SHARD_KEYS = (
    keys.queued_items,
    keys.queued_bytes,
    keys.dead,
    keys.webhooks,
    keys.cache_index,
    keys.cache_sizes,
    keys.cache_bytes,
)


def shard_of(job_id: str) -> int:
    """The queue shard a job id was made for (0 for an id without one)."""
    where = keys.job_shard(job_id)
    return where[1] if where else 0


def per_shard(total: int, shards: int) -> int:
    """One shard's share of a queue-wide bound (admission caps are kept per shard: a script
    sees one slot's counters only)."""
    return -(-total // shards)


def _entry_ms(entry_id: bytes | str) -> int:
    """Milliseconds part of a stream entry id `<ms>-<seq>`."""
    return int(as_str(entry_id).split("-", 1)[0])


class JobQueue:
    """Thin async wrapper over one Redis client; both the API and the worker use it.

    `shards`: how many streams each model's queue is spread over (`INFERQ_STREAM_SHARDS`).
    Scripts run per shard (their keys share the shard's hash tag); reads that describe a
    model (depth, position, lanes) add up its shards.
    """

    def __init__(
        self, redis: Redis, *, result_ttl_s: int, shards: int = 1, keep_inputs: bool = False
    ) -> None:
        self.redis = redis
        self.result_ttl_s = result_ttl_s
        self.shards = shards
        self.keep_inputs = keep_inputs  # off: a final record drops its inputs (FINISH)
        # A cluster client refuses scripts inside a pipeline: calls go out side by side.
        self.cluster = isinstance(redis, RedisCluster)
        self._submit = redis.register_script(lua.source(scripts.SUBMIT))
        self._claim = redis.register_script(lua.source(scripts.CLAIM))
        self._finish = redis.register_script(lua.source(scripts.FINISH))
        self._hand_back = redis.register_script(lua.source(scripts.HAND_BACK))
        self._start = redis.register_script(lua.source(scripts.START))
        self._request_cancel = redis.register_script(lua.source(scripts.REQUEST_CANCEL))
        self._cached = redis.register_script(lua.source(scripts.CACHED))

    # --- API side ---
    @unavailable
    async def submit(
        self,
        job: Job,
        *,
        max_queue: int = 2**62,
        max_bytes: int = 2**62,
        idempotency_key: str | None = None,
        idempotency_ttl_s: int = 86_400,
        fingerprint: str = "",  # hex digest of the key's request: a repeat must match it
        wait: tuple[int, int] = (0, 0),  # (replicas, timeout ms) to WAIT for: shared/replicas
        tenant_caps: tuple[int, int] = (0, 0),  # (items, bytes) the tenant may hold; 0: uncounted
    ) -> Submitted:
        """Admit, record and enqueue atomically (retry-safe: keyed by job id / idempotency key).
        `depth` of a refusal: what its cap counts (the shard's, or the tenant's on it)."""
        size = sum(input_bytes(v) for v in job.inputs)
        argv: list[bytes | str | int] = [job.id, len(job.inputs), max_queue]
        argv += [idempotency_ttl_s, size, max_bytes, *tenant_caps, fingerprint]
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
        ]
        if idempotency_key is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency_key, job.model, shard, self.shards)
            )
        renew = (script_keys[-1], idempotency_ttl_s) if idempotency_key is not None else None
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
        idempotency_key: str | None = None,
        idempotency_ttl_s: int = 86_400,
        fingerprint: str = "",
    ) -> Submitted:
        """Record a job that is final at birth (answered from the result cache): never queued,
        never counted against admission; idempotency and webhooks as for any job."""
        argv: list[bytes | str | int] = [job.id, self.result_ttl_s, idempotency_ttl_s, fingerprint]
        for k, v in fields.items():
            if k != JobField.INPUTS or self.keep_inputs:
                argv += [k, v]
        shard = shard_of(job.id)
        script_keys = [
            keys.job(job.id),
            keys.webhooks(job.model, shard, self.shards),
            keys.tenant_webhooks(job.model, shard, self.shards, job.tenant),
        ]
        if idempotency_key is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency_key, job.model, shard, self.shards)
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

    def _finish_args(
        self, model: str, shard: int, finals: Sequence[Final], only_if_queued: bool = False
    ) -> tuple[list[str], list[bytes | str | int]]:
        by_stream: dict[str, list[str]] = {}
        for f in finals:
            if f.stream:  # outcomes written from outside a worker have no entry to ack
                by_stream.setdefault(f.stream, []).append(f.entry_id)
        script_keys = [k(model, shard, self.shards) for k in _FINISH_SHARD_KEYS] + list(by_stream)
        argv: list[bytes | str | int] = [self.result_ttl_s, "1" if only_if_queued else "0"]
        argv += [now_ms(), keys.GROUP, "1" if self.keep_inputs else "0", len(by_stream)]
        for ids in by_stream.values():
            argv += [len(ids), *ids]
        for f in finals:
            script_keys.append(keys.job(f.job_id))
            script_keys += [k(model, shard, self.shards, f.tenant) for k in _TENANT_KEYS]
            argv += [keys.done_channel(f.job_id), "1" if f.dead_letter else "0", 2 * len(f.fields)]
            for k, v in f.fields.items():
                argv += [k, v]
        return script_keys, argv

    # --- worker side ---
    @unavailable
    async def ensure_group(self, model: str) -> None:
        """Create streams and group if missing; BUSYGROUP means another worker did."""
        for s in self.streams(model):
            try:
                await self.redis.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    @unavailable
    async def read(
        self,
        model: str,
        consumer: str,
        *,
        count: int,
        block_ms: int | None,
        pending: bool = False,
        lanes: Sequence[str] = keys.LANES,
        shards: Sequence[int] = (0,),
    ) -> list[Entry]:
        """XREADGROUP over `lanes` of `shards` in order: new entries ('>'), or our own unacked
        ('0'). On a cluster, one shard per call (a read's streams must share a slot)."""
        streams: dict[bytes | str | memoryview, int | bytes | str | memoryview] = {
            keys.stream(model, lane, shard, self.shards): "0" if pending else ">"
            for shard in shards
            for lane in lanes
        }
        try:
            reply = await self.redis.xreadgroup(
                keys.GROUP, consumer, streams, count=count, block=None if pending else block_ms
            )
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # The stream or group vanished (flushed, evicted): recreate it. Nothing was read,
            # and the caller's next read blocks again, so this never becomes a hot loop.
            await self.ensure_group(model)
            return []
        return self._entries(reply)

    @staticmethod
    def _entries(reply: object) -> list[Entry]:
        entries: list[Entry] = []
        if isinstance(reply, dict):  # RESP3 shape
            reply = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
        for stream, items in reply or []:  # type: ignore[attr-defined]
            for entry_id, fields in items:
                job_id = (fields or {}).get(_ENTRY_JOB)
                # A deleted entry still in the PEL reads back with no fields.
                entries.append(
                    Entry(as_str(stream), as_str(entry_id), job_id.decode() if job_id else "")
                )
        return entries

    async def _per_shard(
        self, job_ids: Sequence[str], call: Callable[[list[int]], Awaitable[list[Any]]]
    ) -> list[Any]:
        """`call(indexes)` once per shard among `job_ids` (one slot per script call on a
        cluster), side by side; the replies in `job_ids`' order."""
        groups: dict[int, list[int]] = {}
        for i, j in enumerate(job_ids):
            groups.setdefault(shard_of(j) if self.cluster else 0, []).append(i)
        if len(groups) == 1:
            return await call(next(iter(groups.values())))
        out: list[Any] = [None] * len(job_ids)
        parts = await asyncio.gather(*(call(ix) for ix in groups.values()))
        for ix, replies in zip(groups.values(), parts, strict=True):
            for i, r in zip(ix, replies, strict=True):
                out[i] = r
        return out

    @unavailable
    async def claim(
        self, job_ids: Sequence[str], now_ms: int, *, start_limit: int = 0
    ) -> list[Claimed | None]:
        """Mark queued jobs running and read them (None: record gone). `start_limit` > 0: they
        run at once, so a one-item job's device start is counted too (scripts.CLAIM)."""
        if not job_ids:
            return []
        args = [pack_field(now_ms), "1" if start_limit > 0 else "0", start_limit]

        async def call(ix: list[int]) -> list[Any]:
            return await self._claim(keys=[keys.job(job_ids[i]) for i in ix], args=args)  # type: ignore[no-any-return]

        return [
            Claimed(decode_job(dict(zip(r[0][::2], r[0][1::2], strict=True))), bool(r[1]))
            if r
            else None
            for r in await self._per_shard(job_ids, call)
        ]

    @unavailable
    async def start(
        self, job_ids: Sequence[str], first: Sequence[bool], done: Sequence[int]
    ) -> list[tuple[bytes, bool]]:
        """Before a batch runs: count first device starts and write each job's progress
        (`done`: its inputs with an output); per job, its raw status and whether a cancel was
        asked while it ran (scripts.START)."""
        if not job_ids:
            return []

        async def call(ix: list[int]) -> list[Any]:
            args = [a for i in ix for a in ("1" if first[i] else "0", done[i])]
            return await self._start(keys=[keys.job(job_ids[i]) for i in ix], args=args)  # type: ignore[no-any-return]

        return [(raw, bool(cancel)) for raw, cancel in await self._per_shard(job_ids, call)]

    @unavailable
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
        for s in self.streams(model):
            ids: list[bytes | str | int | memoryview] = []
            for name in dead:
                pending = await self.redis.xpending_range(
                    s, keys.GROUP, "-", "+", 1000, consumername=name
                )
                ids += [p["message_id"] for p in pending]
            if ids:
                claimed = await self.redis.xclaim(s, keys.GROUP, consumer, dead_idle_ms, ids)
                taken += self._entries([(s, claimed)])
            cursor = "0-0"
            for _ in range(10):  # bounded per pass; the next pass continues
                reply = await self.redis.xautoclaim(
                    s, keys.GROUP, consumer, stuck_idle_ms, start_id=cursor, count=100
                )
                cursor, claimed = as_str(reply[0]), reply[1]
                taken += self._entries([(s, claimed)])
                # reply[2] lists ids deleted while pending: XAUTOCLAIM already dropped them.
                if cursor == "0-0":
                    break
        return taken

    @unavailable
    async def ack(self, entries: Sequence[Entry]) -> None:
        if entries:
            async with self.redis.pipeline(transaction=False) as p:
                for e in entries:
                    p.xack(e.stream, keys.GROUP, e.entry_id)
                    p.xdel(e.stream, e.entry_id)
                await p.execute()

    @unavailable
    async def hand_back(self, entries: Sequence[Entry], uncount: Sequence[bool] = ()) -> None:
        """Re-queue not-final jobs at their lane's tail and ack the old entries. `uncount[i]`:
        job i's device start was counted by this worker, which stops cleanly: take it back,
        so a graceful stop never makes a healthy job look like one that kills workers."""
        flags = list(uncount) or [False] * len(entries)
        calls = [
            (
                [keys.job(e.job_id), e.stream],
                [keys.GROUP, e.entry_id, e.job_id, "1" if flag else "0"],
            )
            for e, flag in zip(entries, flags, strict=True)
        ]
        if self.cluster:
            await asyncio.gather(*(self._hand_back(keys=k, args=a) for k, a in calls))
            return
        async with self.redis.pipeline(transaction=False) as p:
            for k, a in calls:
                await self._hand_back(keys=k, args=a, client=p)
            await p.execute()

    @unavailable
    async def finish(self, finals: Sequence[Final]) -> list[int]:
        """Write every final outcome and ack its entry: one atomic script call per model shard
        (a worker serves one model), so a dead-letter entry, the final state, the completion message
        and the ack land together or not at all."""
        if not finals:
            return []
        by_shard: dict[tuple[str, int], list[Final]] = {}
        for f in finals:
            by_shard.setdefault((f.model, shard_of(f.job_id)), []).append(f)
        outcome: dict[str, int] = {}

        async def call(model: str, shard: int, group: list[Final]) -> None:
            script_keys, argv = self._finish_args(model, shard, group)
            results = await self._finish(keys=script_keys, args=argv)
            outcome.update((f.job_id, int(r)) for f, r in zip(group, results, strict=True))

        await asyncio.gather(*(call(m, sh, g) for (m, sh), g in by_shard.items()))
        return [outcome[f.job_id] for f in finals]

    # --- what the queue looks like from outside (reads only; a model's shards add up) ---
    def streams(self, model: str) -> list[str]:
        """Every stream of `model`: each shard's lanes."""
        return [s for shard in range(self.shards) for s in keys.streams(model, shard, self.shards)]

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

    @unavailable
    async def consumers(self, model: str) -> dict[str, int]:
        """Consumer name → pending count, over all lanes."""
        out: dict[str, int] = {}
        for s in self.streams(model):
            try:
                for c in await self.redis.xinfo_consumers(s, keys.GROUP):
                    name = as_str(c["name"])
                    out[name] = out.get(name, 0) + int(c.get("pending", 0))
            except ResponseError:
                continue
        return out
