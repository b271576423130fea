"""The worker: Redis → batcher → model → Redis, as tasks joined by bounded queues.

- consume: XREADGROUP lane by lane (own PEL first), plus a take-over pass that claims
  the entries of dead or stuck workers → claim jobs → prepare items → batcher. Reading
  stops while `prefetch_limit` items are held, so one worker never hoards the queue.
- run: the batcher decides when a batch is due; the model runs in one dedicated thread
  so the event loop (reads, publishing, heartbeats) stays live during device work.
  Expired and cancelled jobs are dropped before they cost device time.
- publish: finished jobs are written, announced and acked in one atomic round trip.
  If Redis is down, results are kept and posted when it is back.

Every item gets exactly one outcome: a failing batch is split until the guilty item is
alone (`model_error`); a batch that runs out of memory is split and the live ceiling
lowered, and an item that cannot fit alone fails its own job (`too_large`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from redis.asyncio import Redis

from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import Job, JobError, Status, encode_final, now_ms, pack_field
from inferq.shared.metrics import WorkerMetrics
from inferq.shared.queue import Entry, Final, JobQueue
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings
from inferq.worker.batcher import Batch, Batcher, Item
from inferq.worker.ceiling import LiveCeiling
from inferq.worker.heartbeat import Heartbeat
from inferq.worker.lanes import lane_order
from inferq.worker.models.base import DeviceOutOfMemory, Model, ModelError
from inferq.worker.stats import Stats
from inferq.worker.streams import limits, smooth

log = logging.getLogger("inferq.worker")

REDIS_DOWN = (QueueUnavailable,)
T = TypeVar("T")
_NOT_FINAL = {pack_field(str(s)) for s in Status if not s.is_final}


@dataclass(eq=False, slots=True)
class JobState:
    """One job held by this worker until its last item has an outcome."""

    job: Job
    entry: Entry
    remaining: int
    outputs: np.ndarray | None = None
    error: JobError | None = None
    final_status: Status | None = None
    batch_size: int = 0
    batch_tokens: int = 0
    started_items: int = 0  # items handed to a batch so far (0: the job can be handed back)
    counted: bool = False  # its first device start is counted in `attempts`
    dead_letter: bool = False
    solo_items: list[Item] | None = None


def release_device_cache(device: str) -> None:
    """After an OOM only: hand cached blocks back so the retry sees the memory."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


class Worker:
    def __init__(
        self,
        settings: Settings,
        model: Model,
        model_name: str,
        redis: Redis,
        *,
        device: str,
        ceiling: int | None = None,
        ceiling_reason: str = "",
        metrics: WorkerMetrics | None = None,
        backend: str = "",
        model_threads: int = 1,
    ) -> None:
        self.settings = settings
        self.model = model
        self.model_name = model_name
        self.device = device
        self.queue = JobQueue(redis, result_ttl_s=settings.result_ttl_s)
        self.redis = redis
        self.registry = WorkerRegistry(redis)
        self.consumer = settings.consumer_name(device, model_name)
        max_cost = getattr(model, "max_cost", None) or 1
        top = ceiling or settings.max_batch_tokens
        self.ceiling = LiveCeiling(max(top, max_cost), max_cost, settings.ceiling_recover_after)
        self.ceiling_reason = ceiling_reason
        self.batcher = Batcher(
            self.ceiling.value, settings.max_batch_size, settings.max_wait_ms / 1000,
            settings.min_padding_efficiency,
        )  # fmt: skip
        self.metrics = metrics
        self.stats = Stats()
        self.jobs: dict[str, JobState] = {}
        self.solo: deque[JobState] = deque()  # redelivered jobs run alone (guide #4)
        # bound: one thread per batch allowed in flight (1 on a GPU: a second would only
        # contend for the same device; on a CPU, one core per batch beats splitting ops).
        self.model_threads = model_threads
        self._executor = ThreadPoolExecutor(model_threads, thread_name_prefix="inferq-model")
        self._wake = asyncio.Event()  # new items, or stop
        self._room = asyncio.Event()  # prefetch room freed
        # unbounded on purpose: finished results must never be dropped or block the device.
        self._finished: asyncio.Queue[Final] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._running_items = 0
        self._backlog = True  # until a read comes back short, assume work is waiting
        self._stale: list[Entry] = []  # entries to ack without a result (already final)
        self._posting: set[str] = set()  # finalised here, not yet written: never re-admit
        self.batch_starts: dict[int, float] = {}  # batch → when it started (stuck detection)
        self.recent_run_s = 0.0  # smoothed batch run time (how long a busy stream waits)
        self.heartbeat = Heartbeat(self, backend=backend)

    # --- lifecycle ---
    def stop(self) -> None:
        """Stop pulling; finish the batch in flight, hand back unstarted jobs, post, return."""
        if not self._stopping.is_set():
            log.info("stopping: no new reads; %d items held", self.held_items())
        self._stopping.set()
        self._wake.set()
        self._room.set()

    async def run(self) -> None:
        started = time.monotonic()
        await self._retry_redis(self.queue.ensure_group, self.model_name)
        log.info(
            "worker %s serving model=%s device=%s ceiling=%d (%s) max_batch_size=%d max_wait_ms=%g",
            self.consumer, self.model_name, self.device, self.ceiling.value,
            self.ceiling_reason or "INFERQ_MAX_BATCH_TOKENS", self.batcher.max_batch_size,
            self.settings.max_wait_ms,
        )  # fmt: skip
        tasks = {
            asyncio.create_task(self.heartbeat.loop(), name="heartbeat"),
            asyncio.create_task(self._publish_loop(), name="publish"),
            asyncio.create_task(self._consume_loop(), name="consume"),
            asyncio.create_task(self._run_loop(), name="run"),
        }
        consumer = next(t for t in tasks if t.get_name() == "consume")
        runner = next(t for t in tasks if t.get_name() == "run")
        handed_back = 0
        try:
            # A task that dies must take the worker down (and its heartbeat with it), never
            # leave a process that looks alive but no longer reads or publishes.
            while not runner.done():
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if (exc := t.exception()) is not None:
                        raise exc
            await consumer
            handed_back = runner.result() or 0
            await self._finished.join()
            await self._flush_stale()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(*REDIS_DOWN):
                await self.heartbeat.unregister()
            self._executor.shutdown(wait=True)
        s = self.stats
        log.info(
            "worker %s stopped after %.1fs: batches=%d items=%d jobs ok=%d failed=%d expired=%d "
            "cancelled=%d poisoned=%d handed_back=%d taken_over=%d ooms=%d splits=%d unposted=%d",
            self.consumer, time.monotonic() - started, s.batches, s.items, s.jobs_ok, s.jobs_failed,
            s.jobs_expired, s.jobs_cancelled, s.jobs_poisoned, handed_back, s.taken_over, s.ooms,
            s.splits, self._finished.qsize(),
        )  # fmt: skip

    async def _retry_redis(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        delay = 0.1
        while True:
            try:
                return await fn(*args)
            except REDIS_DOWN as e:
                if self._stopping.is_set():
                    raise
                log.warning("redis unavailable (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # --- consume ---
    def held_items(self) -> int:
        solo = sum(s.remaining for s in self.solo)
        return len(self.batcher) + self._running_items + solo

    async def _consume_loop(self) -> None:
        pending = True  # start with our own PEL: entries delivered before a crash or reconnect
        delay = 0.1
        reads = 0
        next_takeover = 0.0
        while not self._stopping.is_set():
            room = self.settings.prefetch_limit - self.held_items()
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                if time.monotonic() >= next_takeover:
                    next_takeover = time.monotonic() + min(
                        1.0, self.settings.visibility_timeout_s / 3
                    )
                    taken = await self._take_over()
                    if taken:
                        await self._admit(taken)
                        continue
                entries = await self._read(room, pending, reads)
                reads += 1
                if pending and not entries:
                    pending = False
                    continue
                entries = [
                    e
                    for e in entries
                    if e.job_id not in self.jobs and e.job_id not in self._posting
                ]
                if entries:
                    await self._admit(entries)
                elif pending:
                    pending = False
                delay = 0.1
            except REDIS_DOWN as e:
                log.warning("redis read failed (%s); reconnecting in %.1fs", e, delay)
                pending = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _read(self, room: int, pending: bool, read_no: int) -> list[Entry]:
        count = min(room, self.settings.max_batch_size)
        if pending:
            return await self.queue.read(
                self.model_name, self.consumer, count=count, block_ms=None, pending=True
            )
        got: list[Entry] = []
        if self._backlog:
            # A backlog: read lane by lane, so priorities decide who gets into the batcher.
            for lane in lane_order(read_no):
                got += await self.queue.read(
                    self.model_name, self.consumer, count=count - len(got), block_ms=None,
                    lanes=(lane,),
                )  # fmt: skip
                if len(got) >= count:
                    return got
        if not got:
            # No backlog: one blocking read over every lane answers as soon as anything arrives.
            got = await self.queue.read(
                self.model_name, self.consumer, count=count, block_ms=self.settings.read_block_ms
            )
        self._backlog = len(got) >= count
        return got

    async def _take_over(self) -> list[Entry]:
        """Claim entries of consumers whose heartbeat is gone, and of any stuck past the timeout."""
        pending = await self.queue.consumers(self.model_name)
        others = [c for c, n in pending.items() if n and c != self.consumer]
        dead: list[str] = []
        if others:
            alive = await self.registry.alive(others)
            dead = [c for c, a in zip(others, alive, strict=True) if not a]
        # A dead worker's entries stopped being refreshed when it died; requiring half a
        # heartbeat TTL of idleness keeps two live workers from both claiming them.
        taken = await self.queue.take_over(
            self.model_name, self.consumer, dead=dead,
            dead_idle_ms=int(self.settings.heartbeat_ttl_s * 500),
            stuck_idle_ms=int(self.settings.visibility_timeout_s * 1000),
        )  # fmt: skip
        taken = [e for e in taken if e.job_id not in self.jobs and e.job_id not in self._posting]
        if taken:
            self.stats.taken_over += len(taken)
            log.warning(
                "took over %d entries (dead consumers: %s)", len(taken), ", ".join(dead) or "none"
            )
        return taken

    async def _admit(self, entries: list[Entry]) -> None:
        jobs = await self.queue.claim([e.job_id for e in entries], now_ms())
        arrived = time.monotonic()
        for entry, job in zip(entries, jobs, strict=True):
            if job is None or job.status.is_final:
                self._stale.append(entry)  # record expired, cancelled, or a duplicate delivery
                continue
            if job.id in self.jobs:
                continue
            self._admit_job(job, entry, arrived)
        await self._flush_stale()
        self._wake.set()

    def _admit_job(self, job: Job, entry: Entry, arrived: float) -> None:
        # `attempts` counts device starts that never finished (see queue.START_LUA).
        if job.attempts >= self.settings.max_deliveries:
            state = JobState(job, entry, 0, dead_letter=True)
            msg = (
                f"started {job.attempts} times without finishing "
                f"(INFERQ_MAX_DELIVERIES={self.settings.max_deliveries})"
            )
            log.error("job %s poisoned: %s; dead-lettered", job.id, msg)
            self._finalize(state, JobError("poisoned", msg), Status.FAILED)
            return
        if job.deadline_ms and now_ms() > job.deadline_ms:
            self._finalize(
                JobState(job, entry, 0),
                JobError("expired", "deadline passed in queue"),
                Status.EXPIRED,
            )
            return
        try:
            prepared = self.model.prepare(job.inputs)
            if len(prepared) != len(job.inputs) or any(
                not isinstance(p.cost, int) or p.cost < 1 for p in prepared
            ):
                raise ModelError("prepare() must return one item per input, each with cost >= 1")
        except Exception as e:  # a bad input fails its own job before it reaches a batch
            self._finalize(
                JobState(job, entry, 0), JobError("model_error", f"{type(e).__name__}: {e}")
            )
            return
        state = JobState(job, entry, remaining=len(prepared))
        if not prepared:
            state.outputs = np.empty((0, self.model.dim), dtype=np.float32)
            self._finalize(state)
            return
        self.jobs[job.id] = state
        items = [
            Item(key=(state, i, p.payload), cost=p.cost, arrived=arrived)
            for i, p in enumerate(prepared)
        ]
        if job.attempts >= 1:
            # It was on a device when a worker died: it may be what killed it. Run it alone, so it can
            # only take itself down, not the healthy jobs it would be batched with.
            state.solo_items = items
            self.solo.append(state)
            return
        for it in items:
            self.batcher.add(it)

    async def _flush_stale(self) -> None:
        if self._stale:
            stale, self._stale = self._stale, []
            try:
                await self.queue.ack(stale)
            except REDIS_DOWN:
                self._stale = stale + self._stale
                raise

    # --- run ---
    async def _run_loop(self) -> int:
        """Run batches (up to `model_threads` at once) until stopped; returns jobs handed back."""
        handed_back = 0
        running: set[asyncio.Task[None]] = set()
        while True:
            for t in [t for t in running if t.done()]:
                running.discard(t)
                t.result()  # a batch task that raised takes the worker down
            now = time.monotonic()
            self._expire_due()
            if self.solo:
                if running:  # a suspect runs with nothing beside it: it can only kill itself
                    await asyncio.wait(running)
                    continue
                # Least suspicious first: a job that was on the device at more crashes waits.
                state = min(self.solo, key=lambda st: st.job.attempts)
                self.solo.remove(state)
                await self._run_solo(state)
                continue
            stopping = self._stopping.is_set()
            if stopping and not handed_back:
                handed_back = await self._hand_back_unstarted()
            batch = None
            if len(running) < self.model_threads:
                self._set_limits(len(running))
                batch = self.batcher.next_batch(now, force=stopping)
            if batch is None:
                if stopping and not running and not len(self.batcher):
                    return handed_back
                due = None if len(running) >= self.model_threads else self.batcher.due_at()
                self._wake.clear()
                waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait())}
                waits |= running
                timeout = None if due is None else max(0.0, due - now)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for f in waits - set(running):
                    f.cancel()
                continue
            for it in batch.items:  # claimed now, so a stop never hands back a job mid-run
                it.key[0].started_items += 1
            running.add(asyncio.create_task(self._run_batch(batch)))

    def _set_limits(self, running: int) -> None:
        lim = limits(
            running, self.model_threads, self.settings.max_batch_size,
            self.settings.max_wait_ms / 1000, self.recent_run_s,
        )  # fmt: skip
        self.batcher.max_batch_size, self.batcher.max_wait_s = lim.max_batch_size, lim.max_wait_s

    async def _hand_back_unstarted(self) -> int:
        """On stop: jobs with no item started go back to the queue now, not after a timeout."""
        unstarted = [s for s in self.jobs.values() if s.started_items == 0 and s.error is None]
        unstarted += [s for s in self.solo if s.started_items == 0]
        if not unstarted:
            return 0
        ids = {id(s) for s in unstarted}
        self.batcher.remove(lambda it: id(it.key[0]) in ids)
        self.solo = deque(s for s in self.solo if id(s) not in ids)
        for s in unstarted:
            self.jobs.pop(s.job.id, None)
        try:
            await self.queue.hand_back([s.entry for s in unstarted])
        except REDIS_DOWN as e:  # they stay in our PEL: a restart or take-over gets them
            log.warning("could not hand back %d jobs (%s)", len(unstarted), e)
        log.info("handed back %d unstarted jobs", len(unstarted))
        return len(unstarted)

    def _expire_due(self) -> None:
        now = now_ms()
        for state in [
            s for s in self.jobs.values() if s.job.deadline_ms and now > s.job.deadline_ms
        ]:
            self._fail(
                state, JobError("expired", "deadline passed before it could run"), Status.EXPIRED
            )

    async def _run_solo(self, state: JobState) -> None:
        if state.error is not None:
            return
        solo = Batcher(self.ceiling.value, self.settings.max_batch_size, 0.0, self.batcher.min_fill)
        for it in state.solo_items or ():
            solo.add(it)
        while (batch := solo.next_batch(time.monotonic(), force=True)) is not None:
            for it in batch.items:
                it.key[0].started_items += 1
            await self._run_batch(batch)

    async def _start_batch(self, batch: Batch) -> list[Item]:
        """Count first device starts, and drop items of jobs finalised elsewhere (cancelled)."""
        states = list(
            {id(it.key[0]): it.key[0] for it in batch.items if it.key[0].error is None}.values()
        )
        try:
            statuses = await self.queue.start(
                [s.job.id for s in states], [not s.counted for s in states]
            )
        except REDIS_DOWN:
            statuses = [b""] * len(states)  # cannot check: run them; finish stays guarded
        for s, raw in zip(states, statuses, strict=True):
            s.counted = True
            if raw and raw not in _NOT_FINAL:
                self._drop(s)
        return [
            it for it in batch.items if it.key[0].error is None and it.key[0].final_status is None
        ]

    def _drop(self, state: JobState) -> None:
        """Someone else made this job final (e.g. DELETE): forget it, ack its entry."""
        state.final_status = Status.CANCELLED
        self.stats.jobs_cancelled += 1
        self.jobs.pop(state.job.id, None)
        self.batcher.remove(lambda it: it.key[0] is state)
        self._stale.append(state.entry)

    async def _run_batch(self, batch: Batch) -> None:
        key = id(batch)
        self._running_items += len(batch.items)
        self.batch_starts[key] = time.monotonic()
        try:
            await self._run_items(await self._start_batch(batch))
        finally:
            self._running_items -= len(batch.items)
            del self.batch_starts[key]
            self._room.set()

    async def _run_items(self, items: list[Item]) -> None:
        items = [it for it in items if it.key[0].error is None and it.key[0].final_status is None]
        if not items:
            return
        padded = len(items) * max(it.cost for it in items)
        if padded > self.ceiling.value and len(items) > 1:
            await self._split(items)  # the ceiling dropped since this batch was packed
            return
        t0 = time.perf_counter()
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.model.run, [it.key[2] for it in items]
            )
            out = np.asarray(out, dtype=np.float32)
            if out.ndim != 2 or out.shape[0] != len(items):
                raise ModelError(
                    f"model returned {out.shape} for {len(items)} inputs: return one row per input"
                )
        except DeviceOutOfMemory as e:
            await self._on_oom(items, padded, e)
            return
        except Exception as e:
            if len(items) == 1:
                state = items[0].key[0]
                log.warning(
                    "job %s failed: model error on item %d: %r", state.job.id, items[0].key[1], e
                )
                self._fail(state, JobError("model_error", f"{type(e).__name__}: {e}"))
                return
            log.info(
                "batch of %d failed (%s); splitting to isolate the bad item",
                len(items),
                type(e).__name__,
            )
            await self._split(items)
            return
        run_s = time.perf_counter() - t0
        self.recent_run_s = smooth(self.recent_run_s, run_s)
        before = self.ceiling.value
        if self.ceiling.on_success() > before:
            log.info(
                "live ceiling raised %d -> %d after successful batches", before, self.ceiling.value
            )
            if self.metrics:
                self.metrics.token_ceiling.set(self.ceiling.value)
        self.batcher.max_batch_tokens = self.ceiling.value
        self._scatter(items, out, padded)
        self.heartbeat.on_batch(len(items), padded, run_s)

    async def _split(self, items: list[Item]) -> None:
        self.stats.splits += 1
        if self.metrics:
            self.metrics.batch_splits.inc()
        items = sorted(items, key=lambda it: it.cost)  # halves of similar length pad less
        half = len(items) // 2
        await self._run_items(items[:half])
        await self._run_items(items[half:])

    async def _on_oom(self, items: list[Item], padded: int, e: Exception) -> None:
        self.stats.ooms += 1
        release_device_cache(self.device)
        before = self.ceiling.value
        after = self.ceiling.on_oom(padded)
        self.batcher.max_batch_tokens = after
        if self.metrics:
            self.metrics.oom.inc()
            self.metrics.token_ceiling.set(after)
        log.warning(
            "out of memory at items=%d tokens=%d (%s); live ceiling %d -> %d",
            len(items),
            padded,
            e,
            before,
            after,
        )
        if len(items) == 1:
            state = items[0].key[0]
            self._fail(
                state,
                JobError(
                    "too_large",
                    f"input {items[0].key[1]} ({padded} tokens) does not fit in device memory alone",
                ),
            )
            return
        await self._split(items)

    def _scatter(self, items: list[Item], out: np.ndarray, padded: int) -> None:
        self.stats.on_batch(len(items), padded)
        if self.metrics:
            self.metrics.batch_size.labels(model=self.model_name).observe(len(items))
            self.metrics.batch_tokens.labels(model=self.model_name).observe(padded)
        for row, it in zip(out, items, strict=True):
            state, index, _ = it.key
            if state.error is not None or state.final_status is not None:
                continue
            if state.outputs is None:
                state.outputs = np.empty((len(state.job.inputs), out.shape[1]), dtype=np.float32)
            state.outputs[index] = row
            state.batch_size = max(state.batch_size, len(items))
            state.batch_tokens = max(state.batch_tokens, padded)
            state.remaining -= 1
            if state.remaining == 0:
                self._finalize(state)

    def _fail(self, state: JobState, error: JobError, status: Status = Status.FAILED) -> None:
        if state.error is not None or state.job.id not in self.jobs:
            return
        self.batcher.remove(lambda it: it.key[0] is state)  # its other items never run
        self._finalize(state, error, status)

    def _finalize(
        self, state: JobState, error: JobError | None = None, status: Status | None = None
    ) -> None:
        state.error = error
        final = status or (Status.SUCCEEDED if error is None else Status.FAILED)
        state.final_status = final
        self.jobs.pop(state.job.id, None)
        self.stats.on_job(final, error)
        fields = encode_final(
            final, finished_ms=now_ms(), outputs=state.outputs if error is None else None, error=error,
            batch_size=state.batch_size, batch_tokens=state.batch_tokens,
        )  # fmt: skip
        if self.metrics:
            self.metrics.jobs_finished.labels(model=self.model_name, status=str(final)).inc()
            job = state.job
            end = now_ms()
            if job.started_ms is not None:
                self.metrics.job_queue_seconds.labels(model=self.model_name).observe(
                    max(0, job.started_ms - job.created_ms) / 1000
                )
            self.metrics.job_latency_seconds.labels(model=self.model_name).observe(
                max(0, end - job.created_ms) / 1000
            )
        if error is not None and error.code != "expired":
            log.warning("job %s %s: %s %s", state.job.id, final, error.code, error.message)
        e = state.entry
        self._posting.add(state.job.id)
        self._finished.put_nowait(
            Final(
                self.model_name,
                e.stream,
                e.entry_id,
                state.job.id,
                fields,
                dead_letter=state.dead_letter,
            )
        )

    # --- publish ---
    async def _publish_loop(self) -> None:
        delay = 0.1
        while True:
            batch = [await self._finished.get()]
            while not self._finished.empty():
                batch.append(self._finished.get_nowait())
            while True:
                try:
                    await self.queue.finish(batch)
                    break
                except REDIS_DOWN as e:
                    # Keep the results: they are posted when Redis answers again.
                    log.warning(
                        "posting %d results failed (%s); retrying in %.1fs", len(batch), e, delay
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            delay = 0.1
            for f in batch:
                self._posting.discard(f.job_id)
                self._finished.task_done()
