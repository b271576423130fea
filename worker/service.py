"""The worker: Redis → batcher → model → Redis, as three tasks joined by bounded queues.

- consume: XREADGROUP (own PEL first, then new entries) → claim jobs → prepare items →
  batcher. It stops reading while `prefetch_limit` items are held, so one worker never
  hoards the queue and the rest stays claimable by other workers.
- run: the batcher decides when a batch is due; the model runs in one dedicated thread
  so the event loop (reads, publishing, heartbeats) stays live during device work.
- publish: finished jobs are written, announced and acked in one pipelined round trip.
  If Redis is down, results are kept and posted when it is back.

Every item gets exactly one outcome: a failing batch is split until the guilty item is
alone, and only that item's job fails (`model_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.jobs import Job, JobError, Status, encode_final, now_ms
from shared.queue import Entry, Final, JobQueue
from shared.settings import Settings
from worker.batcher import Batch, Batcher, Item
from worker.models.base import Model, ModelError

log = logging.getLogger("inferq.worker")

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


@dataclass(eq=False, slots=True)
class JobState:
    """One job held by this worker until its last item has an outcome."""

    job: Job
    entry_id: str
    remaining: int
    outputs: np.ndarray | None = None
    error: JobError | None = None
    batch_size: int = 0
    batch_tokens: int = 0


@dataclass(slots=True)
class Stats:
    batches: int = 0
    items: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    splits: int = 0
    last_batch_size: int = 0
    last_batch_tokens: int = 0
    last_batch_at_ms: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=512))

    def items_per_s(self, window_s: float = 10.0) -> float:
        cutoff = time.monotonic() - window_s
        return sum(n for t, n in self.recent if t >= cutoff) / window_s


class Worker:
    def __init__(
        self, settings: Settings, model: Model, model_name: str, redis: Redis, *, device: str
    ) -> None:
        self.settings = settings
        self.model = model
        self.model_name = model_name
        self.device = device
        self.queue = JobQueue(redis, result_ttl_s=settings.result_ttl_s)
        self.redis = redis
        self.consumer = settings.consumer_name(device, model_name)
        self.batcher = Batcher(
            settings.max_batch_tokens, settings.max_batch_size, settings.max_wait_ms / 1000
        )
        self.stats = Stats()
        self.jobs: dict[str, JobState] = {}
        # bound: one model thread; a second would only contend for the same device.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inferq-model")
        self._wake = asyncio.Event()  # new items, or stop
        self._room = asyncio.Event()  # prefetch room freed
        # unbounded on purpose: finished results must never be dropped or block the device.
        self._finished: asyncio.Queue[Final] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._running_items = 0

    # --- lifecycle ---
    def stop(self) -> None:
        """Stop pulling; what is held is finished and posted, then `run` returns."""
        if not self._stopping.is_set():
            log.info("stopping: no new reads, finishing %d held items", len(self.batcher))
        self._stopping.set()
        self._wake.set()
        self._room.set()

    async def run(self) -> None:
        started = time.monotonic()
        await self._retry_redis(self.queue.ensure_group, self.model_name)
        log.info(
            "worker %s serving model=%s device=%s max_batch_tokens=%d max_batch_size=%d max_wait_ms=%g",
            self.consumer, self.model_name, self.device, self.batcher.max_batch_tokens,
            self.batcher.max_batch_size, self.settings.max_wait_ms,
        )  # fmt: skip
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        publisher = asyncio.create_task(self._publish_loop(), name="publish")
        consumer = asyncio.create_task(self._consume_loop(), name="consume")
        runner = asyncio.create_task(self._run_loop(), name="run")
        try:
            # A task that dies must take the worker down (and its heartbeat with it), never
            # leave a process that looks alive but no longer reads or publishes.
            done, _ = await asyncio.wait(
                {heartbeat, publisher, consumer, runner}, return_when=asyncio.FIRST_EXCEPTION
            )
            for t in done:
                if t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            await runner
            await consumer
            await self._finished.join()
        finally:
            runner.cancel()
            for t in (consumer, publisher, heartbeat):
                t.cancel()
            await asyncio.gather(consumer, publisher, heartbeat, return_exceptions=True)
            with contextlib.suppress(*REDIS_DOWN):
                await self._unregister()
            self._executor.shutdown(wait=True)
        s = self.stats
        log.info(
            "worker %s stopped after %.1fs: batches=%d items=%d jobs_ok=%d jobs_failed=%d splits=%d unposted=%d",
            self.consumer, time.monotonic() - started, s.batches, s.items, s.jobs_done,
            s.jobs_failed, s.splits, self._finished.qsize(),
        )  # fmt: skip

    async def _retry_redis(self, fn: Any, *args: Any) -> Any:
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
    def _held_items(self) -> int:
        return len(self.batcher) + self._running_items

    async def _consume_loop(self) -> None:
        pending = True  # start with our own PEL: entries delivered before a crash or reconnect
        delay = 0.1
        count = max(1, self.settings.max_batch_size)
        while not self._stopping.is_set():
            if self._held_items() >= self.settings.prefetch_limit:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                entries = await self.queue.read(
                    self.model_name, self.consumer, count=count,
                    block_ms=self.settings.read_block_ms, pending=pending,
                )  # fmt: skip
                if pending and not entries:
                    pending = False
                    continue
                if pending:
                    # Entries we already hold come back on a PEL re-read; skip them.
                    entries = [e for e in entries if e.job_id not in self.jobs]
                    if not entries:
                        pending = False
                        continue
                await self._admit(entries)
                delay = 0.1
            except REDIS_DOWN as e:
                log.warning("redis read failed (%s); reconnecting in %.1fs", e, delay)
                pending = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                log.warning("stream or group vanished; recreating")
                await asyncio.sleep(delay)  # NOGROUP answers instantly: never hot-loop on it
                delay = min(delay * 2, 5.0)
                with contextlib.suppress(*REDIS_DOWN):
                    await self.queue.ensure_group(self.model_name)

    async def _admit(self, entries: list[Entry]) -> None:
        jobs = await self.queue.claim([e.job_id for e in entries], now_ms())
        stale: list[str] = []
        arrived = time.monotonic()
        for entry, job in zip(entries, jobs, strict=True):
            if job is None or job.status.is_final:
                stale.append(entry.entry_id)  # record expired, or a duplicate delivery
                continue
            if job.id in self.jobs:
                continue
            try:
                prepared = self.model.prepare(job.inputs)
                if len(prepared) != len(job.inputs) or any(
                    not isinstance(p.cost, int) or p.cost < 1 for p in prepared
                ):
                    raise ModelError(
                        "prepare() must return one item per input, each with cost >= 1"
                    )
            except Exception as e:  # a bad input fails its own job before it reaches a batch
                error = JobError("model_error", f"{type(e).__name__}: {e}")
                self._finalize(JobState(job, entry.entry_id, 0, error=error))
                continue
            state = JobState(job, entry.entry_id, remaining=len(prepared))
            if not prepared:
                state.outputs = np.empty((0, self.model.dim), dtype=np.float32)
                self._finalize(state)
                continue
            self.jobs[job.id] = state
            for i, p in enumerate(prepared):
                self.batcher.add(Item(key=(state, i, p.payload), cost=p.cost, arrived=arrived))
        if stale:
            await self.queue.ack(self.model_name, stale)
        self._wake.set()

    # --- run ---
    async def _run_loop(self) -> None:
        while True:
            now = time.monotonic()
            stopping = self._stopping.is_set()
            batch = self.batcher.next_batch(now, force=stopping)
            if batch is None:
                if stopping:
                    return
                due = self.batcher.due_at()
                self._wake.clear()
                timeout = None if due is None else max(0.0, due - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            await self._run_batch(batch)

    async def _run_batch(self, batch: Batch) -> None:
        live = [it for it in batch.items if it.key[0].error is None]
        self._running_items = len(live)
        try:
            await self._run_items(live, queue_depth=len(self.batcher))
        finally:
            self._running_items = 0
            self._room.set()

    async def _run_items(self, items: list[Item], *, queue_depth: int) -> None:
        if not items:
            return
        padded = len(items) * max(it.cost for it in items)
        payloads = [it.key[2] for it in items]
        t0 = time.perf_counter()
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.model.run, payloads
            )
            out = np.asarray(out, dtype=np.float32)
            if out.ndim != 2 or out.shape[0] != len(items):
                raise ModelError(
                    f"model returned {out.shape} for {len(items)} inputs: return one row per input"
                )
        except Exception as e:
            if len(items) == 1:
                state = items[0].key[0]
                log.warning(
                    "job %s failed: model error on item %d: %r", state.job.id, items[0].key[1], e
                )
                self._fail(state, JobError("model_error", f"{type(e).__name__}: {e}"))
                return
            self.stats.splits += 1
            half = len(items) // 2
            log.info(
                "batch of %d failed (%s); splitting to isolate the bad item",
                len(items),
                type(e).__name__,
            )
            await self._run_items(items[:half], queue_depth=queue_depth)
            await self._run_items(
                [it for it in items[half:] if it.key[0].error is None], queue_depth=queue_depth
            )
            return
        run_ms = (time.perf_counter() - t0) * 1000
        self._scatter(items, out, padded)
        oldest = self.batcher.oldest_arrival()
        log.debug(
            "batch items=%d tokens=%d/%d run_ms=%.1f held=%d oldest_wait_ms=%.0f",
            len(items), padded, self.batcher.max_batch_tokens, run_ms, queue_depth,
            0.0 if oldest is None else (time.monotonic() - oldest) * 1000,
        )  # fmt: skip

    def _scatter(self, items: list[Item], out: np.ndarray, padded: int) -> None:
        s = self.stats
        s.batches += 1
        s.items += len(items)
        s.last_batch_size, s.last_batch_tokens, s.last_batch_at_ms = len(items), padded, now_ms()
        s.recent.append((time.monotonic(), len(items)))
        for row, it in zip(out, items, strict=True):
            state, index, _ = it.key
            if state.error is not None:
                continue
            if state.outputs is None:
                state.outputs = np.empty((len(state.job.inputs), out.shape[1]), dtype=np.float32)
            state.outputs[index] = row
            state.batch_size = max(state.batch_size, len(items))
            state.batch_tokens = max(state.batch_tokens, padded)
            state.remaining -= 1
            if state.remaining == 0:
                self._finalize(state)

    def _fail(self, state: JobState, error: JobError) -> None:
        if state.error is not None or state.job.id not in self.jobs:
            return
        state.error = error
        self.batcher.remove(lambda it: it.key[0] is state)  # its other items never run
        self._finalize(state)

    def _finalize(self, state: JobState) -> None:
        self.jobs.pop(state.job.id, None)
        if state.error is None:
            self.stats.jobs_done += 1
            fields = encode_final(
                Status.SUCCEEDED, finished_ms=now_ms(), outputs=state.outputs,
                batch_size=state.batch_size, batch_tokens=state.batch_tokens,
            )  # fmt: skip
        else:
            self.stats.jobs_failed += 1
            fields = encode_final(
                Status.FAILED, finished_ms=now_ms(), error=state.error,
                batch_size=state.batch_size, batch_tokens=state.batch_tokens,
            )  # fmt: skip
        self._finished.put_nowait(Final(self.model_name, state.entry_id, state.job.id, fields))

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
            for _ in batch:
                self._finished.task_done()

    # --- heartbeat ---
    async def _heartbeat_loop(self) -> None:
        while True:
            with contextlib.suppress(*REDIS_DOWN):
                await self._beat()
            await asyncio.sleep(self.settings.heartbeat_s)

    async def _beat(self) -> None:
        ttl_ms = int(self.settings.heartbeat_ttl_s * 1000)
        now = now_ms()
        record = {
            "id": self.consumer, "host": socket.gethostname(), "pid": os.getpid(),
            "model": self.model_name, "device": self.device,
            "token_ceiling": self.batcher.max_batch_tokens,
            "items_per_s": round(self.stats.items_per_s(), 2),
            "last_batch_size": self.stats.last_batch_size,
            "last_batch_tokens": self.stats.last_batch_tokens,
            "last_batch_at_ms": self.stats.last_batch_at_ms,
            "batches": self.stats.batches, "held_items": self._held_items(), "beat_ms": now,
        }  # fmt: skip
        async with self.redis.pipeline(transaction=False) as p:
            p.hset(keys.worker(self.consumer), mapping={k: str(v) for k, v in record.items()})
            p.pexpire(keys.worker(self.consumer), ttl_ms)
            p.zadd(keys.workers(self.model_name), {self.consumer: now + ttl_ms})
            p.zremrangebyscore(keys.workers(self.model_name), "-inf", now)
            held = [s.entry_id for s in self.jobs.values()]
            if held:
                # Keep held entries fresh so a visibility-timeout reclaim never steals a
                # batch that is merely slow; JUSTID does not bump the delivery count.
                p.xclaim(
                    keys.stream(self.model_name), keys.GROUP, self.consumer, 0, held, justid=True
                )
            await p.execute()

    async def _unregister(self) -> None:
        async with self.redis.pipeline(transaction=False) as p:
            p.delete(keys.worker(self.consumer))
            p.zrem(keys.workers(self.model_name), self.consumer)
            await p.execute()
