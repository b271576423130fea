"""Redis refusals are recognised wherever they arise: a single command, a pipeline, a
MULTI/EXEC, a script, a script inside a pipeline. The strings are the ones redis-py 8 raised
against redis-server 7.0 (min-replicas-to-write 1; a failed BGSAVE with save points set)."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_conn import is_refusal, server_reply, unavailable

NOREPLICAS = "NOREPLICAS Not enough good replicas to write."
MISCONF = (
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
    "to disk. Commands that may modify the data set are disabled, because this instance is "
    "configured to report errors during writes if RDB snapshotting fails "
    "(stop-writes-on-bgsave-error option). Please check the Redis logs for details about the "
    "RDB error."
)
SCRIPT = " script: 219bb33e7c6773035c720850383aa2ebb63d9904, on @user_script:1."
EVAL = "EVAL return redis.call('SET', KEYS[1], 'v') 1 k"

REFUSED = [
    NOREPLICAS,
    f"Command # 2 (SET k 1) of pipeline caused error: {NOREPLICAS}",
    f"Command # 1 (DEL inferq:worker:vm:cpu:echo) of pipeline caused error: {NOREPLICAS}",
    NOREPLICAS + SCRIPT,
    f"Command # 1 ({EVAL}) of pipeline caused error: {NOREPLICAS}{SCRIPT}",
    MISCONF,
    f"Command # 2 (SET k 1) of pipeline caused error: {MISCONF}",
    f"Command # 1 (SET k 1) of pipeline caused error: {MISCONF}",  # MULTI/EXEC
    MISCONF + SCRIPT,
    f"Command # 1 ({EVAL}) of pipeline caused error: {MISCONF}{SCRIPT}",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "Command # 3 (XADD s * f v) of pipeline caused error: OOM command not allowed when used "
    "memory > 'maxmemory'.",
    # A pipeline of pipelines (a retried annotation): still the server's reply underneath.
    f"Command # 1 (X) of pipeline caused error: Command # 2 (Y) of pipeline caused error: "
    f"{NOREPLICAS}",
]

NOT_REFUSED = [
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "Command # 1 (HSET k a) of pipeline caused error: wrong number of arguments for 'hset' command",
    "Command # 2 (GET k) of pipeline caused error: WRONGTYPE Operation against a key holding "
    "the wrong kind of value",
    "unknown command 'NOPE', with args beginning with: ",
    # A key named like a refusal is not one: only the reply after the annotation counts.
    "Command # 1 (SET NOREPLICAS 1) of pipeline caused error: WRONGTYPE Operation",
]


@pytest.mark.parametrize("msg", REFUSED)
def test_refusals_are_recognised_wherever_they_arise(msg: str) -> None:
    assert is_refusal(ResponseError(msg))


@pytest.mark.parametrize("msg", NOT_REFUSED)
def test_bugs_stay_bugs(msg: str) -> None:
    assert not is_refusal(ResponseError(msg))


def test_server_reply_strips_the_pipeline_annotation() -> None:
    e = ResponseError(f"Command # 2 (SET k 1) of pipeline caused error: {NOREPLICAS}")
    assert server_reply(e) == NOREPLICAS
    assert server_reply(ResponseError(NOREPLICAS)) == NOREPLICAS


@pytest.mark.parametrize("msg", [REFUSED[2], REFUSED[6]])
async def test_a_refused_pipeline_becomes_queue_unavailable(msg: str) -> None:
    @unavailable
    async def unregister() -> None:
        raise ResponseError(msg)

    with pytest.raises(QueueUnavailable) as caught:
        await unregister()
    assert isinstance(caught.value.__cause__, ResponseError)


async def test_a_pipelined_bug_is_not_disguised() -> None:
    @unavailable
    async def call() -> None:
        raise ResponseError(NOT_REFUSED[2])

    with pytest.raises(ResponseError):
        await call()
