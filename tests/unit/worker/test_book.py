"""The book: each held job gets exactly one outcome (a result, a failure, an expiry) or leaves
without one (cancelled elsewhere, lost to another worker, handed back). Plain objects: an
outbox that records, a fake clock, the real scheduler."""

from __future__ import annotations

import msgpack
import numpy as np

from inferq.shared.jobs import ErrorCode, Job, JobError, Status, decode_outputs
from inferq.shared.queue import Entry, Final
from inferq.shared.schema import JobField
from inferq.shared.settings import Settings
from inferq.worker.book import Book, JobState, Work, job_outputs
from inferq.worker.policy.scheduler import Item, LiveCeiling, Scheduler
from inferq.worker.telemetry import Telemetry


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return int(self.t * 1000)


class Posted:
    """The outbox as the book sees it: what was posted and acked, in order."""

    def __init__(self) -> None:
        self.finals: list[Final] = []
        self.acks: list[Entry] = []
        self.posting: set[str] = set()

    def post(self, final: Final) -> None:
        self.finals.append(final)
        self.posting.add(final.job_id)  # as the outbox does, until the write lands

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
    book = Book("m", scheduler, posted, telemetry, clock, worker="w")  # type: ignore[arg-type]
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
    assert book.held_items() == 0 and book.held_entries() == {}
    # Final but not yet written: a redelivery of its entry must not be admitted again.
    assert book.knows("a")
    posted.posting.discard("a")  # written
    assert not book.knows("a")


def test_a_job_with_no_items_is_final_at_once_and_never_held() -> None:
    book, posted, scheduler, _ = _book()
    empty = _state("empty", 0)
    book.hold(empty, [])
    assert [f.job_id for f in posted.finals] == ["empty"] and empty.final_status is Status.SUCCEEDED
    assert book.jobs == {} and scheduler.next(0.0, running=0).batch is None


def test_outputs_are_one_array_only_for_float_vectors_of_one_width() -> None:
    same = [np.ones(3, dtype=np.float64), np.zeros(3, dtype=np.float64)]
    stacked = job_outputs(same)
    assert isinstance(stacked, np.ndarray) and stacked.shape == (2, 3)
    assert stacked.dtype == np.float32
    ragged = job_outputs([np.ones(3), np.ones(2)])
    assert isinstance(ragged, list) and [len(r) for r in ragged] == [3, 2]
    labels = job_outputs([np.array([1, 2]), "cat"])  # ints and text stay plain values
    assert labels == [[1, 2], "cat"]
    mixed = job_outputs([np.ones(2), np.array([1, 2])])  # a float vector beside an int one
    assert isinstance(mixed, list) and mixed == [[1.0, 1.0], [1, 2]]
    grids = job_outputs([np.ones((2, 2)), np.ones((2, 2))])  # not vectors
    assert isinstance(grids, list) and grids == [[[1.0, 1.0]] * 2] * 2
    scalars = job_outputs([np.float32(1.5), np.float32(2.5)])  # numpy scalars, not arrays
    assert scalars == [1.5, 2.5]


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


def test_expiry_looks_at_held_jobs_only_once_a_deadline_has_passed() -> None:
    book, posted, _, clock = _book()
    t0 = clock.now_ms()
    a, b = _state("a", 1, deadline_ms=t0 + 100), _state("b", 1, deadline_ms=t0 + 300)
    book.hold(a, _items(a))
    book.hold(b, _items(b))
    clock.t += 0.05
    book.jobs["b"].job.deadline_ms = t0 + 10  # moved behind the book's back: not looked at
    book.expire_due()  # before a's deadline, the earliest it knows: nothing is looked at
    assert posted.finals == []
    clock.t += 0.1  # past a's: both are looked at, each ends by its own deadline
    book.expire_due()
    assert [f.job_id for f in posted.finals] == ["a", "b"]
    c = _state("c", 1, deadline_ms=clock.now_ms() + 20)  # earlier than any left: still seen
    d = _state("d", 1)  # no deadline: never expires
    book.hold(c, _items(c))
    book.hold(d, _items(d))
    clock.t += 0.05
    book.expire_due()
    assert [f.job_id for f in posted.finals] == ["a", "b", "c"] and list(book.jobs) == ["d"]


def test_jobs_that_leave_together_leave_the_pending_items_in_one_pass() -> None:
    """A stop's hand-back, a take-over's loss or a stalled device's expiries end many jobs at
    once: the pending items are looked through once for all of them, not once a job."""
    book, posted, scheduler, clock = _book()
    passes: list[int] = []
    remove = scheduler.batcher.remove
    scheduler.batcher.remove = lambda predicate: passes.append(1) or remove(predicate)  # type: ignore[method-assign]
    states = [_state(f"j{i}", 2, deadline_ms=clock.now_ms() + 10) for i in range(30)]
    for s in states:
        book.hold(s, _items(s))
    book.release(states[:10])
    assert len(passes) == 1 and scheduler.pending() == 40
    book.lose({"s": [f"1-j{i}" for i in range(10, 20)]})
    assert len(passes) == 2 and scheduler.pending() == 20
    clock.t += 1.0
    book.expire_due()
    assert len(passes) == 3 and scheduler.pending() == 0 and book.jobs == {}
    assert [f.job_id for f in posted.finals] == [f"j{i}" for i in range(20, 30)]
