"""No call waits without a bound: `infer` and `wait` without `timeout_s` on a job that stays
queued (no worker serves its model) end in `WaitTimeout` after `DEFAULT_WAIT_S`, its job
attached, instead of long-polling for ever. A fake server holds each long-poll as long as it
was asked to, on a fake clock: nothing really waits."""

from __future__ import annotations

import httpx
import pytest

from inferq.client import JobStatus, WaitTimeout
from inferq.client.flows import DEADLINE_GRACE_S, DEFAULT_WAIT_S
from tests.unit.client.fakes import FakeAPI, FakeClock, async_client, client, job, reply


def _queued_forever(clock: FakeClock) -> FakeAPI:
    """202 to the submit, then 'queued' to every long-poll, each held as long as it asked."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return reply(202, job("j9", "queued"), Location="/v1/jobs/j9")
        clock.now += float(request.url.params.get("wait", "0"))
        return reply(200, job("j9", "queued", position=1))

    return FakeAPI(handler=answer)


def test_infer_without_a_timeout_gives_up_after_the_default_bound() -> None:
    clock = FakeClock()
    start = clock.now
    with (
        client(_queued_forever(clock), clock, long_poll_s=20) as c,
        pytest.raises(WaitTimeout) as e,
    ):
        c.infer(input="nobody serves this")
    assert e.value.job.id == "j9" and e.value.job.status is JobStatus.QUEUED
    assert e.value.timeout_s == DEFAULT_WAIT_S
    assert clock.now - start == pytest.approx(
        DEFAULT_WAIT_S
    )  # the last poll asked for what was left


def test_infer_with_a_deadline_waits_for_it_plus_the_grace() -> None:
    clock = FakeClock()
    start = clock.now
    with (
        client(_queued_forever(clock), clock, long_poll_s=20) as c,
        pytest.raises(WaitTimeout) as e,
    ):
        c.infer(input="x", timeout_s=5)
    assert e.value.timeout_s == 5 + DEADLINE_GRACE_S
    assert clock.now - start == pytest.approx(5 + DEADLINE_GRACE_S)


def test_wait_without_a_timeout_is_bounded_too() -> None:
    clock = FakeClock()
    api = _queued_forever(clock)
    with client(api, clock, long_poll_s=30) as c, pytest.raises(WaitTimeout) as e:
        c.wait("j9")
    assert e.value.timeout_s == DEFAULT_WAIT_S
    assert sum(float(s.params["wait"]) for s in api.seen) == pytest.approx(DEFAULT_WAIT_S)


async def test_the_async_client_bounds_infer_the_same() -> None:
    clock = FakeClock()
    async with async_client(_queued_forever(clock), clock, long_poll_s=20) as c:
        with pytest.raises(WaitTimeout) as e:
            await c.infer(input="x")
    assert e.value.timeout_s == DEFAULT_WAIT_S
