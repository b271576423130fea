"""When to try a request again, and how long to wait first: a pure policy, no I/O, no clock.

Retried: no answer at all (refused, reset, timed out: `httpx.NetworkError`,
`TimeoutException`, `RemoteProtocolError`), 429 (admission refused it: the queue is full),
and 502/503/504 (a proxy or the API's Redis is down). Never retried: any other status, and a
429 that is a job's own end (`/v1/infer` answering an `expired` job, `/v1/embeddings`'s code
`expired`): asking again returns the same ended job.

Retrying a submit is safe because every logical call carries one Idempotency-Key on all its
attempts (`flows`): a retry after a lost answer gets the first job back, never a second one.

The wait before retry n (1, 2, ...) is exponential backoff capped at `cap_s`,
b = min(cap_s, base_s · 2^(n-1)), jittered so that clients refused together do not come back
together: "full" draws from [0, b], "equal" from [b/2, b]. A Retry-After of `r` seconds is a
floor, never a ceiling: the wait is min(cap_s, r + jittered b). A Retry-After beyond `cap_s`
is not waited for: the error goes to the caller at once, who can decide to wait that long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import httpx

from inferq.client.wire import Reply

Jitter = Literal["full", "equal"]
# Statuses that mean "not now" rather than "not this": the request itself was fine.
RETRY_STATUSES = frozenset((429, 502, 503, 504))
# Failures that happen before or during the exchange and say nothing about the request.
RETRY_ERRORS = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)
# 2**62 s is already past any cap; a larger exponent would overflow a float for nothing.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all (1 = never retry); backoff from `base_s` doubling up to `cap_s`.

    "equal" jitter (the default) keeps at least half of each backoff, so a 503 is never
    retried at once; "full" spreads a crowd wider at the price of some near-instant retries.
    """

    attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 30.0
    jitter: Jitter = "equal"

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(
                f"need 0 < base_s <= cap_s, not base_s={self.base_s} cap_s={self.cap_s}"
            )
        if self.jitter not in ("full", "equal"):
            raise ValueError(f"jitter is 'full' or 'equal', not {self.jitter!r}")

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """The jittered wait before retry number `retry` (1 for the first), ≤ cap_s."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(retry - 1, _MAX_EXPONENT))
        return rng.uniform(0.0 if self.jitter == "full" else ceiling / 2, ceiling)

    def delay_s(
        self, outcome: Reply | httpx.RequestError, attempt: int, rng: random.Random
    ) -> float | None:
        """Seconds to wait before trying again after attempt number `attempt` ended in
        `outcome`; None when the outcome goes to the caller as it is."""
        if attempt >= self.attempts or not retryable(outcome):
            return None
        backoff = self.backoff_s(attempt, rng)
        after = outcome.retry_after_s if isinstance(outcome, Reply) else None
        if after is None:
            return backoff
        if after > self.cap_s:
            return None
        return min(self.cap_s, after + backoff)


def retryable(outcome: Reply | httpx.RequestError) -> bool:
    """Whether trying the same request again can answer differently (module docstring)."""
    if isinstance(outcome, httpx.RequestError):
        return isinstance(outcome, RETRY_ERRORS)
    if outcome.status == 429 and (outcome.is_job or outcome.error_code == "expired"):
        return False
    return outcome.status in RETRY_STATUSES
