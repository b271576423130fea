"""Which Redis failures become QueueUnavailable (503 + Retry-After), and which stay bugs."""

from __future__ import annotations

import pytest
from redis.exceptions import ReadOnlyError, ResponseError

from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_conn import refused_inside_script, unavailable

OOM_62 = (
    "Error running script (call to f_1b2c): @user_script:12: @user_script: 12: "
    "-OOM command not allowed when used memory > 'maxmemory'."
)


def test_a_refusal_inside_a_script_on_redis_6_is_recognised() -> None:
    assert refused_inside_script(ResponseError(OOM_62))
    assert refused_inside_script(ResponseError("Error running script: -READONLY You can't write"))
    assert not refused_inside_script(ResponseError("Error running script: attempt to index nil"))
    assert not refused_inside_script(ResponseError("WRONGTYPE Operation against a key"))


@pytest.mark.parametrize(
    "exc", [ResponseError(OOM_62), ReadOnlyError("READONLY You can't write against a replica")]
)
async def test_refusals_become_queue_unavailable(exc: Exception) -> None:
    @unavailable
    async def call() -> None:
        raise exc

    with pytest.raises(QueueUnavailable):
        await call()


async def test_a_script_bug_stays_a_bug() -> None:
    @unavailable
    async def call() -> None:
        raise ResponseError("Error running script: attempt to compare nil with number")

    with pytest.raises(ResponseError):
        await call()
