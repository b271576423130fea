"""The scheduler's policy and the executor's bisection, with plain objects (no Redis, no I/O)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.shared.jobs import ErrorCode, Job, JobError
from inferq.shared.queue import Entry
from inferq.worker.book import JobState, Work, work
from inferq.worker.executor import Executor
from inferq.worker.models.base import DeviceOutOfMemory
from inferq.worker.policy.scheduler import Item, LiveCeiling, Scheduler, padded_cost


def _state(name: str, n: int, attempts: int = 0) -> JobState:
    job = Job(id=name, model="m", inputs=[f"{name}-{i}" for i in range(n)], attempts=attempts)
    return JobState(job, Entry("s", f"1-{name}", name), remaining=n, outputs=[None] * n)


def _items(state: JobState, costs: Sequence[int], at: float = 0.0) -> list[Item]:
    return [
        Item(Work(state, i, state.job.inputs[i]), cost=c, arrived=at) for i, c in enumerate(costs)
    ]


def _scheduler(ceiling: int = 100, size: int = 8, streams: int = 1, wait: float = 0.0) -> Scheduler:
    return Scheduler(
        LiveCeiling(ceiling, 1, 3), max_batch_size=size, max_wait_s=wait, min_fill=0.0,
        streams=streams,
    )  # fmt: skip


# --- scheduler ---
def test_at_most_streams_batches_at_once_and_a_busy_stream_waits_for_its_share() -> None:
    s = _scheduler(size=8, streams=2)
    st_ = _state("a", 12)
    s.add(st_, _items(st_, [1] * 12))
    assert s.next(0.0, running=2).batch is None  # every stream busy
    first = s.next(0.0, running=0).batch
    assert first is not None and len(first.items) == 8
    beside = s.next(0.0, running=1)  # 4 left, share is 8 // 2 = 4: due at once
    assert beside.batch is not None and len(beside.batch.items) == 4


def test_suspects_run_alone_fewest_attempts_first_and_block_the_rest() -> None:
    s = _scheduler()
    healthy, twice, once = _state("h", 2), _state("t", 1, attempts=2), _state("o", 2, attempts=1)
    for state in (healthy, twice, once):
        s.add(state, _items(state, [1] * len(state.job.inputs)))
    assert s.next(0.0, running=1).batch is None  # a suspect never shares the device
    order = []
    while (b := s.next(0.0, running=0).batch) is not None:
        order.append(sorted({work(it).state.job.id for it in b.items}))
    assert order == [["o"], ["t"], ["h"]]
    assert s.pending() == 0


def test_drop_forgets_every_pending_item_of_a_job_wherever_it_waits() -> None:
    s = _scheduler()
    a, sus = _state("a", 3), _state("s", 2, attempts=1)
    s.add(a, _items(a, [1, 1, 1]))
    s.add(sus, _items(sus, [1, 1]))
    assert s.pending() == 5
    s.drop(sus)
    s.drop(a)
    assert s.pending() == 0 and s.next(0.0, running=0).batch is None


def test_waits_for_more_items_only_when_told_to() -> None:
    s = _scheduler(wait=0.05)
    a = _state("a", 2)
    s.add(a, _items(a, [1, 1], at=10.0))
    nxt = s.next(10.0, running=0)
    assert nxt.batch is None and nxt.wake_at == pytest.approx(10.05)
    assert s.next(10.05, running=0).batch is not None  # the wait is over


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.integers(1, 40), min_size=1, max_size=40),
    ceiling=st.integers(1, 120),
    size=st.integers(1, 10),
    running=st.integers(0, 3),
    streams=st.integers(1, 3),
)
def test_next_never_exceeds_the_bounds(
    costs: list[int], ceiling: int, size: int, running: int, streams: int
) -> None:
    s = _scheduler(ceiling=ceiling, size=size, streams=streams)
    a = _state("a", len(costs))
    s.add(a, _items(a, costs))
    seen = 0
    while (b := s.next(1e9, running=running).batch) is not None:  # every wait is over
        assert b.items and len(b.items) <= size
        assert len(b.items) == 1 or padded_cost(b.items) <= ceiling
        seen += len(b.items)
    assert seen == (len(costs) if running < streams else 0)


# --- executor ---
class Sink:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], Any] = {}
        self.failures: dict[tuple[str, int], JobError] = {}
        self.ooms = 0
        self.splits = 0
        self.dead: set[str] = set()

    def live_items(self, items: list[Item]) -> list[Item]:
        return [it for it in items if work(it).state.job.id not in self.dead]

    def on_rows(
        self, items: list[Item], outputs: Sequence[Any] | np.ndarray, padded: int, run_s: float
    ) -> None:
        for it, out in zip(items, outputs, strict=True):
            key = (work(it).state.job.id, work(it).index)
            assert key not in self.rows and key not in self.failures, key
            self.rows[key] = out

    def on_failure(self, item: Item, error: JobError) -> None:
        key = (work(item).state.job.id, work(item).index)
        assert key not in self.rows and key not in self.failures, key
        self.failures[key] = error
        self.dead.add(key[0])

    def on_oom(self, items: list[Item], padded: int, before: int, after: int) -> None:
        self.ooms += 1
        assert after <= before

    def on_split(self, items: list[Item]) -> None:
        self.splits += 1


class Steered:
    """Raises on payloads in `bad`; runs out of memory above `limit` padded cost."""

    def __init__(self, bad: set[str], limit: int, costs: dict[str, int]) -> None:
        self.bad, self.limit, self.costs = bad, limit, costs
        self.dim, self.max_cost = 1, None

    def run(self, batch: list[str]) -> np.ndarray:
        if len(batch) * max(self.costs[p] for p in batch) > self.limit:
            raise DeviceOutOfMemory("over the limit")
        if self.bad & set(batch):
            raise ValueError("bad input")
        return np.array([[float(self.costs[p])] for p in batch], dtype=np.float32)


@settings(max_examples=150, deadline=None)
@given(
    costs=st.lists(st.integers(1, 20), min_size=1, max_size=24),
    bad=st.sets(st.integers(0, 23), max_size=4),
    limit=st.integers(1, 100),
)
def test_every_item_gets_exactly_one_outcome(costs: list[int], bad: set[int], limit: int) -> None:
    """One item per job: bad ones fail alone (model_error), ones that cannot fit alone fail
    too_large, every other one succeeds with its own output, however the batch was split."""
    states = [_state(f"j{i}", 1) for i in range(len(costs))]
    items = [_items(s, [c])[0] for s, c in zip(states, costs, strict=True)]
    payload_cost = {s.job.inputs[0]: c for s, c in zip(states, costs, strict=True)}
    bad_payloads = {states[i].job.inputs[0] for i in bad if i < len(costs)}
    scheduler = _scheduler(ceiling=10_000, size=len(items))
    executor = Executor(
        Steered(bad_payloads, limit, payload_cost), scheduler, threads=1, device="cpu"
    )  # type: ignore[arg-type]
    sink = Sink()
    try:
        asyncio.run(executor.run(items, sink))
    finally:
        executor.shutdown()
    for s, c in zip(states, costs, strict=True):
        key = (s.job.id, 0)
        payload = s.job.inputs[0]
        if c > limit:
            assert sink.failures[key].code == ErrorCode.TOO_LARGE
        elif payload in bad_payloads:
            assert sink.failures[key].code == ErrorCode.MODEL_ERROR
        else:
            assert key in sink.rows and sink.rows[key].tolist() == [float(c)]
    if len(items) * max(costs) > limit:
        assert sink.ooms >= 1 and scheduler.ceiling.lowered >= 1


def test_an_item_of_a_job_that_already_failed_never_runs() -> None:
    ran: list[list[str]] = []

    class Model:
        dim, max_cost = 1, None

        def run(self, batch: list[str]) -> np.ndarray:
            ran.append(list(batch))
            if "a-0" in batch:
                raise ValueError("a is bad")
            return np.zeros((len(batch), 1), dtype=np.float32)

    a, b = _state("a", 2), _state("b", 2)
    items = _items(a, [1, 1]) + _items(b, [1, 1])
    executor = Executor(Model(), _scheduler(), threads=1, device="cpu")  # type: ignore[arg-type]
    sink = Sink()
    asyncio.run(executor.run(items, sink))
    executor.shutdown()
    assert ("a", 0) in sink.failures and ("a", 1) not in sink.rows
    isolated = ran.index(["a-0"])
    assert not any("a-1" in batch for batch in ran[isolated + 1 :])  # its job failed: dropped
    assert ("b", 0) in sink.rows and ("b", 1) in sink.rows


def test_a_model_that_returns_the_wrong_number_of_outputs_fails_its_items() -> None:
    class Short:
        dim, max_cost = 1, None

        def run(self, batch: list[str]) -> list[Any]:
            return [0.0] * (len(batch) - 1)

    a = _state("a", 1)
    executor = Executor(Short(), _scheduler(), threads=1, device="cpu")  # type: ignore[arg-type]
    sink = Sink()
    asyncio.run(executor.run(_items(a, [1]), sink))
    executor.shutdown()
    err = sink.failures[("a", 0)]
    assert err.code == ErrorCode.MODEL_ERROR and "one output per input" in err.message
