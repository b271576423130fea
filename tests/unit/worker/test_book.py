"""The book (each held job gets exactly one outcome) and the outbox (results kept while Redis
is down, posted in one call when it is back), with plain objects: a fake queue, a fake
clock, the real scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest

from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import ErrorCode, Job, JobError, Status, decode_outputs
from inferq.shared.queue import Entry, Final
from inferq.shared.schema import JobField
from inferq.shared.settings import Settings
from inferq.worker import outbox as outbox_module
from inferq.worker.book import Book
from inferq.worker.outbox import Outbox
from inferq.worker.policy.batcher import Item
from inferq.worker.policy.ceiling import LiveCeiling
from inferq.worker.policy.scheduler import Scheduler
from inferq.worker.state import JobState, Work
from inferq.worker.stats import Stats
from inferq.worker.telemetry import Telemetry


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return int(self.t * 1000)


class FakeQueue:
    """`finish` and `ack` as the outbox calls them; down for the first `down` calls."""

    def __init__(self, down: int = 0) -> None:
        self.down = down
        self.calls: list[list[str]] = []  # job ids per successful finish call
        self.acked: list[str] = []
        self.failed = 0

    async def finish(self, finals: list[Final]) -> list[int]:
        if self.down:
            self.down -= 1
            self.failed += 1
            raise QueueUnavailable("redis unavailable: connection refused")
        self.calls.append([f.job_id for f in finals])
        return [1] * len(finals)

    async def ack(self, entries: list[Entry]) -> None:
        self.acked += [e.entry_id for e in entries]


class Posted:
    """The outbox as the book sees it: what was posted and acked, in order."""

    def __init__(self) -> None:
        self.finals: list[Final] = []
        self.acks: list[Entry] = []
        self.posting: set[str] = set()

    def post(self, final: Final) -> None:
        self.finals.append(final)

    def ack(self, entry: Entry) -> None:
        self.acks.append(entry)


def _state(name: str, n: int, deadline_ms: int = 0) -> JobState:
    job = Job(id=name, model="m", inputs=[f"{name}{i}" for i in range(n)], tenant="t")
    job.deadline_ms = deadline_ms
    return JobState(job, Entry("s", f"1-{name}", name), remaining=n, outputs=[None] * n)


def _items(state: JobState) -> list[Item]:
    return [Item(Work(state, i, v), cost=1, arrived=0.0) for i, v in enumerate(state.job.inputs)]


def _book() -> tuple[Book, Posted, Scheduler, Clock]:
    scheduler = Scheduler(LiveCeiling(100, 1, 3), max_batch_size=8, max_wait_s=0.0, min_fill=0.0)
    posted, clock = Posted(), Clock()
    telemetry = Telemetry(Settings(model="echo"), "m", "cpu", None)
    book = Book("m", scheduler, posted, Stats(), telemetry, clock, worker="w")  # type: ignore[arg-type]
    return book, posted, scheduler, clock


def test_a_job_gets_one_outcome_when_its_last_row_arrives() -> None:
    book, posted, _, _ = _book()
    a = _state("a", 2)
    items = _items(a)
    book.hold(a, items)
    assert book.knows("a") and book.held_items() == 2 and book.held_entries() == {"s": ["1-a"]}
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    book.on_rows(items[:1], rows[:1], padded=1, run_s=0.01)
    assert posted.finals == []  # one item still to come
    book.on_rows(items[1:], rows[1:], padded=1, run_s=0.01)
    book.on_rows(items[1:], rows[1:], padded=1, run_s=0.01)  # a repeat changes nothing
    assert [f.job_id for f in posted.finals] == ["a"]
    final = posted.finals[0]
    assert final.tenant == "t" and final.entry_id == "1-a"
    outputs = decode_outputs(msgpack.unpackb(final.fields[JobField.OUTPUTS], raw=False))
    assert np.array_equal(outputs, rows)
    assert not book.knows("a") and book.held_items() == 0


def test_a_failed_item_fails_its_job_once_and_its_other_items_never_run() -> None:
    book, posted, scheduler, _ = _book()
    a, b = _state("a", 3), _state("b", 1)
    book.hold(a, _items(a))
    book.hold(b, _items(b))
    first = _items(a)[0]
    book.on_failure(first, JobError(ErrorCode.MODEL_ERROR, "boom"))
    book.on_failure(first, JobError(ErrorCode.MODEL_ERROR, "again"))  # already final
    assert [f.job_id for f in posted.finals] == ["a"]
    assert a.final_status is Status.FAILED and a.error is not None and a.error.message == "boom"
    # Only b's item is left to batch: a's two other items were dropped.
    batch = scheduler.next(0.0, running=0).batch
    assert batch is not None and [it.key.state.job.id for it in batch.items] == ["b"]


def test_expiry_cancel_loss_and_release_each_end_a_job_their_own_way() -> None:
    book, posted, scheduler, clock = _book()
    late, gone, taken, back = (
        _state("late", 1, deadline_ms=clock.now_ms() + 500),
        _state("gone", 1),
        _state("taken", 1),
        _state("back", 1),
    )
    for s in (late, gone, taken, back):
        book.hold(s, _items(s))
    clock.t += 1.0
    book.expire_due()  # past its deadline before it ran: expired, with a result written
    assert [f.job_id for f in posted.finals] == ["late"]
    assert late.final_status is Status.EXPIRED
    book.forget(gone)  # cancelled elsewhere: its entry acked, no result of ours
    assert [e.entry_id for e in posted.acks] == ["1-gone"]
    lost = book.lose({"s": ["1-taken"]})  # another worker has it now: nothing written
    assert [s.job.id for s in lost] == ["taken"] and taken.lost
    book.release([back])  # handed back to the queue: held no more, nothing written
    assert [f.job_id for f in posted.finals] == ["late"] and book.jobs == {}
    assert scheduler.next(0.0, running=0).batch is None  # none of them runs now


async def test_the_outbox_keeps_results_while_redis_is_down_and_posts_them_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def no_wait(delay: float, *args: Any) -> None:  # the backoff, without the wait
        sleeps.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(outbox_module.asyncio, "sleep", no_wait)
    queue = FakeQueue(down=3)
    box = Outbox(queue)  # type: ignore[arg-type]
    task = asyncio.create_task(box.run())
    try:
        finals = [Final("m", "s", f"1-{i}", f"j{i}", {}) for i in range(3)]
        for f in finals:
            box.post(f)
        box.ack(Entry("s", "1-stale", "old"))
        assert box.posting == {"j0", "j1", "j2"}
        await asyncio.wait_for(box.drained(), 5)
        assert queue.failed == 3 and sleeps[:3] == sorted(sleeps[:3])  # backed off, growing
        assert queue.calls == [["j0", "j1", "j2"]]  # kept, then posted together, in order
        assert queue.acked == ["1-stale"]
        assert box.posting == set() and box.pending == 0 and box.unavailable_since is None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
