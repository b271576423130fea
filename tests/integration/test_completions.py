"""Completion messages go to the API processes that wait on a job, not to every one: real
Redis, a real worker, two real API processes. Each test sets the re-read timer past its
waits, so a final answer before the wait's end came from a message (a wait that hears none
re-reads at its end and answers the job as it is then)."""

from __future__ import annotations

import threading

import httpx
import msgpack

from inferq.shared import keys
from inferq.shared.schema import JobField
from tests.integration.stack import Stack, wait_for

NO_RECHECK = {"long_poll_recheck_s": 120, "max_long_poll_s": 120}
WAIT_S = 20  # each wait's length; a told one ends far sooner (the echo job takes ms)


def _listeners(stack: Stack, job_id: str) -> list[str]:
    raw = stack.r.hget(keys.job(job_id), JobField.LISTENERS)
    return [] if raw is None else msgpack.unpackb(raw).split()


def test_a_wait_on_another_api_process_is_told_when_the_job_ends(stack: Stack) -> None:
    """A job submitted through A names A; a long poll on B adds B, and B's poll answers
    the final job as soon as a worker ends it."""
    a, b = stack.api(**NO_RECHECK), stack.api(**NO_RECHECK)
    job = httpx.post(f"{a}/v1/jobs", json={"input": "hello"}, timeout=10).json()
    assert len(_listeners(stack, job["id"])) == 1  # A's
    answer: dict[str, httpx.Response] = {}

    def poll() -> None:
        answer["b"] = httpx.get(f"{b}/v1/jobs/{job['id']}", params={"wait": WAIT_S}, timeout=60)

    poller = threading.Thread(target=poll)
    poller.start()
    wait_for(lambda: len(_listeners(stack, job["id"])) == 2, 10, "B's poll to name B")
    stack.worker()
    poller.join(60)
    assert not poller.is_alive()
    r = answer["b"]
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    assert r.elapsed.total_seconds() < WAIT_S / 2, r.elapsed


def test_a_sync_request_is_told_by_its_own_message(stack: Stack) -> None:
    stack.worker()
    a, _ = stack.api(**NO_RECHECK), stack.api(**NO_RECHECK)
    for text in ("one", "two", "three"):
        r = httpx.post(f"{a}/v1/infer", json={"input": text, "wait": WAIT_S}, timeout=60)
        assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
        assert r.elapsed.total_seconds() < WAIT_S / 2, r.elapsed
