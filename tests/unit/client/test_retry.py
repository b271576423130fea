"""The retry policy alone (pure), then through the client: 429/503 with Retry-After, capped
backoff, connection errors, what is never retried, and the Idempotency-Key of each call."""

from __future__ import annotations

import random

import httpx
import pytest

from inferq.client import (
    APIError,
    JobFailed,
    Overloaded,
    RetryPolicy,
    ServerError,
    TransportError,
    Unavailable,
)
from inferq.client.retry import retryable
from inferq.client.wire import Reply, parse_retry_after
from tests.unit.client.fakes import FakeAPI, FakeClock, client, error, job, keys, reply


def _reply(status: int, body: object = None, **headers: str) -> Reply:
    return Reply(status, httpx.Headers(headers), body)


# --- the policy, pure -------------------------------------------------------------------


@pytest.mark.parametrize("jitter", ["full", "equal"])
def test_backoff_doubles_from_base_and_never_passes_the_cap(jitter: str) -> None:
    policy = RetryPolicy(attempts=40, base_s=0.5, cap_s=4.0, jitter=jitter)  # type: ignore[arg-type]
    rng = random.Random(3)
    for retry in range(1, 40):
        ceiling = min(4.0, 0.5 * 2 ** (retry - 1))
        floor = 0.0 if jitter == "full" else ceiling / 2
        for _ in range(50):
            assert floor <= policy.backoff_s(retry, rng) <= ceiling


def test_full_jitter_spreads_over_the_whole_range_equal_keeps_half() -> None:
    rng = random.Random(5)
    full = [RetryPolicy(jitter="full", cap_s=8).backoff_s(5, rng) for _ in range(500)]
    equal = [RetryPolicy(jitter="equal", cap_s=8).backoff_s(5, rng) for _ in range(500)]
    assert min(full) < 1.0 and max(full) > 7.0
    assert min(equal) >= 4.0 and max(equal) <= 8.0


def test_retry_after_is_a_floor_plus_jitter_and_capped() -> None:
    policy = RetryPolicy(base_s=0.5, cap_s=10.0)
    rng = random.Random(0)
    for attempt in (1, 2, 3):
        delay = policy.delay_s(
            _reply(429, {"error": {"code": "overloaded"}}, **{"Retry-After": "3"}), attempt, rng
        )
        assert delay is not None and 3.0 <= delay <= min(10.0, 3 + 0.5 * 2 ** (attempt - 1))
    # Near the cap, the jitter is cut off at the cap, never below the server's floor.
    assert policy.delay_s(_reply(503, None, **{"Retry-After": "10"}), 1, rng) == 10.0
    # Past the cap: not waited for, the caller decides.
    assert policy.delay_s(_reply(503, None, **{"Retry-After": "11"}), 1, rng) is None


def test_no_retry_once_attempts_are_spent() -> None:
    policy = RetryPolicy(attempts=3)
    rng = random.Random(0)
    assert policy.delay_s(_reply(503), 2, rng) is not None
    assert policy.delay_s(_reply(503), 3, rng) is None
    assert RetryPolicy(attempts=1).delay_s(_reply(503), 1, rng) is None


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (_reply(429, {"error": {"code": "overloaded"}}), True),
        (_reply(429, {"error": {"code": "queue_full", "type": "rate_limit_error"}}), True),
        (_reply(502), True),
        (_reply(503, {"error": {"code": "unavailable"}}), True),
        (_reply(504), True),
        (_reply(500, {"error": {"code": "corrupt_record"}}), False),
        (_reply(400), False),
        (_reply(404), False),
        (_reply(409), False),
        (_reply(422), False),
        # A job that ended expired is the answer, not a refusal: asking again returns it.
        (_reply(429, job(status="expired", error={"code": "expired", "message": "late"})), False),
        (_reply(429, {"error": {"code": "expired", "type": "rate_limit_error"}}), False),
        (httpx.ConnectError("refused"), True),
        (httpx.ReadError("reset"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.RemoteProtocolError("closed"), True),
        (httpx.UnsupportedProtocol("ftp"), False),
    ],
)
def test_what_is_retried(outcome: Reply | httpx.RequestError, expected: bool) -> None:
    assert retryable(outcome) is expected


def test_retry_after_parses_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-2") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = 784111777.0 - 10  # Sun, 06 Nov 1994 08:49:37 GMT, minus 10 s
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=now) == pytest.approx(10.0)


@pytest.mark.parametrize(
    "bad", [dict(attempts=0), dict(base_s=0), dict(base_s=5, cap_s=1), dict(jitter="none")]
)
def test_policy_refuses_bad_settings(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)  # type: ignore[arg-type]


# --- through the client -----------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_a_refused_submit_is_retried_after_retry_after_with_the_same_key(status: int) -> None:
    api = FakeAPI(
        [
            error(status, "overloaded", **{"Retry-After": "3"}),
            error(status, "overloaded", **{"Retry-After": "2"}),
            reply(202, job("j9", "queued")),
        ]
    )
    clock = FakeClock()
    with client(api, clock) as c:
        got = c.submit(["a"])
    assert got.id == "j9" and str(got.status) == "queued"
    assert len(api.seen) == 3
    assert 3.0 <= clock.sleeps[0] <= 3.5 and 2.0 <= clock.sleeps[1] <= 3.0
    (key,) = set(keys(api.seen))  # one key, on every attempt
    assert key and len(key) == 32


def test_each_logical_call_has_its_own_key_and_a_given_key_wins() -> None:
    api = FakeAPI(handler=lambda r: reply(202, job("j", "queued")))
    with client(api, FakeClock()) as c:
        c.submit(["a"])
        c.submit(["a"])
        c.submit(["a"], idempotency_key="order-4711")
    a, b, given = keys(api.seen)
    assert a and b and a != b
    assert given == "order-4711"


def test_a_caller_key_is_sent_on_every_retry() -> None:
    api = FakeAPI([httpx.ConnectError("refused"), error(503, "unavailable"), reply(200, job())])
    with client(api, FakeClock()) as c:
        c.infer(input="a", idempotency_key="mine")
    assert keys(api.seen) == ["mine", "mine", "mine"]


def test_backoff_without_retry_after_is_capped() -> None:
    api = FakeAPI([error(503, "unavailable")] * 9 + [reply(202, job(status="queued"))])
    clock = FakeClock()
    with client(api, clock, retry=RetryPolicy(attempts=10, base_s=1.0, cap_s=4.0)) as c:
        c.submit(["a"])
    assert len(clock.sleeps) == 9
    assert all(s <= 4.0 for s in clock.sleeps)
    assert all(s >= 2.0 for s in clock.sleeps[3:])  # equal jitter keeps half the capped 4 s
    assert 0.5 <= clock.sleeps[0] <= 1.0


def test_connection_errors_are_retried_then_raised_with_their_cause() -> None:
    api = FakeAPI(handler=lambda r: httpx.ConnectError("refused"))
    clock = FakeClock()
    with client(api, clock) as c, pytest.raises(TransportError) as info:
        c.get("j1")
    assert info.value.attempts == 5 and len(api.seen) == 5 and len(clock.sleeps) == 4
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_overload_that_outlasts_the_attempts_is_raised_with_its_retry_after() -> None:
    api = FakeAPI(handler=lambda r: error(429, "overloaded", "queue full", **{"Retry-After": "1"}))
    with client(api, FakeClock()) as c, pytest.raises(Overloaded) as info:
        c.submit(["a"])
    assert (info.value.status, info.value.code, info.value.retry_after_s) == (
        429,
        "overloaded",
        1.0,
    )
    assert info.value.message == "queue full" and len(api.seen) == 5


def test_a_retry_after_past_the_cap_is_raised_at_once() -> None:
    api = FakeAPI([error(503, "unavailable", **{"Retry-After": "3600"})])
    clock = FakeClock()
    with client(api, clock) as c, pytest.raises(Unavailable) as info:
        c.submit(["a"])
    assert info.value.retry_after_s == 3600 and clock.sleeps == [] and len(api.seen) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422, 500])
def test_other_errors_are_not_retried(status: int) -> None:
    api = FakeAPI([error(status, "x")])
    with client(api, FakeClock()) as c, pytest.raises(APIError):
        c.submit(["a"])
    assert len(api.seen) == 1


def test_an_expired_job_from_infer_is_a_job_failure_never_retried() -> None:
    expired = job("j1", "expired", error={"code": "expired", "message": "deadline passed"})
    api = FakeAPI([reply(429, expired)])
    with client(api, FakeClock()) as c, pytest.raises(JobFailed) as info:
        c.infer(input="a")
    assert info.value.code == "expired" and info.value.job.id == "j1" and len(api.seen) == 1


def test_a_500_is_a_server_error() -> None:
    api = FakeAPI([error(500, "corrupt_record", "bad record")])
    with client(api, FakeClock()) as c, pytest.raises(ServerError) as info:
        c.get("j1")
    assert info.value.code == "corrupt_record"
