"""The jobs a worker holds, and how each gets exactly one outcome.

A job enters with `hold` and leaves exactly once, through `finalize` (its final record goes
to the outbox), `hand_back` (it never started: it goes back to the queue) or `forget` (it
was made final elsewhere, e.g. cancelled: its entry is acked). The book is also the
executor's sink: rows scatter into their jobs' outputs, a failed item fails its whole job
and drops the job's other pending items, so they never reach the device.

What the book holds per job (`JobState`): its record, its entry, its items' outcomes. A job
is split into items (one per input); items may run in different batches. The job's state
collects their outputs and becomes final when the last one has an outcome, or at once
when one fails (its other items are then dropped before they run).

The outbox (`Outbox`, below) is the way out: finished results on their way to Redis,
posted in the order they finished, never dropped. `post` queues a job's final outcome, `ack`
an entry to acknowledge without a result (its job was already final: a duplicate delivery,
or cancelled elsewhere). `run` writes whatever is
queued in one `JobConsumer.finish` round trip (result → notify → XACK, atomically) and, while
Redis is unavailable, keeps it all and retries with backoff: a result computed during an
outage is posted when Redis answers again. Posting is idempotent (the finish script never
overwrites a final record), so a retry after a lost reply changes nothing. `run` is a
supervised loop (`inferq.shared.supervise`, STOP, loop `publish`): any other failure ends
the worker.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
from prometheus_client import Counter

from inferq.shared.consumer import JobConsumer
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import Clock, ErrorCode, Job, JobError, Status, encode_final, plain
from inferq.shared.queue import Entry, Final
from inferq.shared.supervise import STOP, Supervisor
from inferq.worker.policy.scheduler import Item, LiveCeiling, Owner
from inferq.worker.telemetry import Telemetry

log = logging.getLogger("inferq.worker")


@dataclass(eq=False, slots=True)
class JobState:
    job: Job
    entry: Entry
    remaining: int  # items without an outcome yet
    outputs: list[Any] = field(default_factory=list)  # one per input, in input order
    error: JobError | None = None
    final_status: Status | None = None  # set once, when the job is handed to the outbox
    batch_size: int = 0  # the largest batch any of its items ran in
    batch_tokens: int = 0  # the largest padded cost of those batches
    counted: bool = False  # its first device start is counted in `attempts`
    # Its claim also counted that start (Intake.admit, idle): its first batch skips START.
    start_checked: bool = False
    dead_letter: bool = False
    lost: bool = False  # another worker took its entry over: it is theirs now
    # Final here (`final_status` set) or lost: a plain attribute, not a property, since it is
    # read for every item of every batch (`Book.live_items`, `Book.on_rows`).
    done: bool = False

    @property
    def items_done(self) -> int:
        """Inputs with an output (a job that failed at admission has none)."""
        return len(self.outputs) - self.remaining if self.outputs else 0

    @property
    def attempts(self) -> int:
        return self.job.attempts

    @property
    def suspect(self) -> bool:
        """It was on a device when a worker died (`attempts` counts device starts): it runs
        alone, so it can only take itself down, not the healthy jobs batched with it."""
        return self.job.attempts >= 1


@dataclass(frozen=True, slots=True)
class Work:
    """One item's identity inside a batch (the batcher's `Item.key`)."""

    state: JobState
    index: int  # which input of the job
    payload: Any  # what the model's `prepare` made of it


def work(item: Item) -> Work:
    """The identity an item carries through the batch policy (`Item.key`)."""
    return item.key  # type: ignore[no-any-return]


_SHAPE_KIND = attrgetter("ndim", "dtype.kind")
_REMAINING = attrgetter("remaining")


def job_outputs(outputs: list[Any]) -> np.ndarray | list[Any]:
    """A job's outputs: vectors of one width as one float32 array (the fast path: raw bytes
    on the wire), anything else as a list of plain values, one per input."""
    # Checked and stacked in C (map over attrgetter, one np.stack), no Python call an output.
    if (
        outputs
        and set(map(type, outputs)) == {np.ndarray}
        and set(map(_SHAPE_KIND, outputs)) == {(1, "f")}
    ):
        try:
            return np.stack(outputs).astype(np.float32, copy=False)
        except ValueError:  # vectors of different widths
            pass
    return [plain(o) for o in outputs]


class Waiting(Protocol):
    """What the book needs of the scheduler: where held jobs' items wait for a batch."""

    ceiling: LiveCeiling

    def add(self, state: Owner, items: list[Item]) -> None: ...

    def drop(self, state: Owner) -> None: ...

    def drop_all(self, states: Collection[Owner]) -> None: ...

    def oldest_arrival(self) -> float | None: ...


class Book:
    def __init__(
        self,
        model_name: str,
        scheduler: Waiting,
        outbox: Outbox,
        telemetry: Telemetry,
        clock: Clock,
        worker: str = "",
    ) -> None:
        self.model_name = model_name
        self.worker = worker
        self.scheduler = scheduler
        self.outbox = outbox
        self.telemetry = telemetry
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        # No held job's deadline is earlier (ms): `expire_due`, called on every scheduling
        # pass, looks at the held jobs only once it has passed, not at each of them every
        # pass. A job that leaves may leave it early; the next look then sets it again.
        self._due_ms: float = math.inf

    # --- in ---
    def knows(self, job_id: str) -> bool:
        """Held here, or finalised here and not yet written: never admit it twice."""
        return job_id in self.jobs or job_id in self.outbox.posting

    def hold_running(self, state: JobState) -> None:
        """A job that goes to the device at once, past the scheduler (an idle worker's lone
        job): held, so its entry stays fresh and a stop or a take-over sees it."""
        self._held(state)

    def _held(self, state: JobState) -> None:
        self.jobs[state.job.id] = state
        deadline = state.job.deadline_ms
        if deadline and deadline < self._due_ms:
            self._due_ms = deadline

    def hold(self, state: JobState, items: list[Item]) -> None:
        if not items:
            self.finalize(state)
            return
        self._held(state)
        self.scheduler.add(state, items)

    # --- out ---
    def finalize(
        self, state: JobState, error: JobError | None = None, status: Status | None = None
    ) -> None:
        """The job's one outcome: its final record goes to the outbox."""
        if state.done:
            return
        state.error = error
        final = status or (Status.SUCCEEDED if error is None else Status.FAILED)
        state.final_status = final
        state.done = True
        self.jobs.pop(state.job.id, None)
        end = self.clock.now_ms()
        done = state.items_done
        # A job cancelled while it ran keeps what it had: null for each input not run.
        keep = error is None or (final is Status.CANCELLED and done > 0)
        fields = encode_final(
            final,
            finished_ms=end,
            outputs=job_outputs(state.outputs) if keep else None,
            error=error,
            batch=(state.batch_size, state.batch_tokens),
            worker=self.worker,
            items_done=done,
        )
        self.telemetry.on_final(state.job, final, error, end)
        if error is not None and error.code != ErrorCode.EXPIRED:
            log.warning("job %s %s: %s %s", state.job.id, final, error.code, error.message)
        e = state.entry
        self.outbox.post(
            Final(
                self.model_name,
                e.stream,
                e.entry_id,
                state.job.id,
                fields,
                state.dead_letter,
                tenant=state.job.tenant,
            )
        )

    def fail(self, state: JobState, error: JobError, status: Status = Status.FAILED) -> None:
        if state.done or state.job.id not in self.jobs:
            return
        self.scheduler.drop(state)  # its other items never run
        self.finalize(state, error, status)

    def cancel(self, state: JobState) -> None:
        """Its client cancelled it while it ran: it ends now, with the outputs it has, and its
        items not yet on the device never get there."""
        n = len(state.outputs)
        message = f"cancelled by the client while running, {state.items_done} of {n} inputs done"
        self.fail(state, JobError(ErrorCode.CANCELLED, message), Status.CANCELLED)

    def forget(self, state: JobState) -> None:
        """Someone else made this job final (e.g. DELETE): drop it, ack its entry."""
        state.final_status = Status.CANCELLED
        state.done = True
        self.telemetry.on_forgotten()
        self.jobs.pop(state.job.id, None)
        self.scheduler.drop(state)
        self.outbox.ack(state.entry)

    def lose(self, entries: dict[str, list[str]]) -> list[JobState]:
        """Held entries another worker took over (this one was frozen past its heartbeat TTL):
        drop their jobs without a result or an ack, whatever of them is on the device too."""
        gone = {(stream, i) for stream, ids in entries.items() for i in ids}
        lost = [s for s in self.jobs.values() if (s.entry.stream, s.entry.entry_id) in gone]
        self.scheduler.drop_all(lost)
        for s in lost:
            s.lost = s.done = True
            self.jobs.pop(s.job.id, None)
        return lost

    def release(self, states: Sequence[JobState]) -> None:
        """`states` were handed back to the queue: this worker holds them no more."""
        self.scheduler.drop_all(states)
        for s in states:
            self.jobs.pop(s.job.id, None)

    def expire_due(self) -> None:
        now = self.clock.now_ms()
        if now <= self._due_ms:
            return
        due = [s for s in self.jobs.values() if s.job.deadline_ms and now > s.job.deadline_ms]
        self.scheduler.drop_all(due)  # one pass over the pending items for all of them
        for s in due:
            self.finalize(
                s,
                JobError(ErrorCode.EXPIRED, "deadline passed before it could run"),
                Status.EXPIRED,
            )
        self._due_ms = min(
            (d for s in self.jobs.values() if (d := s.job.deadline_ms)), default=math.inf
        )

    def held_items(self) -> int:
        """Items held without an outcome yet: pending, suspect or on the device."""
        return sum(map(_REMAINING, self.jobs.values()))  # in C: read on every batch

    def held_entries(self) -> dict[str, list[str]]:
        """Stream → entry ids of every held job (what the heartbeat keeps fresh)."""
        held: dict[str, list[str]] = {}
        for s in self.jobs.values():
            held.setdefault(s.entry.stream, []).append(s.entry.entry_id)
        return held

    # --- the executor's sink ---
    def live_items(self, items: list[Item]) -> list[Item]:
        """`items` whose job has not ended: one pass, no call an item (`Item.key` is a `Work`)."""
        return [it for it in items if not it.key.state.done]

    def on_rows(
        self, items: list[Item], outputs: Sequence[Any] | np.ndarray, padded: int, run_s: float
    ) -> None:
        oldest = self.scheduler.oldest_arrival()
        self.telemetry.on_batch(
            len(items),
            padded,
            self.scheduler.ceiling.value,
            run_s,
            self.held_items(),
            0.0 if oldest is None else self.clock.monotonic() - oldest,
        )
        size = len(items)
        for out, it in zip(outputs, items, strict=True):
            w = it.key  # a `Work`; read directly, as `work(it)` would, without a call an item
            state = w.state
            if state.done:
                continue
            state.outputs[w.index] = out
            if size > state.batch_size:
                state.batch_size = size
            if padded > state.batch_tokens:
                state.batch_tokens = padded
            state.remaining -= 1
            if state.remaining == 0:
                self.finalize(state)

    def on_failure(self, item: Item, error: JobError) -> None:
        self.fail(work(item).state, error)

    def on_oom(self, items: list[Item], padded: int, before: int, after: int) -> None:
        self.telemetry.on_oom(after)

    def on_split(self, items: list[Item]) -> None:
        self.telemetry.on_split()


class Outbox:
    def __init__(self, queue: JobConsumer, errors: Counter | None = None) -> None:
        """`errors`: the worker's `inferq_background_errors` counter (None: not counted)."""
        self.queue = queue
        # Unbounded on purpose: a finished result must never be dropped or block the device.
        self._pending: asyncio.Queue[Final | Entry] = asyncio.Queue()
        self.posting: set[str] = set()  # job ids finalised here and not yet written
        self.unavailable_since: float | None = None  # loop time of the first failed post
        self._in_flight = 0  # taken off the queue, not yet written
        self._taken: list[Final | Entry] | None = None  # what `run` retries until written
        self._supervisor = Supervisor("publish", STOP, errors)

    def post(self, final: Final) -> None:
        self.posting.add(final.job_id)
        self._pending.put_nowait(final)

    def ack(self, entry: Entry) -> None:
        self._pending.put_nowait(entry)

    @property
    def pending(self) -> int:
        """Results and acks not yet written (queued or being posted)."""
        return self._pending.qsize() + self._in_flight

    async def drained(self) -> None:
        """Returns once everything queued so far is written."""
        await self._pending.join()

    async def _post(self, finals: list[Final], stale: list[Entry]) -> None:
        """Write `finals` (and ack `stale`): retry-safe, so the caller may call it again."""
        if finals:
            outcomes = await self.queue.finish(finals)
            if already := [f.job_id for f, o in zip(finals, outcomes, strict=True) if o == 0]:
                # A duplicate delivery, or a zombie's late result: the record stays as it was
                # and nothing is published again.
                log.info(
                    "%d results not written: their jobs were already final (%s)",
                    len(already),
                    ", ".join(already[:5]),
                )
        if stale:
            await self.queue.ack(stale)

    def _take(self, first: Final | Entry) -> list[Final | Entry]:
        batch = [first]
        while not self._pending.empty():
            batch.append(self._pending.get_nowait())
        self._in_flight = len(batch)
        return batch

    def _written(self, batch: list[Final | Entry]) -> None:
        for f in batch:
            if isinstance(f, Final):
                self.posting.discard(f.job_id)
        self._in_flight = 0
        for _ in batch:
            self._pending.task_done()

    async def flush(self) -> None:
        """Write what is queued now, from the caller's task: a quiet worker's one result goes
        out without waking the run task (one hop fewer). Nothing is lost either way: if
        another write is under way, or Redis fails, `run` takes it as usual."""
        if self._in_flight or self._pending.empty():
            return
        batch = self._take(self._pending.get_nowait())
        try:
            await self._post(
                [f for f in batch if isinstance(f, Final)],
                [e for e in batch if isinstance(e, Entry)],
            )
        except QueueUnavailable:
            self._in_flight = 0
            for item in batch:  # back in line: `run` retries them with backoff
                self._pending.put_nowait(item)
                self._pending.task_done()
            return
        self._written(batch)

    async def run(self) -> None:
        """Write what is queued, in order, until cancelled."""
        await self._supervisor.run(self._post_next)

    async def _post_next(self) -> None:
        """Write the batch taken before (a retry) or wait for the next one and write it."""
        if self._taken is None:
            self._taken = self._take(await self._pending.get())
        batch = self._taken
        try:
            await self._post(
                [f for f in batch if isinstance(f, Final)],
                [e for e in batch if isinstance(e, Entry)],
            )
        except QueueUnavailable:  # kept: posted when Redis answers again
            if self.unavailable_since is None:
                self.unavailable_since = asyncio.get_running_loop().time()
            raise
        self._taken = None
        self.unavailable_since = None
        self._written(batch)
