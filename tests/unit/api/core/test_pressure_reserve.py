"""`RedisMemory.admit`: bytes are reserved with the decision, so concurrent requests are each
judged against those admitted before them; a Redis OOM inside answers as the guard's 503 and
shows at /readyz. A scripted INFO and a fake clock, no Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from inferq.api.core.pressure import IN_FLIGHT_WEIGHT, REFUSAL_READY_S, RedisMemory
from inferq.shared.errors import QueueUnavailable, RedisFull

MB = 2**20


class SlowInfo:
    """INFO memory answering `used` of `maxmemory` after a yield (as a socket would)."""

    def __init__(self, used: int, maxmemory: int) -> None:
        self.used = used
        self.maxmemory = maxmemory
        self.reads = 0

    async def info(self, section: str) -> dict[str, Any]:
        self.reads += 1
        await asyncio.sleep(0)
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


def guard(redis: SlowInfo, clock: Clock, high_water: float = 0.9) -> RedisMemory:
    return RedisMemory(redis, high_water, clock=clock)  # type: ignore[arg-type]


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
    redis, clock = SlowInfo(used=2 * MB, maxmemory=128 * MB), Clock()
    memory = guard(redis, clock)
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
    redis, clock = SlowInfo(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock)
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
    redis, clock = SlowInfo(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock)
    async with memory.admit(0) as held:
        await held.grow(10 * MB)
        assert memory.reserved == int(10 * MB * IN_FLIGHT_WEIGHT)
        with pytest.raises(RedisFull):
            await held.grow(60 * MB)  # 25 + 150 MB of 100: past 0.9
        assert memory.reserved == int(10 * MB * IN_FLIGHT_WEIGHT)
    assert memory.reserved == 0


async def test_redis_oom_answers_as_the_guard_and_shows_at_readyz() -> None:
    redis, clock = SlowInfo(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock)
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
    redis, clock = SlowInfo(used=0, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock)
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
    redis, clock = SlowInfo(used=95 * MB, maxmemory=100 * MB), Clock()
    memory = guard(redis, clock)
    assert "HIGH_WATER" in (await memory.refusing() or "")
    redis.used = 10 * MB  # the workers drained it
    clock.now += 1.0
    assert await memory.refusing() is None
