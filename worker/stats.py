"""Counters a worker keeps for its heartbeat and its closing summary line."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inferq.shared.jobs import JobError, Status, now_ms


@dataclass(slots=True)
class Stats:
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

    def on_batch(self, items: int, padded: int) -> None:
        self.batches += 1
        self.items += items
        self.last_batch_size, self.last_batch_tokens, self.last_batch_at_ms = (
            items,
            padded,
            now_ms(),
        )
        self.recent.append((time.monotonic(), items))

    def on_job(self, status: Status, error: JobError | None) -> None:
        if status is Status.SUCCEEDED:
            self.jobs_ok += 1
        elif status is Status.EXPIRED:
            self.jobs_expired += 1
        elif status is Status.CANCELLED:
            self.jobs_cancelled += 1
        else:
            self.jobs_failed += 1
            if error is not None and error.code == "poisoned":
                self.jobs_poisoned += 1

    def items_per_s(self, window_s: float = 10.0) -> float:
        """Throughput over the last `window_s` (or since the first batch, if more recent)."""
        now = time.monotonic()
        recent = [(t, n) for t, n in self.recent if t >= now - window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(n for _, n in recent) / min(span, window_s)
