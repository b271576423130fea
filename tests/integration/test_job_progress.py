"""A running job's progress and its cancel, on the real stack: an API, echo workers, Redis.

Progress (`items_done`) is written by the worker's START call before each batch, so it moves
in steps of a batch while the job runs; a cancel asked while it runs ends it `cancelled` at
the worker's next batch boundary with the outputs it has; webhooks fire only on the events
their job asked for.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inferq.client import Client, JobFailed, JobStatus
from inferq.shared import keys
from inferq.shared.jobs import Status, decode_job
from inferq.worker.models.echo import expected_vector
from tests.integration.receivers import HookServer
from tests.integration.stack import Stack, wait_for

BATCH = 25
HOOKS = {"webhook_secret": "whsec-progress-and-events-01", "webhook_allow": "127.0.0.1"}


def _job(base: str, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


class Hooks:
    """What the receiver was sent, by job id."""

    def __init__(self) -> None:
        self.got: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.server = HookServer(self._answer)

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        view = json.loads(body)
        with self.lock:
            self.got.setdefault(view["id"], []).append(view)
        return 200

    def of(self, job_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.got.get(job_id, []))


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.server.close()


def test_progress_moves_per_batch_and_a_running_job_cancels_within_one_batch(
    stack: Stack, hooks: Hooks
) -> None:
    stack.worker(echo_batch_delay_ms=150, max_batch_size=BATCH, **HOOKS)
    base = stack.api(max_inputs_per_job=500, **HOOKS)
    texts = [f"part {i}" for i in range(500)]
    body = {"inputs": texts, "webhook": {"url": hooks.server.url(), "events": ["cancelled"]}}
    r = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    queued = _job(base, job_id)
    assert queued["items_total"] == 500 and queued["items_done"] == 0

    # Progress shows while it runs (START writes it before each batch).
    seen: list[int] = []

    def progressed() -> bool:
        view = _job(base, job_id)
        seen.append(view["items_done"])
        return view["status"] == "running" and view["items_done"] >= 2 * BATCH

    wait_for(progressed, 60, "two batches of the job done")
    assert seen == sorted(seen) and 0 < seen[-1] < 500, seen

    r = httpx.delete(f"{base}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 202, r.text
    asked = r.json()
    assert asked["status"] == "running" and asked["cancel_requested"] is True

    done = httpx.get(f"{base}/v1/jobs/{job_id}", params={"wait": 30}, timeout=35).json()
    assert done["status"] == "cancelled", done
    assert done["error"]["code"] == "cancelled"
    assert "cancel_requested" not in done
    # It stopped within one batch of the cancel: at most the batch then on the device ran.
    assert asked["items_done"] <= done["items_done"] <= asked["items_done"] + BATCH, (asked, done)
    assert done["items_done"] < 500
    outputs = done["outputs"]
    assert len(outputs) == 500
    ran = [i for i, o in enumerate(outputs) if o is not None]
    assert len(ran) == done["items_done"]
    assert all(outputs[i] == pytest.approx(expected_vector(texts[i]), abs=1e-6) for i in ran)

    # The webhook asked for `cancelled`, and says so with the same record.
    wait_for(lambda: hooks.of(job_id), 20, "the cancelled job's webhook")
    (sent,) = hooks.of(job_id)
    assert sent["status"] == "cancelled" and sent["items_done"] == done["items_done"]

    # Nothing else was affected: the next job runs whole.
    after = httpx.post(f"{base}/v1/infer", json={"inputs": texts[:60]}, timeout=60).json()
    assert after["status"] == "succeeded" and after["items_done"] == after["items_total"] == 60


def test_webhooks_fire_only_on_the_events_their_job_asked_for(stack: Stack, hooks: Hooks) -> None:
    stack.worker(**HOOKS)
    base = stack.api(**HOOKS)
    url = hooks.server.url()

    def submit(events: list[str] | None) -> str:
        webhook: dict[str, Any] = {"url": url} if events is None else {"url": url, "events": events}
        r = httpx.post(f"{base}/v1/infer", json={"input": "x", "webhook": webhook}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
        return str(r.json()["id"])

    only_failures = submit(["failed", "expired"])
    everything = submit(None)
    successes = submit(["succeeded"])
    wait_for(lambda: hooks.of(everything) and hooks.of(successes), 20, "the two deliveries")
    # FINISH queued no delivery for it (its status was not asked for): none can ever come.
    assert hooks.of(only_failures) == []
    assert [v["status"] for v in hooks.of(successes)] == ["succeeded"]

    refused = httpx.post(
        f"{base}/v1/jobs",
        json={"input": "x", "webhook": {"url": url, "events": ["started"]}},
        timeout=10,
    )
    assert refused.status_code == 422 and "webhook.events" in refused.text


def test_a_job_cancelled_while_its_worker_was_dying_ends_cancelled_on_the_next(
    stack: Stack,
) -> None:
    """The cancel mark is on the record, not in a worker: the worker that takes the job over
    ends it at once instead of running it again."""
    first = stack.worker(echo_batch_delay_ms=1_000, max_batch_size=1, heartbeat_ttl_s=1)
    base = stack.api()
    job_id = httpx.post(f"{base}/v1/jobs", json={"inputs": ["a", "b", "c"]}).json()["id"]
    wait_for(lambda: _job(base, job_id)["status"] == "running", 20, "the job to start")
    first.signal(signal.SIGKILL)
    first.wait(10)
    r = httpx.delete(f"{base}/v1/jobs/{job_id}", timeout=10)
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    second = stack.worker(heartbeat_ttl_s=1)
    done = httpx.get(f"{base}/v1/jobs/{job_id}", params={"wait": 30}, timeout=35).json()
    assert done["status"] == "cancelled", done
    record = decode_job(stack.r.hgetall(keys.job(job_id)))  # type: ignore[arg-type]
    assert record.status is Status.CANCELLED and record.worker
    second.signal(signal.SIGTERM)
    assert second.wait(20) == 0


def test_the_client_cancels_a_running_job_and_sees_its_progress(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=200, max_batch_size=4)
    base = stack.api()
    with Client(base) as client:
        job = client.submit([f"line {i}" for i in range(40)])
        assert client.get(job.id).items_total == 40

        def started() -> bool:
            now = client.get(job.id)
            return now.status is JobStatus.RUNNING and (now.items_done or 0) >= 4

        wait_for(started, 30, "the job to run its first batch")
        asked = client.cancel(job.id)
        assert asked.status is JobStatus.RUNNING and asked.cancel_requested
        with pytest.raises(JobFailed) as ended:
            client.wait(job.id, timeout_s=30)
        done = ended.value.job
        assert done.status is JobStatus.CANCELLED and not done.cancel_requested
        assert done.items_done is not None and asked.items_done is not None
        assert asked.items_done <= done.items_done <= asked.items_done + 4
        assert isinstance(done.outputs, list) and len(done.outputs) == 40
        assert sum(o is not None for o in done.outputs) == done.items_done
