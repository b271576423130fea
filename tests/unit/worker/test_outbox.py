"""The outbox: results written in the order they finished, never dropped. While Redis is
down they are kept and retried with a growing backoff; once it answers they go out in one
call. Plain objects: a fake queue, the backoff's sleep without the wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferq.shared.errors import QueueUnavailable
from inferq.shared.queue import Entry, Final
from inferq.worker import book as outbox_module
from inferq.worker.book import Outbox


class FakeQueue:
    """`finish` and `ack` as the outbox calls them; down for the first `down` calls. A job
    in `already` was final before (its write changes nothing: outcome 0)."""

    def __init__(self, down: int = 0, already: frozenset[str] = frozenset()) -> None:
        self.down = down
        self.already = already
        self.calls: list[list[str]] = []  # job ids per successful finish call
        self.acked: list[str] = []
        self.failed = 0

    async def finish(self, finals: list[Final]) -> list[int]:
        if self.down:
            self.down -= 1
            self.failed += 1
            raise QueueUnavailable("redis unavailable: connection refused")
        self.calls.append([f.job_id for f in finals])
        return [0 if f.job_id in self.already else 1 for f in finals]

    async def ack(self, entries: list[Entry]) -> None:
        self.acked += [e.entry_id for e in entries]


def _finals(n: int) -> list[Final]:
    return [Final("m", "s", f"1-{i}", f"j{i}", {}) for i in range(n)]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff's delays, recorded; the outbox's sleeps only yield."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def no_wait(delay: float, *args: Any) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(outbox_module.asyncio, "sleep", no_wait)
    return delays


async def _run_until_drained(box: Outbox) -> None:
    task = asyncio.create_task(box.run())
    try:
        await asyncio.wait_for(box.drained(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_results_are_kept_while_redis_is_down_and_posted_together_after(
    sleeps: list[float],
) -> None:
    queue = FakeQueue(down=3)
    box = Outbox(queue)  # type: ignore[arg-type]
    for f in _finals(3):
        box.post(f)
    box.ack(Entry("s", "1-stale", "old"))
    assert box.posting == {"j0", "j1", "j2"} and box.pending == 4
    await _run_until_drained(box)
    assert queue.failed == 3 and sleeps[:3] == sorted(sleeps[:3])  # backed off, growing
    assert queue.calls == [["j0", "j1", "j2"]]  # kept, then posted together, in order
    assert queue.acked == ["1-stale"]
    assert box.posting == set() and box.pending == 0 and box.unavailable_since is None


async def test_a_failed_flush_leaves_everything_for_run_in_order(sleeps: list[float]) -> None:
    """The quiet path writes from the caller's task; if Redis fails there, nothing is lost:
    the results go back in line and `run` posts them, still in the order they finished."""
    queue = FakeQueue(down=1)
    box = Outbox(queue)  # type: ignore[arg-type]
    for f in _finals(2):
        box.post(f)
    await box.flush()  # fails: no error escapes to the caller
    assert queue.failed == 1 and queue.calls == []
    assert box.pending == 2 and box.posting == {"j0", "j1"}
    await _run_until_drained(box)
    assert queue.calls == [["j0", "j1"]] and box.posting == set() and sleeps == []


async def test_a_flush_writes_at_once_without_the_run_task() -> None:
    queue = FakeQueue()
    box = Outbox(queue)  # type: ignore[arg-type]
    box.post(_finals(1)[0])
    await box.flush()
    assert queue.calls == [["j0"]] and box.pending == 0 and box.posting == set()
    await asyncio.wait_for(box.drained(), 1)  # nothing left for `run`
    await box.flush()  # nothing queued: no call
    assert queue.calls == [["j0"]]


async def test_a_result_for_a_job_already_final_is_not_retried() -> None:
    """A duplicate delivery or a zombie's late result: the write changes nothing, and the
    outbox moves on instead of retrying it."""
    queue = FakeQueue(already=frozenset({"j1"}))
    box = Outbox(queue)  # type: ignore[arg-type]
    for f in _finals(3):
        box.post(f)
    await _run_until_drained(box)
    assert queue.calls == [["j0", "j1", "j2"]] and box.posting == set() and box.pending == 0
