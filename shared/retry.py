"""The one backoff schedule for reconnect and re-post loops: 0.1 s doubling to 5 s.

redis-py's `ExponentialBackoff` computes the delay; this keeps the failure count beside it
so a loop only says `delay = backoff.next()` after a failure and `backoff.reset()` after a
success. No jitter: each loop retries one local Redis, there is no herd to spread.
"""

from __future__ import annotations

from redis.backoff import ExponentialBackoff

BASE_S = 0.1
CAP_S = 5.0


class Backoff:
    def __init__(self, base_s: float = BASE_S, cap_s: float = CAP_S) -> None:
        self._schedule = ExponentialBackoff(cap=cap_s, base=base_s)
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try (seconds), counting this failure."""
        delay = self._schedule.compute(self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
