"""The broker layer's single definitions: script prelude, Redis-error boundary, backoff."""

from __future__ import annotations

import re

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError

from inferq.shared import scripts
from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_conn import unavailable
from inferq.shared.retry import Backoff
from inferq.shared.schema import ENTRY_JOB, FINAL, JobField, Status

BODIES = {
    name: getattr(scripts, name)
    for name in ("SUBMIT", "CLAIM", "START", "FINISH", "HAND_BACK", "CACHED", "REFRESH")
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_scripts_name_fields_and_statuses_only_through_the_prelude(name: str) -> None:
    body = BODIES[name]
    quoted = set(re.findall(r"'([a-z_]+)'", body))
    literal = quoted & ({f.value for f in JobField} | {s.value for s in Status} | {ENTRY_JOB})
    assert not literal, f"{name} hard-codes {sorted(literal)}: use F.x / S.x / ENTRY_JOB"
    for ref in re.findall(r"\bF\.([a-z_]+)", body):
        assert ref in {f.name.lower() for f in JobField}, ref
    for ref in re.findall(r"\bS\.([a-z_]+)", body):
        assert ref in {s.name.lower() for s in Status}, ref


def test_prelude_holds_every_field_status_and_final_state() -> None:
    for f in JobField:
        assert f"{f.name.lower()}='{f.value}'" in scripts.PRELUDE
    for s in Status:
        assert f"{s.name.lower()}='{s.value}'" in scripts.PRELUDE
    for s in FINAL:
        assert f"['{s}']=true" in scripts.PRELUDE
    assert scripts.source("return 1").startswith(scripts.PRELUDE)


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
