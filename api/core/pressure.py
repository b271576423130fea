"""Whether Redis has room for new work: its memory against the high-water mark.

Redis runs with `maxmemory` and `noeviction` (it refuses writes when full rather than drop
a job); the API refuses new work a little before that, at `INFERQ_REDIS_MEMORY_HIGH_WATER`
of maxmemory, with 503 + Retry-After, so that what was accepted can still be finished,
published and acknowledged. `INFO memory` is read at most every `ttl_s` per process; a
Redis without maxmemory is never full here.
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


def memory_ratio(info: Mapping[str, Any]) -> float:
    """used_memory / maxmemory of one INFO memory reply, or of the fullest node of a cluster's
    (a reply per node); 0 without a maxmemory."""
    if "used_memory" not in info:  # a cluster client: {node: reply}
        return max((memory_ratio(v) for v in info.values() if isinstance(v, Mapping)), default=0)
    maxmemory = int(info.get("maxmemory", 0) or 0)
    return int(info["used_memory"]) / maxmemory if maxmemory > 0 else 0.0


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
        self.ratio = 0.0
        self._read_at = float("-inf")

    @unavailable
    async def _read(self) -> float:
        try:
            info = await self.redis.info("memory")
            if self._read_at == float("-inf"):  # the first reading: say what it cannot guard
                self._warn_unbounded(info)
            return memory_ratio(info)
        except ResponseError as e:  # INFO denied (a managed Redis's ACL) or not served
            log.warning("cannot read Redis memory (%s): the high-water mark is off", e)
            self.high_water = float("inf")
            return 0.0

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
        ttl_s = NEAR_TTL_S if self.ratio >= NEAR * self.high_water else TTL_S
        if now - self._read_at >= ttl_s:
            self.ratio = await self._read()
            self._read_at = now
            if self.metrics is not None:
                self.metrics.redis_memory_ratio.set(self.ratio)
        if self.ratio >= self.high_water:
            raise RedisFull(
                "Redis memory is past INFERQ_REDIS_MEMORY_HIGH_WATER: new work is refused "
                "until the queue drains",
                RETRY_AFTER_S,
            )
