"""What a worker tells people: counts, metrics, the per-batch watermark line, memory snapshots.

No decisions are made here; the book and the executor report what happened and this turns
it into the counts the heartbeat and the closing line show (`Counts`), Prometheus series
(`inferq.shared.metrics.WorkerMetrics`), one log line per batch and, past
`INFERQ_SNAPSHOT_AT` on CUDA, a memory snapshot.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from inferq.shared.jobs import ErrorCode, Job, JobError, Status, now_ms
from inferq.shared.metrics import WorkerMetrics
from inferq.shared.schema import FINAL
from inferq.shared.settings import Settings
from inferq.worker.memory import SnapshotState, device_memory, footprint_bytes

log = logging.getLogger("inferq.worker")

FOOTPRINT_EVERY_S = 1.0  # how often a worker reads its footprint (NVML; the RSS on a CPU)
#: At most one batch line a second, with what ran since the last: at a GPU's rate a line a
#: batch is hundreds a second, for the log's reader and in the worker's CPU.
BATCH_LOG_EVERY_S = 1.0


@dataclass(slots=True)
class Counts:
    """What the heartbeat and the closing summary line show."""

    batches: int = 0
    items: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    jobs_expired: int = 0
    jobs_cancelled: int = 0
    jobs_poisoned: int = 0
    ooms: int = 0
    splits: int = 0
    lost: int = 0  # jobs taken over by another worker while this one was unresponsive
    last_batch_size: int = 0
    last_batch_tokens: int = 0
    last_batch_at_ms: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=4096))

    def items_per_s(self, window_s: float = 10.0) -> float:
        """Throughput over the last `window_s` (or since the first batch, if more recent)."""
        now = time.monotonic()
        recent = [(t, n) for t, n in self.recent if t >= now - window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(n for _, n in recent) / min(span, window_s)


@dataclass(frozen=True, slots=True)
class _Series:
    """This worker's labelled series, looked up once: `labels()` costs a couple of µs, and
    every job made three lookups and every batch seven."""

    batch_size: Histogram
    batch_tokens: Histogram
    job_queue: Histogram
    job_latency: Histogram
    finished: dict[Status, Counter]
    memory: tuple[Gauge, ...]

    @classmethod
    def of(cls, m: WorkerMetrics, model: str) -> _Series:
        return cls(
            batch_size=m.batch_size.labels(model=model),
            batch_tokens=m.batch_tokens.labels(model=model),
            job_queue=m.job_queue_seconds.labels(model=model),
            job_latency=m.job_latency_seconds.labels(model=model),
            finished={s: m.jobs_finished.labels(model=model, status=str(s)) for s in FINAL},
            memory=m.memory_series(),
        )


class Telemetry:
    def __init__(
        self,
        settings: Settings,
        model_name: str,
        device: str,
        metrics: WorkerMetrics | None,
        budget_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.model_name = model_name
        self.device = device
        self.metrics = metrics
        self.budget = budget_bytes  # this worker's share of INFERQ_MEMORY_BUDGET; 0: none
        self.memory = (0, 0, 0)  # allocated, reserved, total bytes at the last reading
        self.footprint = 0  # the process's device memory as nvidia-smi shows it
        self.counts = Counts()
        self._clock = clock
        self._footprint_at = float("-inf")
        self._logged_at = float("-inf")
        self._unlogged = (0, 0)  # batches, items since the last batch line
        self._snapshots: SnapshotState | None = None  # made on first use
        self._series = None if metrics is None else _Series.of(metrics, model_name)

    def read_memory(self) -> tuple[int, int, int]:
        """(allocated, reserved, total): on CUDA the allocator's counters, read each time
        (cheap; the snapshot trigger follows them batch by batch); NVML's footprint, and on
        a CPU the RSS (a /proc read, ~7 µs), at most once a second (`FOOTPRINT_EVERY_S`)."""
        cuda = self.device.startswith("cuda")
        if cuda:
            m = device_memory(self.device)
            self.memory = (m.allocated, m.reserved, m.total)
        if (now := self._clock()) - self._footprint_at >= FOOTPRINT_EVERY_S:
            self._footprint_at = now
            if cuda:  # NVML walks the device's process list
                self.footprint = footprint_bytes(self.device)
            else:
                m = device_memory(self.device)
                self.memory = (m.allocated, m.reserved, m.total)
                self.footprint = m.reserved  # the RSS
        return self.memory

    def on_batch(
        self, items: int, padded: int, ceiling: int, run_s: float, held: int, oldest_wait_s: float
    ) -> None:
        c = self.counts
        c.batches += 1
        c.items += items
        c.last_batch_size, c.last_batch_tokens, c.last_batch_at_ms = items, padded, now_ms()
        c.recent.append((time.monotonic(), items))
        alloc, reserved, total = self.read_memory()
        if self.metrics and self._series:
            m, series = self.metrics, self._series
            series.batch_size.observe(items)
            series.batch_tokens.observe(padded)
            m.batch_seconds.observe(run_s)
            m.token_ceiling.set(ceiling)
            memory = (alloc, reserved, total, self.footprint, self.budget)
            for gauge, value in zip(series.memory, memory, strict=True):
                gauge.set(value)
        batches, done = self._unlogged = (self._unlogged[0] + 1, self._unlogged[1] + items)
        now = self._clock()
        if now - self._logged_at >= BATCH_LOG_EVERY_S and log.isEnabledFor(logging.INFO):
            self._logged_at, self._unlogged = now, (0, 0)
            log.info(
                "batch items=%d tokens=%d/%d run_ms=%.1f mem=%.0f/%.0f/%.0fMiB (%.0f%%) "
                "footprint=%.0f/%sMiB held=%d oldest_wait_ms=%.0f (%d batches, %d items "
                "since the last line)",
                items,
                padded,
                ceiling,
                run_s * 1000,
                alloc / 2**20,
                reserved / 2**20,
                total / 2**20,
                100 * reserved / total if total else 0.0,
                self.footprint / 2**20,
                f"{self.budget / 2**20:.0f}" if self.budget else "-",
                held,
                oldest_wait_s * 1000,
                batches,
                done,
            )
        self._maybe_snapshot(reserved, total)

    def on_oom(self, after: int) -> None:
        self.counts.ooms += 1
        if self.metrics:
            self.metrics.oom.inc()
            self.metrics.token_ceiling.set(after)

    def on_split(self) -> None:
        self.counts.splits += 1
        if self.metrics:
            self.metrics.batch_splits.inc()

    def on_lost(self, jobs: int) -> None:
        self.counts.lost += jobs

    def on_forgotten(self) -> None:
        """A held job was made final elsewhere (expired in the queue): it ended here unrun."""
        self.counts.jobs_cancelled += 1

    def on_final(self, job: Job, status: Status, error: JobError | None, end_ms: int) -> None:
        c = self.counts
        if status is Status.SUCCEEDED:
            c.jobs_ok += 1
        elif status is Status.EXPIRED:
            c.jobs_expired += 1
        elif status is Status.CANCELLED:
            c.jobs_cancelled += 1
        else:
            c.jobs_failed += 1
            c.jobs_poisoned += error is not None and error.code == ErrorCode.POISONED
        if not self.metrics or not self._series:
            return
        series = self._series
        finished = series.finished.get(status)
        if finished is None:  # a status no job ends in today: looked up as it comes
            finished = self.metrics.jobs_finished.labels(model=self.model_name, status=str(status))
        finished.inc()
        if job.started_ms is not None:
            series.job_queue.observe(max(0, job.started_ms - job.created_ms) / 1000)
        series.job_latency.observe(max(0, end_ms - job.created_ms) / 1000)

    def _maybe_snapshot(self, reserved: int, total: int) -> None:
        at = self.settings.snapshot_at
        if at is None or not total or reserved / total < at:
            return
        from inferq.worker.memory import maybe_snapshot

        if self._snapshots is None:
            self._snapshots = SnapshotState()
        maybe_snapshot(self.device, reserved / total, self.settings, self._snapshots)
