"""The worker at run time: its tasks, how they are supervised, and how it stops.

Four tasks, joined by the book of held jobs and the outbox:

- consume: `Intake` reads, takes over, claims and admits jobs into the `Book` and the
  `Scheduler`, while fewer than `prefetch_limit` items are held (one worker never hoards
  the queue);
- schedule: asks the scheduler what runs next and starts each batch on the `Executor`
  (up to `streams` at once), counting device starts on the broker right before (for a lone
  job an idle worker read, its claim already did);
- publish: the `Outbox` posts final records (result → notify → XACK), keeping them while
  Redis is down;
- heartbeat: a `Snapshot` of the worker to the registry every `heartbeat_s`.

The quiet path skips two of those hops: a lone one-input job read by an idle worker (its
device start counted by the claim) is not prepared by the intake nor scheduled; it goes
straight to a model thread that prepares and runs it (`Executor.run_alone`), and its result
is written from that task (`Outbox.flush`). It counts as a running batch all the same, so
the scheduler, a stop and the heartbeat see it as they see any batch.

Each task is a supervised loop (`inferq.shared.supervise`, policy STOP): Redis away or
refusing writes is ridden out with backoff, counted in `inferq_background_errors_total{loop}`;
any other failure is counted and takes the worker down (and its heartbeat with it), never
leaving a process that looks alive but no longer reads or publishes.

Stop (`stop()`, on SIGTERM) is bounded by `INFERQ_DRAIN_S`: stop reading; once the intake
has returned, hand back every held job that has nothing on the device (taking back the device
start it counted); let the batches on the device finish; hand back what is still held; post
every result; exit. If the deadline passes first, whatever is left is handed back and `run`
returns False, so the process exits non-zero with one line saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from inferq.shared.consumer import JobConsumer
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import Clock, Status, pack_field
from inferq.shared.registry import ModelInfo, WorkerBeat, WorkerRegistry
from inferq.shared.retry import Backoff
from inferq.shared.settings import Settings
from inferq.shared.supervise import STOP, Supervisor
from inferq.worker.book import Book, JobState, Outbox, Work, work
from inferq.worker.executor import Executor
from inferq.worker.heartbeat import Heartbeat, Snapshot
from inferq.worker.intake import Arrivals, Intake
from inferq.worker.policy.scheduler import Batch, Item, Scheduler
from inferq.worker.telemetry import Telemetry

log = logging.getLogger("inferq.worker")

_NOT_FINAL = {pack_field(str(s)) for s in Status if not s.is_final}


EXIT_WAIT_S = 5.0  # how long a stopping worker waits for its cancelled loops to end
RECANCEL_S = 1.0  # how often a loop still running is cancelled again meanwhile


async def ended(tasks: set[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait for cancelled `tasks` to end, at most `timeout_s`, cancelling those still running
    again every `RECANCEL_S`: a library may swallow a cancel (Python 3.11's `wait_for`
    returns the result of a call that finished as the cancel came; `LeanConnection` keeps
    redis-py's writes off it, but not every library call). A loop that ignores every cancel
    must not keep the worker from exiting; it is named, with where it waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    stuck = {t for t in tasks if not t.done()}
    while stuck and (left := deadline - loop.time()) > 0:
        _, stuck = await asyncio.wait(stuck, timeout=min(left, RECANCEL_S))
        for t in stuck:
            t.cancel()
    for t in tasks - stuck:
        if not t.cancelled():
            t.exception()  # retrieved: an error here was already raised or logged above
    for t in stuck:
        log.error(
            "worker task %s did not end within %gs of its cancel (at %s)",
            t.get_name(),
            timeout_s,
            awaiting(t),
        )


def awaiting(task: asyncio.Task[Any], limit: int = 4) -> str:
    """Where `task` waits: the innermost `limit` frames of its chain of awaits (its own
    stack holds only its outermost coroutine while it is suspended)."""
    frames: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "; ".join(frames[-limit:])


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a worker is, as its heartbeat, its logs and its results name it."""

    consumer: str  # its consumer name in the group: unique per process
    model_name: str
    device: str
    backend: str = ""
    calibration: str = ""
    ceiling_reason: str = ""


@dataclass(frozen=True, slots=True)
class WorkerParts:
    queue: JobConsumer
    registry: WorkerRegistry
    scheduler: Scheduler
    telemetry: Telemetry
    outbox: Outbox
    book: Book
    intake: Intake
    executor: Executor
    heartbeat: Heartbeat
    info: ModelInfo  # what the model takes and gives, declared in Redis at start
    clock: Clock


class Worker:
    """Runs the parts `inferq.worker.build.build_worker` made (it builds none of its own)."""

    def __init__(self, settings: Settings, identity: WorkerIdentity, parts: WorkerParts) -> None:
        self.settings, self.identity = settings, identity
        self.consumer, self.model_name = identity.consumer, identity.model_name
        self.queue, self.registry, self.info = parts.queue, parts.registry, parts.info
        self.scheduler, self.telemetry, self.clock = parts.scheduler, parts.telemetry, parts.clock
        self.outbox, self.book = parts.outbox, parts.book
        self.intake, self.executor = parts.intake, parts.executor
        metrics = parts.telemetry.metrics
        self._errors = metrics.background_errors if metrics is not None else None
        self.heartbeat = parts.heartbeat
        self.handed_back = 0
        self._prefetch = settings.prefetch_limit  # items held at most; a property, read once
        self._on_device: dict[int, tuple[Batch, float]] = {}  # batch → (batch, started at)
        self._running: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()  # new items, a finished batch, or stop
        self._room = asyncio.Event()  # prefetch room freed, or stop
        self._stopping = asyncio.Event()
        self._consumed = asyncio.Event()  # the consume task has returned

    # --- lifecycle ---
    def stop(self) -> None:
        """Stop pulling and drain (see the module docstring); safe to call more than once."""
        if not self._stopping.is_set():
            log.info("stopping: no new reads; %d items held", self.book.held_items())
        self._stopping.set()
        self.poke()

    def poke(self) -> None:
        """Re-evaluate now (something changed, e.g. a test advanced its clock)."""
        self._wake.set()
        self._room.set()

    async def run(self) -> bool:
        """Serve until stopped; True if the drain finished within `drain_s`."""
        started = time.monotonic()
        await self._until_redis(lambda: self.queue.ensure_group(self.model_name))
        await self._until_redis(lambda: self.registry.describe(self.model_name, self.info))
        log.info(
            "worker %s serving model=%s device=%s ceiling=%d (%s) max_batch_size=%d max_wait_ms=%g",
            self.consumer,
            self.model_name,
            self.identity.device,
            self.scheduler.ceiling.value,
            self.identity.ceiling_reason or "INFERQ_MAX_BATCH_TOKENS",
            self.settings.max_batch_size,
            self.settings.max_wait_ms,
        )
        tasks = {
            asyncio.create_task(
                self.heartbeat.loop(self.snapshot, self._on_lost), name="heartbeat"
            ),
            asyncio.create_task(self.outbox.run(), name="publish"),
            asyncio.create_task(self._consume(), name="consume"),
            asyncio.create_task(self._schedule(), name="schedule"),
        }
        clean = False
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait({stopping, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            for t in done - {stopping}:
                t.result()  # a task that raised takes the worker down
                if not self._stopping.is_set():
                    raise RuntimeError(f"worker task {t.get_name()} returned unexpectedly")
            clean = await self._drain(tasks)
        finally:
            stopping.cancel()
            for t in tasks:
                t.cancel()
            await ended(tasks, EXIT_WAIT_S)
            with contextlib.suppress(QueueUnavailable):
                await self.heartbeat.unregister(self.consumer, self.model_name)
            self.intake.shutdown()
            self.executor.shutdown(wait=clean)  # a hung model thread must not hold the exit
        s = self.telemetry.counts
        log.info(
            "worker %s stopped after %.1fs: batches=%d items=%d jobs ok=%d failed=%d expired=%d "
            "cancelled=%d poisoned=%d handed_back=%d taken_over=%d lost=%d ooms=%d splits=%d "
            "unposted=%d",
            self.consumer,
            time.monotonic() - started,
            s.batches,
            s.items,
            s.jobs_ok,
            s.jobs_failed,
            s.jobs_expired,
            s.jobs_cancelled,
            s.jobs_poisoned,
            self.handed_back,
            self.intake.taken_over,
            s.lost,
            s.ooms,
            s.splits,
            self.outbox.pending,
        )
        return clean

    async def _until_redis(self, call: Callable[[], Awaitable[None]]) -> None:
        backoff = Backoff()
        while True:
            try:
                return await call()
            except QueueUnavailable as e:
                if self._stopping.is_set():
                    raise
                delay = backoff.next()
                log.warning("redis unavailable (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)

    def _serving(self) -> bool:
        return not self._stopping.is_set()

    # --- consume ---
    async def _consume(self) -> None:
        try:
            await Supervisor("consume", STOP, self._errors).run(self._consume_once, self._serving)
            # Reads still in flight on other shards: hold what they bring, so the drain
            # hands it back instead of leaving it in this worker's pending list.
            if late := [e for e in await self.intake.settle() if not self.book.knows(e.job_id)]:
                with contextlib.suppress(QueueUnavailable):
                    self._apply(await self.intake.admit(late))
        finally:
            self._consumed.set()

    async def _consume_once(self) -> None:
        """Read and admit what the prefetch room holds, or wait for room."""
        room = self._prefetch - self.book.held_items()
        if room <= 0:
            self._room.clear()
            await self._room.wait()
            return
        try:
            entries = await self.intake.fetch(room, self.book.knows)
            idle = not (self.book.jobs or self._on_device or self._stopping.is_set())
            arrivals = await self.intake.admit(entries, idle=idle) if entries else None
        except QueueUnavailable:
            self.intake.reconnected()  # the next read opens a fresh connection
            raise  # the supervisor counts it and backs off
        if arrivals is not None:
            self._apply(arrivals)

    def _apply(self, arrivals: Arrivals) -> None:
        for entry in arrivals.stale:
            self.outbox.ack(entry)
        for state, error, status in arrivals.decided:
            self.book.finalize(state, error, status)
        for state, items in arrivals.held:
            self.book.hold(state, items)
        if arrivals.alone is not None:
            entry, job = arrivals.alone
            state = JobState(job, entry, 1, outputs=[None], counted=True)
            self.book.hold_running(state)
            self._running.add(asyncio.create_task(self._run_alone(state)))
        self._wake.set()

    async def _run_alone(self, state: JobState) -> None:
        """The quiet path: an idle worker's lone job goes to a model thread, prepared and run
        in one hop, and its result is written from here, not by the outbox's task. It is a
        running batch like any other (the scheduler counts it; a stop waits for it)."""
        now = self.clock.monotonic()
        batch = Batch([Item(Work(state, 0, None), cost=1, arrived=now)], 1)
        self._on_device[id(batch)] = (batch, now)
        try:
            log.debug("batch on the device: 1 items")
            await self.executor.run_alone(state, self.intake.prepare_one, self.book, now)
            await self.outbox.flush()
        finally:
            del self._on_device[id(batch)]
            self._room.set()

    # --- schedule and run ---
    async def _schedule(self) -> None:
        await Supervisor("schedule", STOP, self._errors).run(self._schedule_once, self._serving)

    async def _schedule_once(self) -> None:
        """Start the next batch if one is due, else wait until something changes."""
        running = self._running
        for t in [t for t in running if t.done()]:
            running.discard(t)
            t.result()  # a batch task that raised takes the worker down
        self.book.expire_due()
        now = self.clock.monotonic()
        nxt = self.scheduler.next(now, len(running))
        if nxt.batch is not None:
            running.add(asyncio.create_task(self._run_batch(nxt.batch)))
            return
        self._wake.clear()
        wake = asyncio.ensure_future(self._wake.wait())
        timeout = None if nxt.wake_at is None else max(0.0, nxt.wake_at - now)
        await asyncio.wait({wake, *running}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        wake.cancel()

    async def _run_batch(self, batch: Batch) -> None:
        key = id(batch)
        self._on_device[key] = (batch, self.clock.monotonic())
        try:
            items = await self._start(batch.items)
            if items:
                log.debug("batch on the device: %d items", len(items))
            await self.executor.run(items, self.book)
        finally:
            del self._on_device[key]
            self._room.set()

    async def _start(self, items: list[Item]) -> list[Item]:
        """Count first device starts on the broker and write each job's progress; drop jobs
        made final elsewhere (expired in the queue) and end those cancelled while they ran."""
        live = self.book.live_items(items)
        states = list({id(s): s for s in [it.key.state for it in live]}.values())  # `Work`s
        # Jobs an idle worker's claim counted a moment ago: that claim was this check.
        checked = all(s.start_checked for s in states)
        for s in states:
            s.start_checked = False
        if checked:
            return live
        try:
            replies = await self.queue.start(
                [s.job.id for s in states],
                [not s.counted for s in states],
                [s.items_done for s in states],
            )
        except QueueUnavailable:  # cannot check: run them; the final write stays guarded
            replies = [(b"", False)] * len(states)
        for s, (raw, cancel) in zip(states, replies, strict=True):
            s.counted = s.counted or bool(raw)
            if raw and raw not in _NOT_FINAL:
                self.book.forget(s)
            elif cancel:
                self.book.cancel(s)
        return self.book.live_items(live)

    # --- stop ---
    async def _drain(self, tasks: set[asyncio.Task[None]]) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_s

        def left() -> float:
            return max(0.0, deadline - loop.time())

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left()):
                await self._consumed.wait()
        on_device = {id(work(it).state) for b, _ in self._on_device.values() for it in b.items}
        await self._hand_back([s for s in self.book.jobs.values() if id(s) not in on_device])
        busy: set[asyncio.Task[None]] = set()
        if self._running and left():
            _, busy = await asyncio.wait(self._running, timeout=left())
        await self._hand_back(list(self.book.jobs.values()))  # left with pending items, or stuck
        posted = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left()):
                await self.outbox.drained()
            posted = True
        if busy or not posted:
            log.error(
                "drain did not finish within INFERQ_DRAIN_S=%gs: %d batches still on the device, "
                "%d results unposted (their jobs stay in this worker's pending list)",
                self.settings.drain_s,
                len(busy),
                self.outbox.pending,
            )
            return False
        return True

    async def _hand_back(self, states: list[JobState]) -> None:
        """Give jobs back to the queue now, not after a visibility timeout."""
        states = [s for s in states if not s.done]
        if not states:
            return
        self.book.release(states)
        try:
            await self.queue.hand_back([s.entry for s in states], [s.counted for s in states])
        except QueueUnavailable as e:  # they stay in our PEL: a restart or take-over gets them
            log.warning("could not hand back %d jobs (%s)", len(states), e)
            return
        self.handed_back += len(states)
        log.info("handed back %d jobs", len(states))

    def _on_lost(self, entries: dict[str, list[str]]) -> None:
        lost = self.book.lose(entries)
        if lost:
            self.telemetry.on_lost(len(lost))
            log.warning(
                "lost %d jobs to another worker (this one was unresponsive past its heartbeat "
                "TTL): dropped them, carrying on",
                len(lost),
            )
            self._room.set()

    # --- the heartbeat's view ---
    def snapshot(self) -> Snapshot:
        if not self._on_device:
            self.telemetry.read_memory()  # between batches; during one, the batch line reads it
        alloc, reserved, total = self.telemetry.memory
        s, me = self.telemetry.counts, self.identity
        beat = WorkerBeat(
            id=me.consumer,
            host=socket.gethostname(),
            pid=os.getpid(),
            model=me.model_name,
            backend=me.backend,
            device=me.device,
            token_ceiling=self.scheduler.ceiling.value,
            items_per_s=round(s.items_per_s(), 2),
            last_batch_size=s.last_batch_size,
            last_batch_tokens=s.last_batch_tokens,
            last_batch_at_ms=s.last_batch_at_ms,
            batches=s.batches,
            ooms=s.ooms,
            held_items=self.book.held_items(),
            beat_ms=self.clock.now_ms(),
            mem_allocated=alloc,
            mem_reserved=reserved,
            mem_total=total,
            calibration=me.calibration,
            ceiling_reason=me.ceiling_reason,
            mem_footprint=self.telemetry.footprint,
            mem_budget=self.telemetry.budget,
        )
        oldest = min((at for _, at in self._on_device.values()), default=None)
        stuck = (
            oldest is not None
            and self.clock.monotonic() - oldest > self.settings.visibility_timeout_s
        )
        return Snapshot(beat, self.book.held_entries(), stuck)
