"""Safety claims that only a real Redis and real processes can show, one test each.

Each of these is a sentence in docs/architecture.md ("How it stays safe"); each test fails if
the mechanism behind the sentence breaks, not only if its outcome happens to go wrong:
the take-over idle guard and the visibility timeout (entries made idle with XCLAIM's IDLE,
so nothing waits on the clock), two workers sharing one model, cancelling a running job, a
full or read-only Redis, a lost completion message, a cut subscriber, and an API stopping
with long-polls open.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from inferq.redis_server import RedisServer
from inferq.shared import keys
from inferq.shared.jobs import Job, Status, decode_job, encode_final, now_ms
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for
from tests.integration.test_chaos import Publications, _submit_all
from tests.queues import JobQueue

# ----------------------------------------------------------------------------------------------
# Take-over, on the queue itself


async def _held_by(queue: JobQueue, consumer: str, n: int, idle_ms: int) -> list[str]:
    """`n` jobs delivered to `consumer`, their entries made `idle_ms` idle (XCLAIM IDLE)."""
    await queue.ensure_group("echo")
    for i in range(n):
        await queue.submit(Job(id=f"{consumer}-{i}", model="echo", inputs=["x"]))
    entries = await queue.read("echo", consumer, count=n, block_ms=100)
    assert len(entries) == n
    ids = [e.entry_id for e in entries]
    stream = keys.stream("echo")
    await queue.redis.xclaim(stream, keys.GROUP, consumer, 0, ids, idle=idle_ms, justid=True)
    return sorted(e.job_id for e in entries)


async def test_two_live_workers_never_both_take_a_dead_consumers_entries(queue: JobQueue) -> None:
    jobs = await _held_by(queue, "dead", 6, idle_ms=2_000)
    guard = {"dead_idle_ms": 10_000, "stuck_idle_ms": 3_600_000}
    # Idle for less than the guard (a worker that only just missed a beat): nobody takes them.
    assert await queue.take_over("echo", "A", dead=["dead"], **guard) == []
    await queue.redis.xclaim(
        keys.stream("echo"), keys.GROUP, "dead", 0,
        [e.entry_id for e in await queue.read("echo", "dead", count=10, block_ms=None, pending=True)],
        idle=20_000, justid=True,
    )  # fmt: skip
    a = await queue.take_over("echo", "A", dead=["dead"], **guard)
    b = await queue.take_over("echo", "B", dead=["dead"], **guard)  # A's claim reset the idle
    assert sorted(e.job_id for e in a) == jobs and b == []
    pending = await queue.consumers("echo")
    assert pending.get("A") == 6 and not pending.get("dead") and not pending.get("B")


async def test_a_stuck_but_alive_worker_loses_its_entries_after_the_visibility_timeout(
    queue: JobQueue,
) -> None:
    jobs = await _held_by(queue, "stuck", 3, idle_ms=5_000)
    # Alive (not in `dead`) and idle under the visibility timeout: its entries stay.
    assert await queue.take_over("echo", "A", dead=[], dead_idle_ms=1, stuck_idle_ms=60_000) == []
    taken = await queue.take_over("echo", "A", dead=[], dead_idle_ms=1, stuck_idle_ms=4_000)
    assert sorted(e.job_id for e in taken) == jobs
    assert (await queue.consumers("echo")).get("A") == 3


# ----------------------------------------------------------------------------------------------
# Workers


def _record(stack: Stack, job_id: str) -> Job:
    return decode_job(stack.r.hgetall(keys.job(job_id)))


def _summary(log: str) -> dict[str, int]:
    """The counts in a worker's one-line stop summary."""
    line = re.search(r"worker \S+ stopped after .*", log)
    assert line, log
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(0))}


async def test_two_workers_on_one_model_share_the_load_with_no_duplicate(stack: Stack) -> None:
    pubs = Publications(stack.redis_url)
    try:
        for name in ("W1", "W2"):
            stack.worker(worker_id=name, echo_batch_delay_ms=20, max_batch_size=4)
        base = stack.api()
        texts = [f"shared {i}" for i in range(160)]
        ids = await _submit_all(base, texts, concurrency=16)
        wait_for(
            lambda: all(_record(stack, i).status.is_final for i in ids), 60, "every job to end"
        )
        wait_for(lambda: len(pubs.counts) >= len(ids), 10, "every completion message")
    finally:
        pubs.close()
    records = [_record(stack, i) for i in ids]
    assert all(r.status is Status.SUCCEEDED for r in records)
    assert all(
        r.outputs is not None and r.outputs.tolist() == [expected_vector(t)]
        for r, t in zip(records, texts, strict=True)
    )
    by_worker = {name: sum(r.worker == name for r in records) for name in ("W1", "W2")}
    assert sum(by_worker.values()) == len(ids)
    assert min(by_worker.values()) >= len(ids) // 10, by_worker  # both really served
    assert {pubs.counts[i] for i in ids} == {1}  # each job published exactly once


def test_cancelling_a_running_job_drops_its_unstarted_items(stack: Stack) -> None:
    w = stack.worker(echo_batch_delay_ms=400, max_batch_size=1)
    base = stack.api()
    job = httpx.post(f"{base}/v1/jobs", json={"inputs": [f"part {i}" for i in range(8)]}).json()
    # Its first item is on the device once the START script has counted the job.
    wait_for(lambda: _record(stack, job["id"]).attempts >= 1, 10, "the job's first item to start")
    r = httpx.delete(f"{base}/v1/jobs/{job['id']}", timeout=5)
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    after = httpx.post(f"{base}/v1/jobs", json={"input": "after"}).json()
    body = httpx.get(f"{base}/v1/jobs/{after['id']}", params={"wait": 20}, timeout=25).json()
    assert body["status"] == "succeeded"
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    ran = _summary(w.log())
    # At most the item on the device at the DELETE, one that started alongside it, and `after`.
    assert ran["items"] <= 3, ran
    assert ran["cancelled"] == 1 and _record(stack, job["id"]).status is Status.CANCELLED


# ----------------------------------------------------------------------------------------------
# Redis refusing writes → 503 + Retry-After, and back


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: these tests make it full or read-only."""
    server = RedisServer(tmp_path / "own", appendonly=False)
    server.start()
    yield server
    server.stop()


def _submit_status(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/jobs", json={"input": "x"}, timeout=10)


def _refused_then_recovers(base: str, what: str) -> None:
    r = _submit_status(base)
    assert r.status_code == 503, (what, r.status_code, r.text)
    assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "unavailable"


def test_a_full_redis_answers_503_and_recovers(
    stack: Stack, own_redis: RedisServer, tmp_path: Path
) -> None:
    stack.redis_url = own_redis.url
    base = stack.api()
    assert _submit_status(base).status_code == 202
    r = redis.Redis.from_url(own_redis.url)
    try:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)  # used memory is over it at once: every write is refused
        _refused_then_recovers(base, "full")
        r.config_set("maxmemory", 0)
        assert _submit_status(base).status_code == 202
    finally:
        r.config_set("maxmemory", 0)
        r.close()


def test_a_read_only_redis_answers_503_and_recovers(
    stack: Stack, own_redis: RedisServer, tmp_path: Path
) -> None:
    primary = RedisServer(tmp_path / "primary", appendonly=False)
    primary.start()
    stack.redis_url = own_redis.url
    base = stack.api()
    r = redis.Redis.from_url(own_redis.url)
    try:
        assert _submit_status(base).status_code == 202
        # What a failover does to the old primary: it becomes a replica and refuses writes.
        r.replicaof("127.0.0.1", primary.port)
        _refused_then_recovers(base, "read-only")
        r.replicaof("NO", "ONE")
        wait_for(lambda: _submit_status(base).status_code == 202, 10, "writes to be accepted")
    finally:
        r.close()
        primary.stop()


# ----------------------------------------------------------------------------------------------
# Completion messages are a hint: a lost one delays, never loses, a result


def _long_poll(base: str, job_id: str, wait_s: float) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        resp = httpx.get(f"{base}/v1/jobs/{job_id}", params={"wait": wait_s}, timeout=wait_s + 10)
        out["took"], out["status"], out["body"] = (
            time.monotonic() - t0,
            resp.status_code,
            resp.json(),
        )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _waiting(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    m = re.search(r"^inferq_requests_waiting (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _finish_silently(stack: Stack, job_id: str) -> None:
    """Make the job final the way a lost PUBLISH would leave it: the record, no message."""
    fields = encode_final(Status.SUCCEEDED, finished_ms=now_ms(), outputs=[[1.0]])
    stack.r.hset(keys.job(job_id), mapping=fields)  # type: ignore[arg-type]


def test_a_lost_completion_message_is_caught_by_the_periodic_reread(stack: Stack) -> None:
    base = stack.api(long_poll_recheck_s=0.5)  # no worker: the job stays queued until we act
    job = httpx.post(f"{base}/v1/jobs", json={"input": "x"}).json()
    t, out = _long_poll(base, job["id"], 30)
    wait_for(lambda: _waiting(base) >= 1, 10, "the long-poll to be waiting")
    _finish_silently(stack, job["id"])
    t.join(40)
    assert out["status"] == 200 and out["body"]["status"] == "succeeded", out
    assert out["took"] < 20, out  # the re-read found it, not the end of the wait


def test_a_cut_subscriber_resubscribes_and_wakes_every_waiter(stack: Stack) -> None:
    # With the periodic re-read out of reach, only the notifier can wake a waiter.
    base = stack.api(long_poll_recheck_s=3600)
    job = httpx.post(f"{base}/v1/jobs", json={"input": "x"}).json()
    t, out = _long_poll(base, job["id"], 30)
    wait_for(lambda: _waiting(base) >= 1, 10, "the long-poll to be waiting")
    _finish_silently(stack, job["id"])  # published while nobody listened: lost
    assert stack.r.client_kill_filter(_type="pubsub") >= 1
    t.join(40)
    assert out["status"] == 200 and out["body"]["status"] == "succeeded", out
    assert out["took"] < 20, out  # woken by the resubscribe, not the end of the wait
    # And the new subscription carries the next completion.
    stack.worker()
    wait_for(lambda: stack.r.execute_command("PUBSUB", "NUMPAT") >= 1, 10, "the resubscribe")
    later = httpx.post(f"{base}/v1/jobs", json={"input": "later"}).json()
    t, out = _long_poll(base, later["id"], 30)
    t.join(40)
    assert out["body"]["status"] == "succeeded" and out["took"] < 20, out


def test_api_sigterm_answers_open_long_polls_at_once(stack: Stack) -> None:
    base = stack.api()
    job = httpx.post(f"{base}/v1/jobs", json={"input": "nobody serves me"}).json()
    t, out = _long_poll(base, job["id"], 50)
    wait_for(lambda: _waiting(base) >= 1, 10, "the long-poll to be waiting")
    api = next(p for p in stack.procs if p.name == "api")
    api.signal(signal.SIGTERM)
    t.join(40)
    assert out["status"] == 200 and out["body"]["status"] == "queued", out
    assert out["took"] < 30, out  # answered at the stop, not at the end of its 50 s wait
    # uvicorn ends by re-raising the signal it handled: a clean stop exits by SIGTERM.
    assert api.wait(20) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in api.log()
    assert "INFERQ_API_KEYS is not set: the API is open" in api.log()  # an open API says so
