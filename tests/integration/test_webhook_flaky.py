"""A flaky receiver gets every delivery on its backoff schedule: real API and worker
processes, a receiver on 127.0.0.1 that answers 500 to the first two attempts of each
delivery and 200 after.

With the breaker counting 5xx answers, five quick 500s opened the receiver's circuit and
then one probe went out per 30 s cooldown: none of five jobs was delivered within 120 s.
Prompt answers are the delivery's to retry; only what holds slots (timeouts, connection
errors) opens the circuit. The breaker keeps its defaults here.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from inferq.shared import keys
from tests.integration.receivers import HookServer
from tests.integration.stack import Stack, wait_for

JOBS = 5
FAILS_PER_DELIVERY = 2
# Backoff 1 s base, doubling, equal jitter: at most 1 + 2 s between the three attempts.
WITHIN_S = 10.0
SETTINGS = {"webhook_secret": "whsec-flaky", "webhook_allow": "127.0.0.1"}


class FlakyReceiver:
    """500 to the first FAILS_PER_DELIVERY attempts of each delivery (by its delivery id),
    200 after; records (delivery id, status, monotonic time) per attempt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: collections.Counter[str] = collections.Counter()
        self.attempts: list[tuple[str, int, float]] = []
        self.hook = HookServer(self._answer)

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        delivery = {k.lower(): v for k, v in headers.items()}["x-inferq-delivery"]
        with self.lock:
            self.seen[delivery] += 1
            status = 500 if self.seen[delivery] <= FAILS_PER_DELIVERY else 200
            self.attempts.append((delivery, status, time.monotonic()))
        return status

    @property
    def url(self) -> str:
        return self.hook.url()

    def delivered(self) -> dict[str, int]:
        """Delivery id → how many 200s it got."""
        with self.lock:
            return dict(collections.Counter(d for d, s, _ in self.attempts if s == 200))

    def close(self) -> None:
        self.hook.close()


@pytest.fixture
def flaky() -> Iterator[FlakyReceiver]:
    r = FlakyReceiver()
    yield r
    r.close()


def test_a_receiver_failing_the_first_attempts_gets_every_delivery_on_schedule(
    stack: Stack, flaky: FlakyReceiver
) -> None:
    stack.worker()
    base = stack.api(**SETTINGS)
    t0 = time.monotonic()
    for i in range(JOBS):
        body = {"input": f"job {i}", "webhook": {"url": flaky.url}}
        r = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 202, r.text
    wait_for(lambda: len(flaky.delivered()) == JOBS, WITHIN_S, f"{JOBS} deliveries")
    took_s = time.monotonic() - t0
    print(f"{JOBS} deliveries to a receiver failing 2 attempts each: all in {took_s:.1f}s")
    # Exactly once each: settled (nothing in the stream, nothing left to retry), and no
    # attempt after its 200.
    wait_for(
        lambda: (
            stack.r.xlen(keys.webhooks("echo")) == 0
            and stack.r.zcard(keys.webhook_retry("echo")) == 0
        ),
        10,
        "every delivery settled",
    )
    assert flaky.delivered() == {d: 1 for d in flaky.delivered()}
    with flaky.lock:
        per_delivery = collections.Counter(d for d, _, _ in flaky.attempts)
    assert set(per_delivery.values()) == {FAILS_PER_DELIVERY + 1}
