"""The worker's two clocks, passed in so tests can drive time instead of waiting for it.

`monotonic()` (seconds) orders and times things inside one process: batch waits, run times,
the take-over schedule, stuck batches. `now_ms()` (wall milliseconds) is what job records
carry: created, started and finished times and deadlines, compared across processes.
"""

from __future__ import annotations

import time
from typing import Protocol

from inferq.shared.jobs import now_ms


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now_ms(self) -> int: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now_ms(self) -> int:
        return now_ms()
