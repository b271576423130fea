"""Whether Redis has room for new work: its memory against the high-water mark.

Redis runs with `maxmemory` and `noeviction` (it refuses writes when full rather than drop
a job); the API refuses new work a little before that, at `INFERQ_REDIS_MEMORY_HIGH_WATER`
of maxmemory, with 503 + Retry-After, so that what was accepted can still be finished,
published and acknowledged. `INFO memory` is read at most every `TTL_S` per process; in
between, the bytes this process has written since (`wrote`) are added to the last reading,
so a burst that would fill Redis between two readings makes the next check read again
instead of running past the mark on a stale figure. A Redis without maxmemory is never full
here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.shared.errors import RedisFull
from inferq.shared.metrics import ApiMetrics
from inferq.shared.redis_conn import unavailable

log = logging.getLogger("inferq.api")

TTL_S = 1.0  # INFO memory at most this often per process, while far from the mark
NEAR_TTL_S = 0.1  # and this often once within NEAR of it: a burst cannot run past it for long
NEAR = 0.8  # of the high-water mark
RETRY_AFTER_S = 5  # what a refused client is told: the workers drain in the meantime
# Redis holds a queued job in ~1.2x its inputs' bytes (record, stream entry, counters;
# measured: 235 KB for 200 KB of inputs); counting 1.5x errs towards reading early.
WRITE_WEIGHT = 1.5


def memory_reading(info: Mapping[str, Any]) -> tuple[float, int]:
    """(used_memory / maxmemory, maxmemory) of one INFO memory reply, or of the fullest node
    of a cluster's (a reply per node, each with its own maxmemory); (0, 0) without one."""
    if "used_memory" not in info:  # a cluster client: {node: reply}
        nodes = [memory_reading(v) for v in info.values() if isinstance(v, Mapping)]
        return max(nodes, default=(0.0, 0))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    return (int(info["used_memory"]) / maxmemory, maxmemory) if maxmemory > 0 else (0.0, 0)


class RedisMemory:
    def __init__(
        self,
        redis: Redis,
        high_water: float,
        metrics: ApiMetrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.high_water = high_water
        self.metrics = metrics
        self.clock = clock
        self.ratio = 0.0  # the last reading
        self.maxmemory = 0  # of the fullest node at the last reading; 0: unbounded
        self.written = 0  # bytes this process has written since the last reading
        self._read_at = float("-inf")

    @property
    def estimate(self) -> float:
        """The last reading plus what this process has written since (a cluster's writes
        spread over its nodes: counting them all against the fullest one errs safe)."""
        extra = self.written / self.maxmemory if self.maxmemory else 0.0
        return self.ratio + extra

    def wrote(self, nbytes: int) -> None:
        """Count bytes this process has just written (an accepted job's inputs, a file)."""
        self.written += int(nbytes * WRITE_WEIGHT)

    @unavailable
    async def _read(self) -> tuple[float, int]:
        try:
            info = await self.redis.info("memory")
            if self._read_at == float("-inf"):  # the first reading: say what it cannot guard
                self._warn_unbounded(info)
            return memory_reading(info)
        except ResponseError as e:  # INFO denied (a managed Redis's ACL) or not served
            log.warning("cannot read Redis memory (%s): the high-water mark is off", e)
            self.high_water = float("inf")
            return 0.0, 0

    @staticmethod
    def _warn_unbounded(info: Mapping[str, Any]) -> None:
        if "used_memory" not in info:
            return  # a cluster: one reply per node; each node's own config is its operator's
        policy = info.get("maxmemory_policy", "")
        if not int(info.get("maxmemory", 0) or 0):
            log.warning(
                "Redis has no maxmemory: it grows until the kernel kills it, and the "
                "API's 503 before a full Redis never comes (set maxmemory + noeviction)"
            )
        elif policy != "noeviction":
            log.warning(
                "Redis evicts keys (maxmemory-policy %s): a job record or stream entry "
                "can vanish under memory pressure; use noeviction",
                policy,
            )

    async def check(self) -> None:
        """Raise `RedisFull` (503) while Redis is past the high-water mark."""
        if self.high_water == float("inf"):
            return
        now = self.clock()
        estimate = self.estimate
        ttl_s = NEAR_TTL_S if estimate >= NEAR * self.high_water else TTL_S
        # Past the mark by the estimate alone: read now rather than refuse on a guess (the
        # workers may have drained meanwhile) or accept on a stale reading.
        if now - self._read_at >= ttl_s or (estimate >= self.high_water > self.ratio):
            self.ratio, self.maxmemory = await self._read()
            self.written = 0
            self._read_at = now
            if self.metrics is not None:
                self.metrics.redis_memory_ratio.set(self.ratio)
        if self.ratio >= self.high_water:
            raise RedisFull(
                "Redis memory is past INFERQ_REDIS_MEMORY_HIGH_WATER: new work is refused "
                "until the queue drains",
                RETRY_AFTER_S,
            )
