"""What the queue looks like from outside: depth, admission counts, a job's position, lane
ages, consumers. Reads only; a model's numbers add up its shards (`JobQueue.shards`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.shared import keys
from inferq.shared.jobs import Job
from inferq.shared.redis_conn import unavailable


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry_ms(entry_id: bytes | str) -> int:
    """Milliseconds part of a stream entry id `<ms>-<seq>`."""
    return int(_s(entry_id).split("-", 1)[0])


class QueueReads:
    redis: Redis
    shards: int

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
                    name = _s(c["name"])
                    out[name] = out.get(name, 0) + int(c.get("pending", 0))
            except ResponseError:
                continue
        return out
