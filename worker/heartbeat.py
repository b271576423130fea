"""The worker's heartbeat and per-batch watermark line.

Every `heartbeat_s` a worker writes its record (`keys.worker(id)`, TTL `heartbeat_ttl_s`)
and its score in `keys.workers(model)`; the API reads both for readiness, /v1/health and
admission (throughput). The heartbeat also keeps held stream entries fresh so no other
worker takes them over, but only while the device is making progress: a batch stuck past
the visibility timeout stops the refresh, and the entries become claimable (guide #19).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from inferq.shared.jobs import now_ms
from inferq.shared.registry import WorkerBeat
from inferq.worker.memory import SnapshotState, device_memory

if TYPE_CHECKING:
    from inferq.worker.service import Worker

log = logging.getLogger("inferq.worker")


def _device_memory(device: str) -> tuple[int, int, int]:
    m = device_memory(device)
    return (m.allocated, m.reserved, m.total)


class Heartbeat:
    def __init__(self, worker: Worker, *, backend: str) -> None:
        self.w = worker
        self.backend = backend
        self.memory = (0, 0, 0)
        self.calibration = ""
        self._snapshots: SnapshotState | None = None  # made on first use

    def on_batch(self, items: int, padded: int, run_s: float) -> None:
        """The watermark line (one per batch) and the batch metrics."""
        w = self.w
        self.memory = _device_memory(w.device)
        alloc, reserved, total = self.memory
        oldest = w.batcher.oldest_arrival()
        if w.metrics:
            w.metrics.batch_seconds.observe(run_s)
            w.metrics.token_ceiling.set(w.ceiling.value)
            w.metrics.set_device_memory(alloc, reserved, total)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "batch items=%d tokens=%d/%d run_ms=%.1f mem=%.0f/%.0f/%.0fMiB (%.0f%%) held=%d oldest_wait_ms=%.0f",
                items, padded, w.ceiling.value, run_s * 1000, alloc / 2**20, reserved / 2**20,
                total / 2**20, 100 * reserved / total if total else 0.0, w.held_items(),
                0.0 if oldest is None else (time.monotonic() - oldest) * 1000,
            )  # fmt: skip
        self._maybe_snapshot(reserved, total)

    def _maybe_snapshot(self, reserved: int, total: int) -> None:
        at = self.w.settings.snapshot_at
        if at is None or not total or reserved / total < at:
            return
        from inferq.worker.memory import maybe_snapshot

        if self._snapshots is None:
            self._snapshots = SnapshotState()
        maybe_snapshot(self.w.device, reserved / total, self.w.settings, self._snapshots)

    async def loop(self) -> None:
        from inferq.worker.service import REDIS_DOWN

        while True:
            try:
                await self.beat()
            except REDIS_DOWN as e:  # the consume loop reconnects; beats resume after
                log.debug("heartbeat skipped: %s", e)
            await asyncio.sleep(self.w.settings.heartbeat_s)

    def record(self) -> WorkerBeat:
        w, s = self.w, self.w.stats
        alloc, reserved, total = self.memory
        return WorkerBeat(
            id=w.consumer, host=socket.gethostname(), pid=os.getpid(), model=w.model_name,
            backend=self.backend, device=w.device, token_ceiling=w.ceiling.value,
            items_per_s=round(s.items_per_s(), 2), last_batch_size=s.last_batch_size,
            last_batch_tokens=s.last_batch_tokens, last_batch_at_ms=s.last_batch_at_ms,
            batches=s.batches, ooms=s.ooms, held_items=w.held_items(), beat_ms=now_ms(),
            mem_allocated=alloc, mem_reserved=reserved, mem_total=total,
            calibration=self.calibration, ceiling_reason=w.ceiling_reason,
        )  # fmt: skip

    async def beat(self) -> None:
        w = self.w
        ttl_ms = int(w.settings.heartbeat_ttl_s * 1000)
        if not w.batch_starts:
            self.memory = _device_memory(w.device)
        oldest = min(w.batch_starts.values(), default=None)
        stuck = oldest is not None and time.monotonic() - oldest > w.settings.visibility_timeout_s
        held: dict[str, list[str]] = {}
        for st in list(w.jobs.values()) + list(w.solo):
            held.setdefault(st.entry.stream, []).append(st.entry.entry_id)
        await w.registry.beat(self.record(), ttl_ms, None if stuck else held)
        if stuck:
            log.error(
                "batch running for over %.0fs: no longer refreshing held entries",
                w.settings.visibility_timeout_s,
            )

    async def unregister(self) -> None:
        await self.w.registry.unregister(self.w.consumer, self.w.model_name)
