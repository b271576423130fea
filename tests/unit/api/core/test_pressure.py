"""`RedisMemory`: the high-water guard reads `INFO memory` rarely, yet a burst written between
two readings cannot run past the mark on a stale figure. A fake clock and a scripted INFO."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from inferq.api.core.pressure import NEAR_TTL_S, TTL_S, RedisMemory, memory_reading
from inferq.shared.errors import RedisFull

MB = 2**20


class Info:
    """A Redis whose `INFO memory` answers `used` of `maxmemory`, counting the readings."""

    def __init__(self, used: int, maxmemory: int = 100 * MB) -> None:
        self.used = used
        self.maxmemory = maxmemory
        self.reads = 0
        self.denied = False

    async def info(self, section: str) -> dict[str, Any]:
        assert section == "memory"
        self.reads += 1
        if self.denied:
            raise ResponseError("NOPERM this user has no permissions to run the 'info' command")
        return {
            "used_memory": self.used,
            "maxmemory": self.maxmemory,
            "maxmemory_policy": "noeviction",
        }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard(redis: Info, clock: Clock, high_water: float = 0.5) -> RedisMemory:
    return RedisMemory(redis, high_water, clock=clock)  # type: ignore[arg-type]


async def test_far_from_the_mark_info_is_read_once_a_ttl() -> None:
    redis, clock = Info(used=2 * MB), Clock()
    memory = guard(redis, clock)
    for _ in range(50):
        await memory.check()
    assert redis.reads == 1
    clock.now += TTL_S
    await memory.check()
    assert redis.reads == 2


async def test_near_the_mark_info_is_read_ten_times_as_often() -> None:
    redis, clock = Info(used=45 * MB), Clock()  # 0.45 ≥ 0.8 × 0.5
    memory = guard(redis, clock)
    await memory.check()
    clock.now += NEAR_TTL_S
    await memory.check()
    assert redis.reads == 2


async def test_a_burst_between_two_readings_is_refused_before_redis_fills() -> None:
    """Written bytes count against the last reading: a burst of 1 MB jobs with the clock
    standing still (Redis holding 1.2 MB each, as measured) is refused past the mark and well
    before maxmemory, with a handful of readings, not one per job."""
    redis, clock = Info(used=2 * MB), Clock()
    memory = guard(redis, clock)
    with pytest.raises(RedisFull) as refused:
        for _ in range(100):  # 100 MB: Redis would be full without a fresh reading
            await memory.check()
            memory.wrote(MB)
            redis.used += 6 * MB // 5
    assert 0.5 <= redis.used / redis.maxmemory < 0.6
    assert 2 <= redis.reads <= 6
    assert refused.value.retry_after_s
    assert "INFERQ_REDIS_MEMORY_HIGH_WATER" in str(refused.value)


async def test_an_estimate_past_the_mark_is_checked_not_trusted() -> None:
    """The workers drained while this process wrote: the fresh reading is under the mark, so
    the job is accepted and the count starts again from that reading."""
    redis, clock = Info(used=2 * MB), Clock()
    memory = guard(redis, clock)
    await memory.check()
    memory.wrote(50 * MB)
    await memory.check()  # reads (used still 2 MB): no refusal
    assert redis.reads == 2 and memory.written == 0 and memory.estimate < 0.1


async def test_past_the_mark_it_refuses_until_a_reading_says_otherwise() -> None:
    redis, clock = Info(used=60 * MB), Clock()
    memory = guard(redis, clock)
    with pytest.raises(RedisFull):
        await memory.check()
    with pytest.raises(RedisFull):
        await memory.check()  # the same reading, within its TTL
    redis.used = 10 * MB
    clock.now += NEAR_TTL_S
    await memory.check()


async def test_a_redis_without_maxmemory_is_never_full() -> None:
    redis, clock = Info(used=900 * MB, maxmemory=0), Clock()
    memory = guard(redis, clock)
    await memory.check()
    memory.wrote(10**12)
    await memory.check()
    assert memory.estimate == 0 and redis.reads == 1


async def test_info_denied_turns_the_guard_off() -> None:
    redis, clock = Info(used=99 * MB), Clock()
    redis.denied = True
    memory = guard(redis, clock)
    await memory.check()
    clock.now += TTL_S
    await memory.check()
    assert redis.reads == 1 and memory.high_water == float("inf")


def test_a_cluster_reads_as_its_fullest_node() -> None:
    node = {"maxmemory_policy": "noeviction"}
    info = {
        "a:7000": {**node, "used_memory": 10, "maxmemory": 100},
        "b:7001": {**node, "used_memory": 30, "maxmemory": 50},
        "c:7002": {**node, "used_memory": 5, "maxmemory": 0},
    }
    assert memory_reading(info) == (0.6, 50)
    assert memory_reading({"used_memory": 5, "maxmemory": 0}) == (0.0, 0)
