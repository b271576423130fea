"""`inferq.client` against the real stack: a real API process, redis-server and echo worker.

(a) every operation round-trips with echo's exact outputs, sync and async; errors from the
real API land in the client's tree. (b) Every call's first answer is lost on the way back
while the worker is SIGKILLed and restarted: the client retries with the same
Idempotency-Key and each logical call still ends with exactly one job. (c) A burst far past
`max_queue` through `map`: calls are refused (429 + Retry-After), back off, and all succeed,
with exactly one job per call.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import threading
from typing import Any

import httpx
import numpy as np
import pytest

from inferq.client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    Job,
    JobStatus,
    NotFound,
    RetryPolicy,
    Unauthorized,
    WaitTimeout,
)
from inferq.shared import keys
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for

TEXTS = ["hello world", "a b c", "the quick brown fox jumps", "x"]


def _expected(texts: list[str]) -> np.ndarray:
    return np.asarray([expected_vector(t) for t in texts], dtype=np.float32)


def _job_records(stack: Stack) -> int:
    return len(stack.r.keys(keys.job("*")))


def _assert_one_job_each(stack: Stack, texts: list[str], jobs: list[Job]) -> None:
    """Right outputs in input order, one distinct job per call, and no other job in Redis."""
    assert all(j.status is JobStatus.SUCCEEDED for j in jobs)
    np.testing.assert_array_equal(np.concatenate([j.outputs for j in jobs]), _expected(texts))
    assert len({j.id for j in jobs}) == len(texts)
    assert _job_records(stack) == len(texts)


class Recording(httpx.HTTPTransport):
    """The real transport, counting answers by status. With `lose_first`, the first answer
    that carries a job (2xx) of each Idempotency-Key is thrown away and a reset raised in its
    place: the job exists, the client never heard of it."""

    def __init__(self, *, lose_first: bool = False) -> None:
        super().__init__()
        self.lose_first = lose_first
        self.statuses: collections.Counter[int] = collections.Counter()
        self.lost = 0
        self._answered: set[str] = set()
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        key = request.headers.get("idempotency-key")
        with self._lock:
            self.statuses[response.status_code] += 1
            lose = self.lose_first and key and response.is_success and key not in self._answered
            if lose and key:
                self._answered.add(key)
                self.lost += 1
        if lose:
            response.close()
            raise httpx.ReadError("answer lost on purpose", request=request)
        return response


class AsyncRecording(httpx.AsyncHTTPTransport):
    """`Recording`'s counting, for the async client."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: collections.Counter[int] = collections.Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.statuses[response.status_code] += 1
        return response


# --- (a) round trips ---------------------------------------------------------------------


def test_infer_embed_map_submit_and_wait_round_trip(stack: Stack) -> None:
    stack.worker()
    with Client(stack.api(), timeout=10) as c:
        job = c.infer(TEXTS)
        assert job.status is JobStatus.SUCCEEDED and job.model == "echo"
        assert isinstance(job.outputs, np.ndarray) and job.outputs.dtype == np.float32
        np.testing.assert_array_equal(job.outputs, _expected(TEXTS))
        assert job.timings.total_ms is not None and job.worker

        vectors = c.embed(TEXTS, model="echo")
        assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 4)
        np.testing.assert_array_equal(vectors, _expected(TEXTS))

        texts = [f"map {i} " + "w " * (i % 4) for i in range(20)]
        jobs = c.map(texts, concurrency=5)
        np.testing.assert_array_equal(np.concatenate([j.outputs for j in jobs]), _expected(texts))

        queued = c.submit(input="one input", priority="high", timeout_s=30)
        assert queued.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
        done = c.wait(queued.id, timeout_s=30)
        np.testing.assert_array_equal(done.outputs, _expected(["one input"]))
        assert c.get(queued.id).to_dict()["outputs"] == [expected_vector("one input")]


def test_the_async_client_round_trips_the_same(stack: Stack) -> None:
    stack.worker()
    base = stack.api()

    async def run() -> tuple[Job, np.ndarray, list[Job]]:
        async with AsyncClient(base, timeout=10) as c:
            return await c.infer(TEXTS), await c.embed(TEXTS), await c.map(TEXTS, concurrency=2)

    job, vectors, jobs = asyncio.run(run())
    np.testing.assert_array_equal(job.outputs, _expected(TEXTS))
    np.testing.assert_array_equal(vectors, _expected(TEXTS))
    np.testing.assert_array_equal(np.concatenate([j.outputs for j in jobs]), _expected(TEXTS))


def test_real_errors_land_in_the_tree(stack: Stack) -> None:
    base = stack.api(api_keys="alpha:key-a-0123456789")  # no worker: a job stays queued
    with Client(base, api_key="key-a-0123456789", timeout=10) as c:
        with pytest.raises(NotFound) as missing:
            c.get("doesnotexist")
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        with pytest.raises(BadRequest) as empty:
            c.submit(input="")
        assert (empty.value.status, empty.value.code) == (422, "invalid_input")
        queued = c.submit(input="never run")
        with pytest.raises(WaitTimeout):
            c.wait(queued.id, timeout_s=0.5)
        cancelled = c.cancel(queued.id)
        assert cancelled.status is JobStatus.CANCELLED and cancelled.error
        assert cancelled.error.code == "cancelled"
        with pytest.raises(Conflict):
            c.cancel(queued.id)
    with Client(base, api_key="wrong", timeout=10) as c, pytest.raises(Unauthorized) as auth:
        c.get(queued.id)
    assert auth.value.code == "unauthorized"


# --- (b) lost answers across a worker kill -----------------------------------------------


def test_retries_across_a_worker_kill_make_exactly_one_job_per_call(stack: Stack) -> None:
    w: dict[str, Any] = dict(echo_batch_delay_ms=80, max_batch_size=4, worker_id="client-b")
    worker = stack.worker(**w)
    base = stack.api()
    transport = Recording(lose_first=True)
    texts = [f"kill {i} " + "w " * (i % 3) for i in range(40)]
    retry = RetryPolicy(attempts=10, base_s=0.05, cap_s=2.0)
    result: dict[str, Any] = {}
    with Client(base, transport=transport, retry=retry, long_poll_s=2, timeout=10) as c:

        def run() -> None:
            try:
                result["jobs"] = c.map(texts, concurrency=8)
            except BaseException as e:  # handed to the test's thread, asserted below
                result["error"] = e

        mapper = threading.Thread(target=run)
        mapper.start()
        wait_for(lambda: transport.statuses[200] >= 8, 30, "some calls answered")
        worker.signal(signal.SIGKILL)
        worker.wait(10)
        # With no worker, the calls in flight get 202 (not done within the wait) and go on
        # long-polling their jobs across the restart.
        wait_for(lambda: transport.statuses[202] >= 8, 30, "calls waiting on the dead worker")
        stack.worker(**w)
        mapper.join(120)
    assert not mapper.is_alive() and "error" not in result, result.get("error")
    _assert_one_job_each(stack, texts, result["jobs"])
    assert transport.lost == len(texts)  # every call lost an answer, and retried


# --- (c) a 429 burst ---------------------------------------------------------------------


def test_a_429_burst_through_map_all_succeed_without_duplicates(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=100, max_batch_size=4)
    base = stack.api(max_queue=4)
    transport = AsyncRecording()
    texts = [f"burst {i}" for i in range(24)]
    retry = RetryPolicy(attempts=40, base_s=0.1, cap_s=3.0)

    async def run() -> list[Job]:
        async with AsyncClient(base, transport=transport, retry=retry, timeout=10) as c:
            return await c.map(texts, concurrency=12)

    jobs = asyncio.run(run())
    assert transport.statuses[429] > 0, transport.statuses  # the burst was refused, then got in
    assert set(transport.statuses) <= {200, 202, 429}
    _assert_one_job_each(stack, texts, jobs)


def test_inferq_submit_and_get_on_the_command_line(stack: Stack) -> None:
    """`inferq submit --wait` and `inferq get` are the client, as an operator types them;
    the key comes from the environment, never argv."""
    import json
    import os
    import subprocess
    import sys

    from tests.integration.stack import ROOT

    stack.worker()
    base = stack.api(api_keys="ops:key-cli-0123456789")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env["INFERQ_CLIENT_KEY"] = "key-cli-0123456789"

    def inferq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferq.cli", *args, "--url", base],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = inferq("submit", "--wait", "hello from the shell")
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "succeeded"
    assert job["outputs"] == [expected_vector("hello from the shell")]
    got = inferq("get", job["id"])
    assert got.returncode == 0 and json.loads(got.stdout)["id"] == job["id"]
    env["INFERQ_CLIENT_KEY"] = "wrong"
    refused = inferq("get", job["id"])
    assert refused.returncode == 1 and json.loads(refused.stderr)["error"]["status"] == 401
