"""The intake with plain objects: a fake queue that keeps its streams and this consumer's
pending list (PEL) in memory, a fake registry and clock, the echo model. What it reads and in
which order (its PEL first, lanes by priority, shards in turn), when it takes over a dead
worker's entries, and how it decides each job it claims before the job costs device time.
The real CLAIM and XREADGROUP are tested on a real Redis in tests/integration/test_intake.py.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from inferq.shared.jobs import ErrorCode, Job, Status
from inferq.shared.queue import Claimed, Entry
from inferq.shared.schema import LANES
from inferq.shared.settings import Settings
from inferq.worker.intake import Intake, typed_inputs
from inferq.worker.models.base import Input, InputKind, InvalidInput, Prepared, Tensor
from inferq.worker.models.echo import EchoModel

NOW_MS = 1_000_000


@dataclass(frozen=True)
class Read:
    pending: bool
    lanes: tuple[str, ...]
    shards: tuple[int, ...]
    count: int
    block_ms: int | None


class FakeQueue:
    """The calls the intake makes. New entries wait per (lane, shard); a read moves them to
    this consumer's PEL, where they stay until the test acks them (as the outbox would)."""

    def __init__(self, shards: int = 1, cluster: bool = False) -> None:
        self.shards, self.cluster = shards, cluster
        self.new: dict[tuple[str, int], list[Entry]] = {}
        self.pel: list[Entry] = []
        self.jobs: dict[str, Job] = {}
        self.reads: list[Read] = []
        self.claims: list[tuple[list[str], int]] = []  # job ids, start_limit
        self.pending_by_consumer: dict[str, int] = {}
        self.takeable: list[Entry] = []
        self.take_overs: list[dict[str, Any]] = []
        self._n = 0

    def add(self, *inputs: Any, lane: str = "normal", shard: int = 0, **fields: Any) -> Entry:
        self._n += 1
        job = Job(id=f"j{self._n}", model="echo", inputs=list(inputs), **fields)
        self.jobs[job.id] = job
        entry = Entry(f"{lane}:{shard}", f"{self._n}-0", job.id)
        self.new.setdefault((lane, shard), []).append(entry)
        return entry

    def ack(self, entries: Sequence[Entry]) -> None:
        self.pel = [e for e in self.pel if e not in entries]

    async def read(
        self,
        model: str,
        consumer: str,
        *,
        count: int,
        block_ms: int | None,
        pending: bool = False,
        lanes: Sequence[str] = LANES,
        shards: Sequence[int] = (0,),
    ) -> list[Entry]:
        self.reads.append(Read(pending, tuple(lanes), tuple(shards), count, block_ms))
        got: list[Entry] = []
        for shard in shards:
            for lane in lanes:  # XREADGROUP's COUNT is per stream
                if pending:
                    got += [e for e in self.pel if e.stream == f"{lane}:{shard}"][:count]
                else:
                    waiting = self.new.get((lane, shard), [])
                    taken, waiting[:] = waiting[:count], waiting[count:]
                    self.pel += taken
                    got += taken
        return got

    async def claim(
        self, job_ids: Sequence[str], now_ms: int, *, start_limit: int = 0
    ) -> list[Claimed | None]:
        """As scripts.CLAIM: gone → None; a final job as it is; else running, and with
        `start_limit` a one-input job's device start counted too."""
        self.claims.append((list(job_ids), start_limit))
        out: list[Claimed | None] = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.status.is_final:
                out.append(None if job is None else Claimed(job))
                continue
            job.status = Status.RUNNING
            start = start_limit > 0 and len(job.inputs) == 1 and job.attempts < start_limit
            job.attempts += int(start)
            out.append(Claimed(dataclasses.replace(job), start))
        return out

    async def consumers(self, model: str) -> dict[str, int]:
        return dict(self.pending_by_consumer)

    async def take_over(self, model: str, consumer: str, **args: Any) -> list[Entry]:
        self.take_overs.append({"consumer": consumer, **args})
        taken, self.takeable = self.takeable, []
        return taken


class FakeRegistry:
    def __init__(self, live: set[str] | None = None) -> None:
        self.live = live or set()

    async def alive(self, worker_ids: Sequence[str]) -> list[bool]:
        return [w in self.live for w in worker_ids]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return NOW_MS


class Steered(EchoModel):
    """echo whose `prepare` records its calls, and misbehaves for inputs that ask it to."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[list[str]] = []

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        texts = self.texts(inputs)
        self.prepared.append(texts)
        if "crash" in texts:
            raise KeyError("vocab")
        if "short" in texts:
            return super().prepare(inputs, parameters)[:-1]  # one item too few
        return super().prepare(inputs, parameters)


def _intake(
    queue: FakeQueue, registry: FakeRegistry | None = None, **settings: Any
) -> tuple[Intake, Clock, Steered]:
    s = Settings(_env_file=None, model="echo", max_deliveries=3, **settings)  # type: ignore[arg-type]
    model, clock = Steered(), Clock()
    model.load("cpu")
    intake = Intake(
        queue,  # type: ignore[arg-type]
        registry or FakeRegistry(),  # type: ignore[arg-type]
        model,
        s,
        model_name="echo",
        consumer="me",
        clock=clock,
    )
    return intake, clock, model


def _never(job_id: str) -> bool:
    return False


async def _past_pel(intake: Intake) -> None:
    """A fresh intake reads its (here empty) PEL first; get past that read."""
    assert await intake.fetch(100, _never) == []


@pytest.fixture
def queue() -> FakeQueue:
    return FakeQueue()


async def test_its_pel_is_read_first_then_new_entries_and_again_after_a_reconnect(
    queue: FakeQueue,
) -> None:
    old = queue.add("delivered before a crash")
    queue.pel.append(queue.new[("normal", 0)].pop())
    new = queue.add("new")
    intake, _, _ = _intake(queue)
    held: set[str] = set()
    assert await intake.fetch(100, held.__contains__) == [old]
    held.add(old.job_id)
    assert await intake.fetch(100, held.__contains__) == []  # nothing in the PEL it lacks
    assert await intake.fetch(100, held.__contains__) == [new]
    assert [r.pending for r in queue.reads[:2]] == [True, True]
    assert not any(r.pending for r in queue.reads[2:])
    intake.reconnected()  # a reply may have been lost: the PEL again, first
    await intake.fetch(100, held.__contains__)
    assert queue.reads[-1].pending


async def test_a_pel_of_held_entries_is_not_read_again_and_again(queue: FakeQueue) -> None:
    """A restarted worker holds what its PEL gave it; those entries stay there until acked.
    Its next read is of new entries (it used to re-read the PEL, without blocking, until
    every one of them had finished: a hot loop that read nothing new)."""
    for i in range(3):
        queue.add(f"old {i}")
    queue.pel, queue.new[("normal", 0)] = queue.new[("normal", 0)], []
    intake, _, _ = _intake(queue, max_batch_size=2, prefetch_items=8)
    held = {e.job_id for e in await intake.fetch(8, _never)}
    assert held == {"j1", "j2", "j3"}  # the whole PEL, though a read takes 2 at most
    assert await intake.fetch(5, held.__contains__) == []
    assert await intake.fetch(5, held.__contains__) == []
    assert [r.pending for r in queue.reads[:2]] == [True, True]
    assert not any(r.pending for r in queue.reads[2:])
    assert queue.reads[-1].block_ms is not None  # and it blocks, as an idle read should


async def test_a_pel_larger_than_the_room_is_taken_a_room_at_a_time(queue: FakeQueue) -> None:
    for i in range(3):
        queue.add(f"old {i}")
    queue.pel, queue.new[("normal", 0)] = queue.new[("normal", 0)], []
    intake, _, _ = _intake(queue)
    held: set[str] = set()
    for expected in (["j1", "j2"], ["j3"], []):
        got = await intake.fetch(2, held.__contains__)
        assert [e.job_id for e in got] == expected
        held |= {e.job_id for e in got}
    assert all(r.pending for r in queue.reads)


async def test_a_backlog_is_read_lane_by_lane_high_first_until_a_read_is_full(
    queue: FakeQueue,
) -> None:
    intake, _, _ = _intake(queue, max_batch_size=4, read_block_ms=200)
    await _past_pel(intake)
    queue.add("h", lane="high")
    for i in range(3):
        queue.add(f"n{i}", lane="normal")
        queue.add(f"l{i}", lane="low")
    queue.reads.clear()
    got = await intake.fetch(100, _never)
    assert [queue.jobs[e.job_id].inputs[0] for e in got] == ["h", "n0", "n1", "n2"]
    assert [(r.lanes, r.count, r.block_ms) for r in queue.reads] == [
        (("high",), 4, None),
        (("normal",), 3, None),  # only what is left of the read's count
    ]
    queue.reads.clear()
    got = await intake.fetch(100, _never)  # still a backlog: lane by lane again
    assert [queue.jobs[e.job_id].inputs[0] for e in got] == ["l0", "l1", "l2"]
    assert all(r.block_ms is None and len(r.lanes) == 1 for r in queue.reads)
    queue.reads.clear()
    assert await intake.fetch(100, _never) == []  # the last read was short: no backlog
    assert queue.reads == [Read(False, LANES, (0,), 4, 200)]  # one blocking read, every lane


async def test_a_flood_of_high_jobs_never_starves_the_low_lane(queue: FakeQueue) -> None:
    intake, _, _ = _intake(queue, max_batch_size=1)
    await _past_pel(intake)
    for i in range(20):
        queue.add(f"h{i}", lane="high")
    low = queue.add("low", lane="low")
    got = [e for _ in range(8) for e in await intake.fetch(100, _never)]
    assert low in got  # within 8 reads, whatever the high lane holds


async def test_on_a_cluster_each_shard_is_read_alone_and_they_take_turns_first() -> None:
    queue = FakeQueue(shards=2, cluster=True)
    intake, _, _ = _intake(queue, max_batch_size=4)
    assert await intake.fetch(100, _never) == []  # the PEL: one read per shard
    assert [r.shards for r in queue.reads] == [(0,), (1,)]
    for _ in range(3):
        for shard in (0, 1):
            queue.add("x", lane="high", shard=shard)
            queue.add("y", lane="high", shard=shard)
    firsts = []
    for _ in range(2):
        queue.reads.clear()
        await intake.fetch(100, _never)
        assert all(len(r.shards) == 1 for r in queue.reads)
        firsts.append(queue.reads[0].shards)
    assert firsts == [(0,), (1,)]  # a busy shard never always goes first


async def test_take_over_claims_dead_consumers_only_and_at_most_once_a_period(
    queue: FakeQueue,
) -> None:
    queue.pending_by_consumer = {"me": 2, "alive": 1, "dead": 3, "done": 0}
    intake, clock, _ = _intake(
        queue, FakeRegistry({"alive"}), heartbeat_ttl_s=4, visibility_timeout_s=30
    )
    mine, theirs = Entry("normal:0", "1-0", "held here"), Entry("normal:0", "2-0", "theirs")
    queue.takeable = [mine, theirs]
    got = await intake.fetch(100, {"held here"}.__contains__)
    assert got == [theirs] and queue.reads == []  # taken entries first, without a read
    assert queue.take_overs == [
        {"consumer": "me", "dead": ["dead"], "dead_idle_ms": 2000, "stuck_idle_ms": 30_000}
    ]
    assert intake.taken_over == 1
    await intake.fetch(100, _never)
    assert len(queue.take_overs) == 1  # not again within the period: a read instead
    clock.t += 1.0  # min(1 s, visibility timeout / 3)
    await intake.fetch(100, _never)
    assert len(queue.take_overs) == 2


async def test_each_claimed_job_is_held_decided_or_acked(queue: FakeQueue) -> None:
    intake, _, _ = _intake(queue)
    ok = queue.add("a b", "c")
    late = queue.add("x", deadline_ms=NOW_MS - 1)
    poison = queue.add("y", attempts=3)
    bad = queue.add({"image": b"\xff\xd8\xff"})  # echo takes text only
    crash, short = queue.add("crash"), queue.add("short", "two")
    done = queue.add("z", status=Status.CANCELLED)
    gone = queue.add("w")
    del queue.jobs[gone.job_id]  # its record expired
    out = await intake.admit([ok, late, poison, bad, crash, short, done, gone])
    assert queue.claims[0][1] == 0  # not idle: no device start counted by the claim
    assert [(s.job.id, [it.cost for it in items]) for s, items in out.held] == [(ok.job_id, [2, 1])]
    held, items = out.held[0]
    assert held.remaining == 2 and held.outputs == [None, None] and not held.counted
    assert [it.key.index for it in items] == [0, 1] and items[0].key.payload == "a b"
    decided = {s.job.id: (e.code, st, s.dead_letter) for s, e, st in out.decided}
    assert decided == {
        late.job_id: (ErrorCode.EXPIRED, Status.EXPIRED, False),
        poison.job_id: (ErrorCode.POISONED, Status.FAILED, True),
        bad.job_id: (ErrorCode.INVALID_INPUT, Status.FAILED, False),
        crash.job_id: (ErrorCode.MODEL_ERROR, Status.FAILED, False),
        short.job_id: (ErrorCode.MODEL_ERROR, Status.FAILED, False),
    }
    messages = {s.job.id: e.message for s, e, _ in out.decided}
    assert messages[crash.job_id] == "KeyError: 'vocab'"
    assert "one item per input" in messages[short.job_id]  # tells the model author the fix
    assert "INFERQ_MAX_DELIVERIES=3" in messages[poison.job_id]
    assert [e.job_id for e in out.stale] == [done.job_id, gone.job_id]
    assert out.alone is None


async def test_an_idle_claim_of_a_lone_job_counts_its_start_and_skips_prepare(
    queue: FakeQueue,
) -> None:
    intake, _, model = _intake(queue)
    lone = queue.add("alone")
    out = await intake.admit([lone], idle=True)
    assert queue.claims[-1] == ([lone.job_id], 3)  # the claim may count it: start_limit
    assert out.alone is not None and out.alone[0] == lone and out.alone[1].attempts == 1
    assert out.held == [] and model.prepared == []  # prepared in the model thread instead
    pair = queue.add("one", "two")  # two inputs: not counted, prepared here
    out = await intake.admit([pair], idle=True)
    assert out.alone is None and [s.job.id for s, _ in out.held] == [pair.job_id]
    assert not out.held[0][0].counted and queue.jobs[pair.job_id].attempts == 0
    a, b = queue.add("a"), queue.add("b")  # two jobs: the one that waits must not be counted
    out = await intake.admit([a, b], idle=True)
    assert queue.claims[-1][1] == 0 and out.alone is None and len(out.held) == 2


def test_typed_inputs_name_the_bad_input_and_the_kinds_a_model_takes() -> None:
    every = frozenset(InputKind)
    tensor = {"tensor": {"dtype": "float32", "shape": [2], "data": b"\0" * 8}}
    kinds = [i.kind for i in typed_inputs(["text", {"image": b"\x89PNG"}, tensor], every)]
    assert kinds == [InputKind.TEXT, InputKind.IMAGE, InputKind.TENSOR]
    t = typed_inputs([tensor], every)[0].value
    assert isinstance(t, Tensor) and t.shape == (2,) and t.dtype == "float32"
    with pytest.raises(InvalidInput, match=r"input 1: malformed tensor"):
        typed_inputs(["ok", {"tensor": {"dtype": "float32"}}], every)
    with pytest.raises(InvalidInput, match=r"input 0: unknown input shape int"):
        typed_inputs([3], every)
    with pytest.raises(InvalidInput, match=r"input 0: image input, but this model takes text"):
        typed_inputs([{"image": b"x"}], frozenset({InputKind.TEXT}))


class SteeredMany(Steered):
    """`Steered` with a batched `prepare_many` that records its calls (and refuses, as a
    real tokenizer would, when any job's input asks it to crash)."""

    def __init__(self) -> None:
        super().__init__()
        self.batched: list[list[list[str]]] = []

    def prepare_many(
        self, jobs: Sequence[tuple[list[Input], Mapping[str, Any]]]
    ) -> list[list[Prepared]]:
        self.batched.append([self.texts(inputs) for inputs, _ in jobs])
        if any("crash" in self.texts(inputs) for inputs, _ in jobs):
            raise KeyError("vocab")
        return [EchoModel.prepare(self, inputs, params) for inputs, params in jobs]


async def test_the_jobs_of_one_claim_are_prepared_in_one_call(queue: FakeQueue) -> None:
    intake, _, _ = _intake(queue)
    model = intake.model = SteeredMany()
    a, b, bad = queue.add("a b", "c"), queue.add("d"), queue.add({"image": b"\xff"})
    out = await intake.admit([a, bad, b])
    assert model.batched == [[["a b", "c"], ["d"]]] and model.prepared == []  # one call
    assert [(s.job.id, [it.cost for it in items]) for s, items in out.held] == [
        (a.job_id, [2, 1]),
        (b.job_id, [1]),
    ]
    assert [(s.job.id, e.code) for s, e, _ in out.decided] == [
        (bad.job_id, ErrorCode.INVALID_INPUT)  # refused before the batched call
    ]


async def test_a_failed_batched_prepare_fails_only_the_guilty_job(queue: FakeQueue) -> None:
    intake, _, _ = _intake(queue)
    model = intake.model = SteeredMany()
    ok, crash, short = queue.add("x y"), queue.add("crash"), queue.add("short", "two")
    out = await intake.admit([ok, crash, short])
    assert len(model.batched) == 1  # tried together, then one at a time
    assert model.prepared == [["x y"], ["crash"], ["short", "two"]]
    assert [(s.job.id, [it.cost for it in items]) for s, items in out.held] == [(ok.job_id, [2])]
    decided = {s.job.id: e.code for s, e, _ in out.decided}
    assert decided == {crash.job_id: ErrorCode.MODEL_ERROR, short.job_id: ErrorCode.MODEL_ERROR}


async def test_a_batched_prepare_with_the_wrong_count_falls_back_per_job(
    queue: FakeQueue,
) -> None:
    intake, _, _ = _intake(queue)
    model = intake.model = SteeredMany()
    model.prepare_many = lambda jobs: []  # type: ignore[method-assign]
    a, b = queue.add("a"), queue.add("b c")
    out = await intake.admit([a, b])
    assert [[it.cost for it in items] for _, items in out.held] == [[1], [2]]


class Timed(SteeredMany):
    """`SteeredMany` that notes which thread prepared each claim and takes `delay_s` of a
    fake clock to do it."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.delay_s = clock, 0.0
        self.threads: list[str] = []

    def prepare_many(
        self, jobs: Sequence[tuple[list[Input], Mapping[str, Any]]]
    ) -> list[list[Prepared]]:
        self.threads.append(threading.current_thread().name)
        self.clock.t += self.delay_s
        return super().prepare_many(jobs)


async def test_a_claim_is_prepared_on_the_loop_only_once_its_cost_is_known_to_be_small(
    queue: FakeQueue,
) -> None:
    intake, clock, _ = _intake(queue)
    model = intake.model = Timed(clock)
    intake.prepare_timer = clock.monotonic  # the fake clock stands in for the CPU clock
    loop_thread = threading.current_thread().name

    async def claim() -> str:
        out = await intake.admit([queue.add("a b", "c"), queue.add("d")])
        assert [[it.cost for it in items] for _, items in out.held] == [[2, 1], [1]]
        return model.threads[-1]

    assert (await claim()).startswith("inferq-prepare")  # nothing known yet: the thread
    assert await claim() == loop_thread  # it took no time (the fake clock did not move)
    model.delay_s = 1.0  # a slow one, measured on the loop...
    assert await claim() == loop_thread
    assert (await claim()).startswith("inferq-prepare")  # ...sends the next to the thread
    assert max(intake.prepare_cost.seconds.values()) > 0.1  # the slow one, averaged in
