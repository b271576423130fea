"""`runtime.ended`: a stopping worker waits for its cancelled loops, but a loop that swallows
its cancellation cannot keep the process from exiting; it is named in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from inferq.worker import runtime
from inferq.worker.runtime import ended


async def test_cancelled_loops_end_and_a_stubborn_one_is_named_not_awaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def polite() -> None:
        await asyncio.sleep(60)

    async def failing() -> None:
        raise RuntimeError("already failed")

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:  # as a loop does when a library re-wraps it
                continue

    tasks = {
        asyncio.create_task(polite(), name="polite"),
        asyncio.create_task(failing(), name="failing"),
        asyncio.create_task(stubborn(), name="stubborn"),
    }
    await asyncio.sleep(0)
    for t in tasks:
        t.cancel()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.ERROR, logger="inferq.worker"):
        await ended(tasks, 0.2)
    assert loop.time() - started < 2
    named = [r.getMessage() for r in caplog.records]
    assert len(named) == 1 and "worker task stubborn did not end" in named[0]
    assert "test_runtime.py" in named[0]  # where it waits
    release.set()
    stuck = next(t for t in tasks if t.get_name() == "stubborn")
    stuck.cancel()
    await asyncio.wait({stuck}, timeout=2)
    assert stuck.done()


async def test_a_loop_that_swallowed_one_cancel_is_cancelled_again_and_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As Python 3.11's `wait_for` does when the call it waits on finished as the cancel came."""
    monkeypatch.setattr(runtime, "RECANCEL_S", 0.05)
    swallowed = 0

    async def once_deaf() -> None:
        nonlocal swallowed
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed += 1
        await asyncio.sleep(60)

    task = asyncio.create_task(once_deaf(), name="once_deaf")
    await asyncio.sleep(0)
    task.cancel()
    with caplog.at_level(logging.ERROR, logger="inferq.worker"):
        await ended({task}, 2)
    assert task.cancelled() and swallowed == 1
    assert not caplog.records
