"""Per-target fairness for webhook delivery: a limit on attempts in flight and a circuit
breaker per target, so a dead or slow receiver costs its own deliveries, not everyone's.

A target is the scheme, host and port of a webhook URL (`target_of`): what one receiver
(and one tarpit) is. Each API process keeps its own `Targets`; nothing here is shared.

One target's circuit:

    closed ──(`failures` failed attempts in a row)──▶ open
      ▲                                                │ `cooldown_s` passed
      │                                                ▼
      └─────────(the probe reaches the target)──── half-open: one probe attempt
                                                       │ the probe fails
                                                       └──▶ open again (a new cooldown)

A failed attempt is a timeout or a connection error (`Outcome.target_ok`): what holds a
delivery slot for a whole attempt budget, and what the breaker exists to stop. Any HTTP
answer, 5xx included, came back and shows the target alive, closing its circuit: a receiver
that answers 500 to some attempts gets them retried on each delivery's own backoff, not
cut off for `cooldown_s` (five quick 500s once held every delivery 30 s per probe). An
attempt that made no request (the SSRF guard refused the URL, no signing key) tells nothing
either way.

`admit` never waits: it answers a `Ticket` (attempt now, give it back with `release`) or a
`Defer` (how long to put the delivery aside). The dispatcher puts a deferred delivery back
in the retry zset for that long, its attempts unchanged, so the slot it held serves another
target at once. Deferrals are not hot and do not starve the target:

- circuit open: until the cooldown ends, spread over one attempt budget after it (when
  the probe has decided);
- probe in flight: until the probe's budget ends, spread the same way;
- at its limit: a place in a virtual queue: the n-th delivery deferred behind a busy target
  comes back after about n / `per_target` of the target's recent attempt time, so returns
  arrive at the pace the target absorbs them, not all at once;
- never longer than `cooldown_s` + one attempt budget, so a recovered target gets its
  deliveries back within that.

Pure: no I/O, no clock of its own (`now` is monotonic seconds, passed in), so the tests
drive every state with plain numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import httpx

State = Literal["closed", "open", "half-open"]
Why = Literal["busy", "open", "probing"]

MIN_DEFER_S = 0.1  # the shortest deferral: a target at its limit never makes a hot loop
LATENCY_PRIOR_S = 0.1  # a target's attempt time before one has finished
EWMA = 0.2  # weight of the latest attempt in the target's attempt time


def target_of(url: str) -> str:
    """`scheme://host:port` of `url` (default ports filled in); the URL itself when it does
    not parse (its attempt is refused, and it shares its circuit with nobody)."""
    try:
        u = httpx.URL(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        return f"{u.scheme}://{u.raw_host.decode('ascii').lower()}:{port}"
    except (httpx.InvalidURL, ValueError, TypeError):
        return url


@dataclass(frozen=True, slots=True)
class Ticket:
    """Leave for one attempt to `target`; give it back with `Targets.release`."""

    target: str
    started: float
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Defer:
    """Do not attempt now: put the delivery aside for `delay_s`."""

    target: str
    delay_s: float
    why: Why

    @property
    def reason(self) -> str:
        return {
            "busy": "at INFERQ_WEBHOOK_PER_TARGET attempts in flight",
            "open": "circuit open after failed attempts",
            "probing": "circuit half-open, a probe attempt in flight",
        }[self.why]


@dataclass(slots=True)
class Circuit:
    """One target's state in this process."""

    inflight: int = 0
    failures: int = 0  # failed attempts in a row
    opened_at: float | None = None  # open (or half-open, once the cooldown has passed)
    probe_started: float | None = None  # half-open with its probe in flight
    latency_s: float | None = None  # recent attempt time (EWMA)
    queue_until: float = 0.0  # the virtual queue's end: when the last deferral comes back
    touched: float = 0.0


class Targets:
    """The limit and the breaker of every target this process delivers to."""

    def __init__(
        self,
        per_target: int,
        failures: int,
        cooldown_s: float,
        budget_s: float,
        rng: random.Random | None = None,
    ) -> None:
        """`budget_s`: the most one attempt takes (`contract.attempt_budget_s`)."""
        self.per_target, self.failures, self.cooldown_s = per_target, failures, cooldown_s
        self.budget_s = budget_s
        self.max_defer_s = cooldown_s + budget_s
        self._rng = rng or random.Random()
        self._circuits: dict[str, Circuit] = {}

    def __len__(self) -> int:
        return len(self._circuits)

    def state(self, target: str, now: float) -> State:
        c = self._circuits.get(target)
        if c is None or c.opened_at is None:
            return "closed"
        return "open" if now < c.opened_at + self.cooldown_s else "half-open"

    def admit(self, target: str, now: float) -> Ticket | Defer:
        """A ticket to attempt `target` now, or how long to defer the delivery."""
        c = self._circuits.setdefault(target, Circuit())
        c.touched = now
        if c.opened_at is not None and now < c.opened_at + self.cooldown_s:
            return self._defer(target, c.opened_at + self.cooldown_s - now, "open")
        if c.probe_started is not None and c.opened_at is not None:
            return self._defer(target, c.probe_started + self.budget_s - now, "probing")
        if c.inflight >= self.per_target:
            return self._queue(target, c, now)
        c.inflight += 1
        if c.opened_at is not None:  # half-open: this attempt is the one probe
            c.probe_started = now
            return Ticket(target, now, probe=True)
        return Ticket(target, now)

    def release(self, ticket: Ticket, ok: bool | None, now: float) -> State | None:
        """The attempt of `ticket` ended: `ok` as `Outcome.target_ok`. Returns the circuit's
        new state when this changed it (to log), else None."""
        c = self._circuits.setdefault(ticket.target, Circuit())
        c.inflight = max(0, c.inflight - 1)
        c.touched = now
        if ticket.probe:
            c.probe_started = None
        if ok is None:
            return None
        took = now - ticket.started
        c.latency_s = took if c.latency_s is None else (1 - EWMA) * c.latency_s + EWMA * took
        was_open = c.opened_at is not None
        if ok:
            c.failures, c.opened_at = 0, None
            if was_open:
                c.queue_until = now  # the queue was sized for a broken target
            return "closed" if was_open else None
        c.failures += 1
        if (not was_open and c.failures >= self.failures) or (was_open and ticket.probe):
            c.opened_at = now  # opened, or a failed probe: a new cooldown
            return "open"
        return None

    def sweep(self, now: float) -> int:
        """Forget targets idle for twice the longest deferral (nothing of theirs can still be
        coming back); how many were forgotten. Bounds memory by the targets in use."""
        horizon = 2 * self.max_defer_s
        idle = [
            t for t, c in self._circuits.items() if not c.inflight and now - c.touched > horizon
        ]
        for t in idle:
            del self._circuits[t]
        return len(idle)

    def _defer(self, target: str, until_s: float, why: Why) -> Defer:
        # Spread the returns over one attempt budget: they then find the probe decided.
        delay = max(until_s, MIN_DEFER_S) + self._rng.uniform(0, self.budget_s)
        return Defer(target, min(delay, self.max_defer_s), why)

    def _queue(self, target: str, c: Circuit, now: float) -> Defer:
        """A place in the target's virtual queue: each deferral comes back one share of the
        target's attempt time after the one before, as `per_target` attempts finish."""
        share = (c.latency_s if c.latency_s is not None else LATENCY_PRIOR_S) / self.per_target
        c.queue_until = min(max(now, c.queue_until) + share, now + self.max_defer_s)
        delay = min(max(c.queue_until - now, MIN_DEFER_S), self.max_defer_s)
        return Defer(target, delay, "busy")
