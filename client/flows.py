"""Every client operation written once, as a generator of steps: no I/O, no event loop.

A flow yields `Call`s (make this request) and `Sleep`s (wait this long) and is sent back, for
each `Call`, the `Reply` or the `httpx.RequestError` it ended in (None after a `Sleep`); it
returns the result or raises an `InferqError`. `Client` and `AsyncClient` are only drivers of
these generators (one with blocking httpx and `time.sleep`, one with `await`), so the two can
never disagree about a retry, a status or a decoding: the logic exists once, here (the
"sans-I/O" design of h11 and hyper).

Invariants:
- one logical call, one Idempotency-Key: generated once per submit (unless the caller gave
  one) and sent on every attempt of that request, so a retry after a lost answer returns the
  job the first attempt created;
- `wait` never waits past its `timeout_s`: each long-poll asks at most for the time left;
- no call waits without a bound: `wait` without `timeout_s` waits `DEFAULT_WAIT_S`, `infer`
  its job's deadline plus `DEADLINE_GRACE_S` (else `DEFAULT_WAIT_S`), then `WaitTimeout`
  (a job whose model no worker serves stays queued, and a call must not stay with it);
- a flow raises only `InferqError`s (and `TypeError`/`ValueError` for a wrong argument).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Generator
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import numpy as np

from inferq.client.errors import JobFailed, TransportError, WaitTimeout
from inferq.client.jobs import Job, JobStatus
from inferq.client.retry import RetryPolicy
from inferq.client.wire import (
    Call,
    Reply,
    Sleep,
    decode_embeddings,
    decode_job,
    decode_job_list,
    job_vectors,
)

T = TypeVar("T")
Step: TypeAlias = Call | Sleep
Outcome: TypeAlias = Reply | httpx.RequestError | None
Flow: TypeAlias = Generator[Step, Outcome, T]

# A long-poll answered this early (below half of what it asked for) did not wait: an API that
# is stopping answers open long-polls at once, a lower INFERQ_MAX_LONG_POLL_S cuts them short.
# Pausing this long before the next one keeps such a loop from spinning.
EARLY_ANSWER_PAUSE_S = 0.25
# How long a wait lasts when no `timeout_s` says: long enough for any healthy queue, short
# enough that a job nobody serves surfaces as a `WaitTimeout` (its job attached) rather than a
# hang. `timeout_s=math.inf` waits without a bound, on purpose.
DEFAULT_WAIT_S = 300.0
# `infer` with a deadline waits that long past it: the API ends an expired job (status
# `expired`) within a sweep; this is only the backstop should that answer never come.
DEADLINE_GRACE_S = 30.0


def new_key() -> str:
    """A fresh Idempotency-Key: 122 random bits, so two calls never share one by chance."""
    return uuid.uuid4().hex


def finished(job: Job) -> Job:
    """A final job: itself if it succeeded; `JobFailed` if it ended any other way."""
    if job.status is not JobStatus.SUCCEEDED:
        raise JobFailed(job)
    return job


def job_path(job_id: str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}"


class Flows:
    """The operations, each a `Flow`; `clock` (monotonic seconds) and `rng` are injected so
    tests run them with a fake time and a seeded jitter."""

    def __init__(
        self,
        retry: RetryPolicy,
        *,
        long_poll_s: float,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        if long_poll_s <= 0:
            raise ValueError(f"long_poll_s must be positive, not {long_poll_s}")
        self.retry = retry
        self.long_poll_s = long_poll_s
        self.clock = clock
        self.rng = rng

    def exchange(self, call: Call) -> Flow[tuple[Reply, int]]:
        """Make `call`, retried as the policy says; the final reply and the attempts it took.
        Raises `TransportError` when the last attempt got no answer."""
        attempt = 0
        while True:
            attempt += 1
            outcome = yield call
            if outcome is None:
                raise TypeError(f"a driver must answer {call} with its reply or its error")
            delay = self.retry.delay_s(outcome, attempt, self.rng)
            if delay is None:
                if isinstance(outcome, httpx.RequestError):
                    raise TransportError(
                        f"{call.method} {call.path}: {outcome!r}", attempt
                    ) from outcome
                return outcome, attempt
            yield Sleep(delay)

    def submit(self, body: dict[str, Any], key: str | None) -> Flow[Job]:
        """POST /v1/jobs: the queued job (202)."""
        reply, _ = yield from self.exchange(
            Call("POST", "/v1/jobs", body, idempotency_key=key or new_key())
        )
        if not reply.ok:
            raise reply.error()
        return decode_job(reply)

    def get(self, job_id: str, wait_s: float = 0.0) -> Flow[Job]:
        """GET /v1/jobs/{id}, long-polling up to `wait_s` (the server caps it) when > 0."""
        params = {"wait": f"{wait_s:.3f}"} if wait_s > 0 else None
        reply, _ = yield from self.exchange(
            Call("GET", job_path(job_id), params=params, wait_s=wait_s)
        )
        if not reply.ok:
            raise reply.error()
        return decode_job(reply)

    def list_page(self, params: dict[str, str]) -> Flow[tuple[list[Job], bool, str | None]]:
        """GET /v1/jobs: one page, whether there are more, and the `after` of the next."""
        reply, _ = yield from self.exchange(Call("GET", "/v1/jobs", params=params))
        if not reply.ok:
            raise reply.error()
        return decode_job_list(reply)

    def wait(self, job_id: str, timeout_s: float | None) -> Flow[Job]:
        """Long-poll until the job is final: the succeeded job, else `JobFailed`;
        `WaitTimeout` once `timeout_s` passed (None: `DEFAULT_WAIT_S`)."""
        limit_s = DEFAULT_WAIT_S if timeout_s is None else timeout_s
        return (yield from self._wait_until(job_id, self.clock() + limit_s, limit_s))

    def _wait_until(self, job_id: str, deadline: float, limit_s: float) -> Flow[Job]:
        """`wait` up to the monotonic `deadline`; `limit_s` is the bound the caller chose
        (named by the `WaitTimeout`)."""
        while True:
            poll_s = self._poll_s(deadline)
            asked = self.clock()
            job = yield from self.get(job_id, poll_s)
            if job.status.is_final:
                return finished(job)
            if self.clock() >= deadline:
                raise WaitTimeout(job, limit_s)
            if self.clock() - asked < poll_s / 2:
                yield Sleep(min(EARLY_ANSWER_PAUSE_S, self._poll_s(deadline)))

    def _poll_s(self, deadline: float) -> float:
        """How long the next long-poll may ask for: the client's long-poll, or what is left."""
        return max(0.0, min(self.long_poll_s, deadline - self.clock()))

    def cancel(self, job_id: str) -> Flow[Job]:
        """DELETE /v1/jobs/{id}: the cancelled job, or, for one a worker runs, the job with
        `cancel_requested` (it ends `cancelled` with the outputs it has at the worker's next
        batch: wait for it); `Conflict` if it had already ended.

        A retried DELETE whose first attempt did cancel (its answer lost) meets 409: then the
        job is read, and returned if it is cancelled, as the first answer would have been."""
        reply, attempts = yield from self.exchange(Call("DELETE", job_path(job_id)))
        if reply.status == 409 and attempts > 1:
            job = yield from self.get(job_id)
            if job.status is JobStatus.CANCELLED:
                return job
        if not reply.ok:
            raise reply.error()
        return decode_job(reply)

    def infer(self, body: dict[str, Any], key: str | None) -> Flow[Job]:
        """POST /v1/infer, then long-poll the job until final if it answered 202; at most its
        deadline (`timeout_s` in `body`) plus `DEADLINE_GRACE_S`, else `DEFAULT_WAIT_S`, from
        the call's start, then `WaitTimeout` (the job is left as it is: wait again or cancel)."""
        deadline_s = body.get("timeout_s")
        limit_s = DEFAULT_WAIT_S if deadline_s is None else float(deadline_s) + DEADLINE_GRACE_S
        until = self.clock() + limit_s
        body = {**body, "wait": self.long_poll_s}
        key = key or new_key()
        call = Call("POST", "/v1/infer", body, idempotency_key=key, wait_s=self.long_poll_s)
        reply, _ = yield from self.exchange(call)
        if not reply.is_job:  # a refusal: `/v1/infer` answers every job it made as a job view
            raise reply.error()
        job = decode_job(reply)
        if not job.status.is_final:
            job = yield from self._wait_until(job.id, until, limit_s)
        return finished(job)

    def embed(self, body: dict[str, Any], key: str | None) -> Flow[np.ndarray]:
        """POST /v1/embeddings: a float32 (n, dim) array; on 202 the job is long-polled."""
        key = key or new_key()
        until = self.clock() + DEFAULT_WAIT_S
        call = Call("POST", "/v1/embeddings", body, idempotency_key=key, wait_s=body["wait"])
        reply, _ = yield from self.exchange(call)
        if reply.status == 202 and reply.is_job:
            job = yield from self._wait_until(decode_job(reply).id, until, DEFAULT_WAIT_S)
            return job_vectors(job)
        if not reply.ok:
            raise reply.error()
        return decode_embeddings(reply)
