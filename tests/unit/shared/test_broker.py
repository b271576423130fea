"""The broker layer's single definitions: the Redis-error boundary, backoff."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError

from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_conn import unavailable
from inferq.shared.retry import Backoff


async def test_redis_failures_leave_the_broker_as_queue_unavailable() -> None:
    @unavailable
    async def down() -> None:
        raise RedisConnectionError("connection refused")

    @unavailable
    async def replica() -> None:
        raise ReadOnlyError("READONLY You can't write against a read only replica.")

    @unavailable
    async def script_bug() -> None:
        raise ResponseError("ERR user_script:1: oops")

    for fn in (down, replica):
        with pytest.raises(QueueUnavailable) as info:
            await fn()
        assert isinstance(info.value.__cause__, RedisConnectionError | ReadOnlyError)
    with pytest.raises(ResponseError):  # a bug is not an outage
        await script_bug()


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(base_s=0.1, cap_s=1.0)
    assert [round(b.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.1
