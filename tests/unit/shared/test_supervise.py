"""The one supervisor of background loops: failures counted by loop, logged once per streak,
backed off on the shared schedule; STOP raises what it does not survive; a cancel always
gets through. Plain steps, a recorded sleep, a fresh metrics registry."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import Counter

from inferq.shared.errors import QueueUnavailable
from inferq.shared.metrics import api_metrics
from inferq.shared.retry import Backoff
from inferq.shared.supervise import DONE, STOP, SURVIVE, Done, Supervisor


class Flaky:
    """A step that raises `errors` in turn, then succeeds; `DONE` after `passes` passes."""

    def __init__(self, errors: list[Exception], passes: int = 1) -> None:
        self.errors = errors
        self.passes = passes
        self.calls = 0

    async def __call__(self) -> Done | None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.passes -= 1
        return DONE if self.passes <= 0 else None


class Sleeps:
    """The supervisor's sleep, recorded, without the wait."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture(autouse=True)
def _every_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="inferq.supervise")


def _counter() -> Counter:
    return api_metrics().background_errors


def _count(errors: Counter, loop: str) -> float:
    return float(errors.labels(loop=loop)._value.get())


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]


async def test_two_failures_then_success_counted_twice_logged_once_backed_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors, sleeps = _counter(), Sleeps()
    step = Flaky([RuntimeError("a bug"), RuntimeError("the same bug")])
    await Supervisor("scan", SURVIVE, errors, sleep=sleeps).run(step)
    assert step.calls == 3
    assert _count(errors, "scan") == 2
    assert sleeps.delays == [0.1, 0.2]  # shared/retry.py's schedule
    (opened, recovered) = _lines(caplog)
    assert opened[0] == logging.ERROR and opened[1].startswith("scan failed")
    assert caplog.records[0].exc_info is not None  # a bug: its traceback, once
    again = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert [r.getMessage() for r in again] == ["scan failed again (2 in a row): the same bug"]
    assert recovered[0] == logging.INFO and "scan recovered after 2 failures" in recovered[1]


async def test_each_streak_is_logged_once_and_the_backoff_restarts_after_a_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors, sleeps = _counter(), Sleeps()
    sup = Supervisor("read", SURVIVE, errors, sleep=sleeps)
    down = QueueUnavailable("redis unavailable: connection refused")
    await sup.run(Flaky([down, down, down]))
    await sup.run(Flaky([down]))
    assert _count(errors, "read") == 4
    assert sleeps.delays == [0.1, 0.2, 0.4, 0.1]
    warnings = [m for level, m in _lines(caplog) if level == logging.WARNING]
    assert len(warnings) == 2 and all("read failing (redis unavailable" in m for m in warnings)
    assert all(r.exc_info is None for r in caplog.records)  # an outage: one line, no traceback


async def test_a_loop_runs_until_running_turns_false_and_survives_anything() -> None:
    sleeps = Sleeps()
    passes: list[int] = []

    async def step() -> None:
        passes.append(1)
        if len(passes) % 2:
            raise KeyError("odd pass")

    await Supervisor("upkeep", SURVIVE, sleep=sleeps).run(step, lambda: len(passes) < 6)
    assert len(passes) == 6 and len(sleeps.delays) == 3  # no counter given: nothing counted


async def test_a_given_backoff_sets_the_retry_pace() -> None:
    sleeps = Sleeps()
    down = QueueUnavailable("redis unavailable")
    sup = Supervisor("heartbeat", STOP, backoff=Backoff(2.0, 2.0), sleep=sleeps)
    await sup.run(Flaky([down, down, down]))
    assert sleeps.delays == [2.0, 2.0, 2.0]  # every period, not faster


async def test_stop_rides_out_redis_and_raises_anything_else_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors, sleeps = _counter(), Sleeps()
    bug = ZeroDivisionError("a bug")
    step = Flaky([QueueUnavailable("redis unavailable"), bug])
    with pytest.raises(ZeroDivisionError) as raised:
        await Supervisor("consume", STOP, errors, sleep=sleeps).run(step)
    assert raised.value is bug and step.calls == 2
    assert _count(errors, "consume") == 2 and sleeps.delays == [0.1]
    assert "consume failed (ZeroDivisionError: a bug); stopping the process" in caplog.text


async def test_survive_and_stop_differ_only_past_redis() -> None:
    down, bug = QueueUnavailable("down"), RuntimeError("bug")
    assert Supervisor("a", SURVIVE).survives(down) and Supervisor("a", SURVIVE).survives(bug)
    assert Supervisor("a", STOP).survives(down) and not Supervisor("a", STOP).survives(bug)


@pytest.mark.parametrize("policy", [SURVIVE, STOP])
async def test_a_cancel_always_propagates(policy: object) -> None:
    started = asyncio.Event()

    async def step() -> None:
        started.set()
        await asyncio.sleep(60)

    sup = Supervisor("loop", policy, _counter())  # type: ignore[arg-type]
    task = asyncio.create_task(sup.run(step))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert sup.failures == 0  # a cancel is no failure


async def test_a_cancel_during_the_backoff_propagates_too() -> None:
    errors = _counter()
    sup = Supervisor("loop", SURVIVE, errors, backoff=Backoff(60.0, 60.0))
    task = asyncio.create_task(sup.run(Flaky([RuntimeError("bug")])))
    deadline = asyncio.get_running_loop().time() + 5
    while _count(errors, "loop") < 1:  # failed once: now in its 60 s backoff
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)


async def test_failed_and_succeeded_serve_a_loop_that_paces_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = _counter()
    renewals = Supervisor("batch_leases", SURVIVE, errors)
    assert renewals.failed(RuntimeError("a")) == 0.1
    assert renewals.failed(RuntimeError("b")) == 0.2
    renewals.succeeded()
    renewals.succeeded()  # no streak: nothing to say
    assert _count(errors, "batch_leases") == 2 and renewals.failures == 0
    assert [level for level, _ in _lines(caplog)] == [logging.ERROR, logging.INFO]
