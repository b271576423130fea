"""The worker's side of the queue: read entries (its consumer group), claim their jobs, count
device starts and progress before a batch, take over a dead worker's entries, hand jobs back
on a clean stop, and end jobs with their outcomes.

Order on the worker is result → notify → XACK (`finish`: one script does all three): a woken
waiter finds the result written, and a crash part way leaves the entry pending, to be run
again (FINISH never overwrites a final record), never acknowledged without a result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.shared import keys, lua
from inferq.shared.jobs import decode_job, pack_field
from inferq.shared.lua import queue as scripts
from inferq.shared.queue import Claimed, Entry, Final, QueueClient, shard_of
from inferq.shared.redis_conn import Multiplexed, as_str, register, unavailable
from inferq.shared.schema import ENTRY_JOB

_ENTRY_JOB = ENTRY_JOB.encode()


class JobConsumer(QueueClient):
    """What a worker process does with the queue."""

    def __init__(
        self, redis: Redis, *, result_ttl_s: int, shards: int = 1, keep_inputs: bool = False
    ) -> None:
        super().__init__(redis, result_ttl_s=result_ttl_s, shards=shards, keep_inputs=keep_inputs)
        self._claim = register(redis, lua.source(scripts.CLAIM))
        self._start = register(redis, lua.source(scripts.START))
        self._hand_back = register(redis, lua.source(scripts.HAND_BACK))
        reads = getattr(redis, "reads", None)  # `redis_conn.MuxRedis`: a worker's own
        self._reads = reads if isinstance(reads, Multiplexed) else None

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
        block = None if pending else block_ms
        try:
            if self._reads is not None:  # redis-py's call costs the worker more than the read
                blocking = () if block is None else ("BLOCK", block)
                options = ("GROUP", keys.GROUP, consumer, "COUNT", count, *blocking, "STREAMS")
                reply = await self._reads.call("XREADGROUP", *options, *streams, *streams.values())
                return self._raw_entries(reply)
            reply = await self.redis.xreadgroup(
                keys.GROUP, consumer, streams, count=count, block=block
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
    def _raw_entries(reply: list[list[Any]] | None) -> list[Entry]:
        """XREADGROUP's reply as hiredis parses it: per stream, [id, [field, value, ...]]
        per entry (None for a deleted entry still in the PEL), or None if nothing came."""
        entries: list[Entry] = []
        for stream, items in reply or ():
            name = stream.decode()
            for entry_id, flat in items:
                fields = dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}
                entries.append(Entry(name, entry_id.decode(), fields.get(_ENTRY_JOB, b"").decode()))
        return entries

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
