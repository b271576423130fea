"""When several batches may run at once: how big the next one may be, and how long it waits.

Pure logic, no I/O. The worker sets the batcher's `max_batch_size` and `max_wait_s` from
`limits` before each call (they are read live).

With nothing running, the device is idle: the configured bounds apply and a batch starts
after the configured wait (0 by default: at once). With another batch already running, a
free stream that started at once would take whatever few items had arrived: under a closed
loop of 32 clients on 2 one-thread streams, batches settled at ~6.5 items, where one thread
does ~115 items/s against ~160 at 16 (2-core box, traced minilm, short sentences). So while
other batches run, the next one is due when it holds its share of the batch size
(max_batch_size / streams), or when its oldest item has waited a quarter of a recent batch's
run time; at most that share plus the wait, latency stays well inside one batch's run.
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_WAIT_SHARE = 0.25  # of the recent batch run time


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_size: int
    max_wait_s: float


def limits(
    running: int, streams: int, max_batch_size: int, max_wait_s: float, recent_run_s: float
) -> Limits:
    """Bounds for the next batch, with `running` of `streams` batches on the device now."""
    if running <= 0 or streams <= 1:
        return Limits(max_batch_size, max_wait_s)
    share = max(1, max_batch_size // streams)
    return Limits(share, max(max_wait_s, BUSY_WAIT_SHARE * max(0.0, recent_run_s)))


def smooth(previous_s: float, run_s: float, weight: float = 0.2) -> float:
    """Exponentially weighted recent run time (the first batch sets it)."""
    return run_s if previous_s <= 0 else previous_s + weight * (run_s - previous_s)
