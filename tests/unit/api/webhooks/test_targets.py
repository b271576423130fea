"""The per-target limit and circuit breaker (`webhooks.targets`) with plain numbers for the
clock: every state and every deferral, no sleeps, no sockets."""

from __future__ import annotations

import random

import pytest

from inferq.api.webhooks.contract import outcome_of
from inferq.api.webhooks.targets import (
    LATENCY_PRIOR_S,
    MIN_DEFER_S,
    Defer,
    Targets,
    Ticket,
    target_of,
)

A, B = "https://a.example:443", "https://b.example:443"
COOLDOWN_S, BUDGET_S = 30.0, 4.0


def _targets(per_target: int = 2, failures: int = 3) -> Targets:
    return Targets(per_target, failures, COOLDOWN_S, BUDGET_S, random.Random(1))


def _ticket(t: Targets, target: str, now: float) -> Ticket:
    got = t.admit(target, now)
    assert isinstance(got, Ticket), got
    return got


def _defer(t: Targets, target: str, now: float) -> Defer:
    got = t.admit(target, now)
    assert isinstance(got, Defer), got
    return got


def _fail(t: Targets, target: str, now: float, n: int) -> None:
    for _ in range(n):
        t.release(_ticket(t, target, now), False, now + 1)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://Hooks.Example/in?token=x", "https://hooks.example:443"),
        ("https://hooks.example:443/other", "https://hooks.example:443"),
        ("http://hooks.example/in", "http://hooks.example:80"),
        ("http://hooks.example:8080/in", "http://hooks.example:8080"),
        ("http://[::1]:9/x", "http://::1:9"),
        ("http://127.0.0.1:9/x", "http://127.0.0.1:9"),
    ],
)
def test_a_target_is_scheme_host_and_port(url: str, target: str) -> None:
    assert target_of(url) == target  # never the path or query: they may carry a token


def test_at_most_per_target_attempts_in_flight_and_other_targets_unaffected() -> None:
    t = _targets(per_target=2)
    first, second = _ticket(t, A, 0.0), _ticket(t, A, 0.0)
    busy = _defer(t, A, 0.0)
    assert busy.why == "busy" and busy.target == A and "PER_TARGET" in busy.reason
    assert all(isinstance(t.admit(B, 0.0), Ticket) for _ in range(2))  # B has its own limit
    t.release(first, True, 0.5)
    _ticket(t, A, 0.5)  # a slot came back
    _defer(t, A, 0.5)
    t.release(second, None, 0.6)  # an attempt that made no request frees its slot too
    _ticket(t, A, 0.6)


def test_deferrals_behind_a_busy_target_queue_up_at_its_pace() -> None:
    """The n-th delivery deferred behind a busy target comes back about n / per_target of
    its attempt time later: returns arrive as slots free up, not all at once (no hot loop),
    and never later than cooldown + one budget (no starvation)."""
    t = _targets(per_target=4)
    for _ in range(4):
        _ticket(t, A, 0.0)
    prior = [_defer(t, A, 0.0).delay_s for _ in range(8)]
    assert prior[0] == MIN_DEFER_S  # the floor: never sooner
    assert prior[-1] == pytest.approx(8 * LATENCY_PRIOR_S / 4)
    assert prior == sorted(prior)
    # Once attempts are seen to take 2 s, each deferral is one more 0.5 s behind.
    slow = _targets(per_target=4)
    for _ in range(4):
        slow.release(_ticket(slow, B, 0.0), True, 2.0)
    for _ in range(4):
        _ticket(slow, B, 2.0)
    delays = [_defer(slow, B, 2.0).delay_s for _ in range(200)]
    assert delays[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert max(delays) == COOLDOWN_S + BUDGET_S  # the cap
    # Time passing shortens the queue: a deferral later on waits for what is left of it.
    assert _defer(slow, B, 2.0 + 10).delay_s == COOLDOWN_S + BUDGET_S - 10 + 0.5


def test_breaker_opens_after_consecutive_failures_only() -> None:
    t = _targets(per_target=8, failures=3)
    _fail(t, A, 0.0, 2)
    t.release(_ticket(t, A, 0.0), True, 1.0)  # an answer resets the count
    _fail(t, A, 1.0, 2)
    assert t.state(A, 2.0) == "closed"
    ticket = _ticket(t, A, 2.0)
    t.release(_ticket(t, A, 2.0), None, 2.5)  # no request made: counts for nothing
    assert t.state(A, 2.5) == "closed"
    assert t.release(ticket, False, 3.0) == "open"
    assert t.state(A, 3.0) == "open" and t.state(B, 3.0) == "closed"
    assert isinstance(t.admit(B, 3.0), Ticket)  # other targets go on


def test_an_open_circuit_defers_until_its_cooldown_then_one_probe_decides() -> None:
    t = _targets(per_target=8, failures=3)
    _fail(t, A, 0.0, 3)  # opened at 1.0
    while_open = [_defer(t, A, 1.0 + s) for s in (0.0, 10.0, 29.0)]
    for s, d in zip((0.0, 10.0, 29.0), while_open, strict=True):
        remaining = COOLDOWN_S - s
        assert d.why == "open" and remaining <= d.delay_s <= remaining + BUDGET_S
    assert max(d.delay_s for d in while_open) <= COOLDOWN_S + BUDGET_S
    # Cooldown over: half-open. One probe goes; the rest wait for it, not for a cooldown.
    now = 1.0 + COOLDOWN_S
    assert t.state(A, now) == "half-open"
    probe = _ticket(t, A, now)
    assert probe.probe
    waiting = _defer(t, A, now + 1)
    assert waiting.why == "probing" and BUDGET_S - 1 <= waiting.delay_s <= 2 * BUDGET_S - 1
    # The probe fails: open again, a fresh cooldown from now.
    assert t.release(probe, False, now + 2) == "open"
    assert t.state(A, now + 2 + COOLDOWN_S - 0.1) == "open"
    later = now + 2 + COOLDOWN_S
    probe = _ticket(t, A, later)
    assert probe.probe and t.release(probe, True, later + 0.1) == "closed"
    assert t.state(A, later + 0.1) == "closed"
    assert all(isinstance(t.admit(A, later + 0.1), Ticket) for _ in range(8))  # all slots back


def test_a_probe_that_makes_no_request_lets_the_next_one_go() -> None:
    t = _targets(per_target=8, failures=1)
    _fail(t, A, 0.0, 1)
    now = 1.0 + COOLDOWN_S
    probe = _ticket(t, A, now)
    assert t.release(probe, None, now) is None and t.state(A, now) == "half-open"
    assert _ticket(t, A, now).probe


def test_late_answers_of_attempts_started_before_the_circuit_opened() -> None:
    """Attempts in flight when the circuit opens end later: a failure does not extend the
    cooldown, an answer shows the target alive and closes it."""
    t = _targets(per_target=8, failures=2)
    early = [_ticket(t, A, 0.0) for _ in range(3)]
    t.release(early[0], False, 1.0)
    assert t.release(early[1], False, 2.0) == "open"
    _fail_late = t.release(early[2], False, 5.0)
    assert _fail_late is None and t.state(A, 2.0 + COOLDOWN_S) == "half-open"
    t2 = _targets(per_target=8, failures=2)
    early = [_ticket(t2, A, 0.0) for _ in range(3)]
    t2.release(early[0], False, 1.0)
    t2.release(early[1], False, 1.0)
    assert t2.release(early[2], True, 3.0) == "closed"
    assert isinstance(t2.admit(A, 3.0), Ticket)


def test_idle_targets_are_forgotten_busy_and_recent_ones_kept() -> None:
    t = _targets(per_target=2, failures=1)
    t.release(_ticket(t, A, 0.0), True, 0.1)
    held = _ticket(t, B, 0.0)
    _fail(t, "https://c.example:443", 0.0, 1)
    horizon = 2 * (COOLDOWN_S + BUDGET_S)
    assert t.sweep(horizon) == 0 and len(t) == 3
    assert t.sweep(horizon + 1.5) == 2 and len(t) == 1  # A and c; B has an attempt in flight
    t.release(held, True, horizon + 2)
    assert t.sweep(2 * horizon + 3) == 1 and len(t) == 0


@pytest.mark.parametrize("status", [500, 502, 503, 408, 429])
def test_prompt_failing_answers_never_open_the_circuit(status: int) -> None:
    """Five quick 5xx once opened the circuit, and a receiver failing the first attempts of
    each delivery then got one probe per cooldown. An answer is the delivery's to retry."""
    outcome = outcome_of(status, None)
    assert outcome.kind == "retry" and outcome.target_ok is True
    t = _targets(per_target=8, failures=3)
    for i in range(10):
        assert t.release(_ticket(t, A, float(i)), outcome.target_ok, i + 0.01) is None
    assert t.state(A, 10.0) == "closed"


def test_no_answer_opens_the_circuit_and_an_answer_after_it_closes_it() -> None:
    """What holds slots (timeouts, connection errors: `target_ok=False`) opens it; the probe
    answered with a 503 shows the target alive again."""
    t = _targets(per_target=8, failures=3)
    _fail(t, A, 0.0, 3)
    assert t.state(A, 1.0) == "open"
    now = 1.0 + COOLDOWN_S
    probe = _ticket(t, A, now)
    assert probe.probe and t.release(probe, outcome_of(503, "5").target_ok, now + 0.1) == "closed"
