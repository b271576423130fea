"""`RedisMemory`: the high-water guard reads `INFO memory` rarely, yet a burst written between
two readings cannot run past the mark on a stale figure; bytes are reserved with the decision
(`admit`), so concurrent requests are each judged against those admitted before them; a
Redis OOM answers as the guard's 503 and shows at /readyz. A fake clock and a scripted INFO."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from inferq.api.core.admission import (
    IN_FLIGHT_WEIGHT,
    MEMORY_TTL_S,
    NEAR_TTL_S,
    REFUSAL_READY_S,
    RedisMemory,
    memory_reading,
)
from inferq.shared.errors import QueueUnavailable, RedisFull

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
        await asyncio.sleep(0)  # as a socket would: concurrent requests interleave here
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
    clock.now += MEMORY_TTL_S
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
    clock.now += MEMORY_TTL_S
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


def oom() -> QueueUnavailable:
    """What the broker raises for a write Redis refused at maxmemory (`unavailable`)."""
    try:
        try:
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        except OutOfMemoryError as e:
            raise QueueUnavailable(f"redis unavailable: {e}") from e
    except QueueUnavailable as q:
        return q


async def test_concurrent_requests_cannot_all_pass_one_reading() -> None:
    """30 requests of 4.9 MB at once against 128 MiB: those admitted fit under the mark
    together (with IN_FLIGHT_WEIGHT), the rest are refused with RedisFull, and one INFO reading
    serves them all."""
    redis, clock = Info(used=2 * MB, maxmemory=128 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    size = int(4.9 * 10**6)
    landed = 0

    async def submit() -> str:
        nonlocal landed
        try:
            async with memory.admit(size) as held:
                await asyncio.sleep(0.01)  # the write
                landed += size
                held.landed()
                return "accepted"
        except RedisFull:
            return "refused"

    outcomes = await asyncio.gather(*(submit() for _ in range(30)))
    accepted = outcomes.count("accepted")
    assert 0 < accepted < 30 and redis.reads == 1
    assert redis.used + landed * IN_FLIGHT_WEIGHT <= 0.9 * redis.maxmemory
    assert memory.reserved == 0  # every reservation landed or was released


async def test_a_refused_or_failed_write_gives_its_bytes_back() -> None:
    redis, clock = Info(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    with pytest.raises(ValueError):
        async with memory.admit(20 * MB):
            raise ValueError("the write failed")
    assert memory.reserved == 0 and memory.written == 0
    async with memory.admit(20 * MB):
        pass  # nothing written (an Idempotency-Key repeat): released, not counted
    assert memory.reserved == 0 and memory.written == 0
    async with memory.admit(20 * MB) as held:
        held.landed()
    assert memory.written == int(20 * MB * IN_FLIGHT_WEIGHT)


async def test_an_upload_grows_its_reservation_once_its_size_is_known() -> None:
    redis, clock = Info(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    async with memory.admit(0) as held:
        await held.grow(10 * MB)
        assert memory.reserved == int(10 * MB * IN_FLIGHT_WEIGHT)
        with pytest.raises(RedisFull):
            await held.grow(60 * MB)  # 25 + 150 MB of 100: past 0.9
        assert memory.reserved == int(10 * MB * IN_FLIGHT_WEIGHT)
    assert memory.reserved == 0


async def test_redis_oom_answers_as_the_guard_and_shows_at_readyz() -> None:
    redis, clock = Info(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    assert await memory.refusing() is None
    with pytest.raises(RedisFull) as caught:
        async with memory.admit(MB):
            raise oom()
    assert caught.value.retry_after_s > 0 and "out of memory" in str(caught.value)
    assert isinstance(caught.value.__cause__, QueueUnavailable)
    assert memory.reserved == 0
    why = await memory.refusing()
    assert why is not None and "out of memory" in why
    clock.now += REFUSAL_READY_S
    assert await memory.refusing() is None


async def test_other_failures_pass_through_and_only_refusals_are_remembered() -> None:
    redis, clock = Info(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    with pytest.raises(QueueUnavailable) as caught:
        async with memory.admit(MB):
            raise QueueUnavailable("redis unavailable: Timeout reading from socket")
    assert not isinstance(caught.value, RedisFull)
    assert await memory.refusing() is None  # a timeout is not a refusal
    misconf = ResponseError("MISCONF Redis is configured to save RDB snapshots")
    with pytest.raises(QueueUnavailable):
        async with memory.admit(MB):
            raise QueueUnavailable(f"redis unavailable: {misconf}") from misconf
    assert "RDB" in (await memory.refusing() or "")


async def test_readyz_reason_while_past_the_mark() -> None:
    redis, clock = Info(used=95 * MB, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock, 0.9)
    assert "HIGH_WATER" in (await memory.refusing() or "")
    redis.used = 10 * MB  # the workers drained it
    clock.now += 1.0
    assert await memory.refusing() is None
