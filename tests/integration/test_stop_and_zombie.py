"""A stop always ends, and a frozen worker never clobbers: real worker processes, real Redis.

- SIGTERM under load, 20 times in a row: each worker exits 0 within INFERQ_DRAIN_S, and in
  the end every job succeeded and was published exactly once.
- A drain that cannot finish in INFERQ_DRAIN_S (a batch stuck on the device) still ends: the
  worker hands the job back, says why in one line and exits 3; another worker finishes it.
- A worker frozen (SIGSTOP) mid-batch past its heartbeat TTL is taken over; when it resumes
  (SIGCONT) its late results overwrite nothing and are not published again, it learns it
  lost its entries, and it carries on serving.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import httpx
import msgpack

from inferq.shared import keys
from inferq.shared.jobs import Status, decode_job
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for
from tests.integration.test_chaos import Publications, _report, _submit_all

DRAIN_S = 8


def _statuses(stack: Stack, ids: list[str]) -> list[str | None]:
    with stack.r.pipeline(transaction=False) as p:
        for job_id in ids:
            p.hget(keys.job(job_id), "status")
        return [None if s is None else msgpack.unpackb(s) for s in p.execute()]


def _final(stack: Stack, ids: list[str]) -> int:
    return sum(1 for s in _statuses(stack, ids) if s is not None and Status(s).is_final)


def test_sigterm_under_load_twenty_times_every_stop_ends_and_no_job_is_lost(stack: Stack) -> None:
    slow = dict(echo_batch_delay_ms=60, max_batch_size=8, drain_s=DRAIN_S, visibility_timeout_s=120)
    base = stack.api()
    pubs = Publications(stack.redis_url)
    ids: list[str] = []
    stops: list[float] = []
    texts: dict[str, str] = {}
    for round_ in range(20):
        worker = stack.worker(worker_id=f"term-{round_}", **slow)
        batch = [f"round {round_} job {i}" for i in range(24)]
        new = asyncio.run(_submit_all(base, batch))
        texts |= dict(zip(new, batch, strict=True))
        ids += new
        floor = _final(stack, ids)
        wait_for(lambda f=floor, i=ids: _final(stack, i) >= f + 4, 30, "progress in this round")
        t0 = time.monotonic()
        worker.signal(signal.SIGTERM)
        code = worker.wait(DRAIN_S + 10)  # a hang fails here, not at a test timeout
        stops.append(round(time.monotonic() - t0, 2))
        assert code == 0, worker.log()
        assert stops[-1] <= DRAIN_S + 2, (stops, worker.log())
        assert "stopped after" in worker.log()
    stack.worker(worker_id="term-last", **slow)
    wait_for(lambda: _final(stack, ids) == len(ids), 120, "every job final")
    wait_for(lambda: len(pubs.counts) >= len(ids), 10, "every completion published")
    pubs.close()
    jobs = [decode_job(stack.r.hgetall(keys.job(i))) for i in ids]
    wrong = [
        j.id
        for j in jobs
        if j.outputs is None or j.outputs.tolist() != [expected_vector(texts[j.id])]
    ]
    twice = [i for i in ids if pubs.counts[i] != 1]
    _report("e-sigterm-x20", {
        "jobs": len(ids), "succeeded": sum(j.status is Status.SUCCEEDED for j in jobs),
        "wrong_outputs": len(wrong), "published_not_once": len(twice),
        "stop_s_max": max(stops), "stop_s": stops,
    })  # fmt: skip
    assert all(j.status is Status.SUCCEEDED for j in jobs) and not wrong and not twice


def test_a_drain_past_its_bound_hands_back_and_exits_non_zero(stack: Stack) -> None:
    # Its start-up warm-up batch takes the delay too: 10 s keeps the test short and the batch
    # still well past the drain bound and the exit allowance below.
    stuck = stack.worker(
        worker_id="stuck", echo_batch_delay_ms=10_000, max_batch_size=1, drain_s=1,
        log_level="DEBUG",
    )  # fmt: skip
    base = stack.api()
    job = httpx.post(f"{base}/v1/jobs", json={"input": "outlives the drain"}, timeout=10).json()
    # Not `attempts`: an idle worker's claim counts a lone job's start a moment before its
    # batch reaches the device, and a stop in that moment rightly hands it back.
    wait_for(lambda: "batch on the device" in stuck.log(), 10, "the job to be on the device")
    assert decode_job(stack.r.hgetall(keys.job(job["id"]))).attempts == 1
    t0 = time.monotonic()
    stuck.signal(signal.SIGTERM)
    code = stuck.wait(20)
    took = time.monotonic() - t0
    assert code == 3, stuck.log()
    assert took < 1 + 5, took  # the bound plus the process's own exit, not the 10 s batch
    assert "drain did not finish within INFERQ_DRAIN_S=1s" in stuck.log()
    assert _statuses(stack, [job["id"]]) == ["queued"]  # handed back, not left to a timeout
    stack.worker(worker_id="rescuer")
    body = httpx.get(f"{base}/v1/jobs/{job['id']}", params={"wait": 20}, timeout=30).json()
    assert body["status"] == "succeeded" and body["worker"] == "rescuer", body


def test_a_frozen_worker_is_taken_over_and_never_clobbers_when_it_resumes(stack: Stack) -> None:
    quick = dict(heartbeat_ttl_s=1.0, heartbeat_s=0.2, read_block_ms=200, max_batch_size=4)
    a = stack.worker(worker_id="zombie", echo_batch_delay_ms=1500, prefetch_items=8, **quick)
    base = stack.api()
    pubs = Publications(stack.redis_url)
    texts = [f"held by the zombie {i}" for i in range(8)]
    ids = asyncio.run(_submit_all(base, texts))
    wait_for(lambda: "running" in _statuses(stack, ids), 10, "the zombie's first batch")
    wait_for(lambda: stack.r.xpending(keys.stream("echo"), keys.GROUP)["pending"] == 8, 10,
             "the zombie to hold all eight")  # fmt: skip
    held = stack.r.xpending(keys.stream("echo"), keys.GROUP)
    assert {c["name"] for c in held["consumers"]} == {b"zombie"}
    a.signal(signal.SIGSTOP)  # frozen mid-batch: no beats, no progress
    try:
        b = stack.worker(worker_id="rescuer", echo_batch_delay_ms=20, **quick)
        wait_for(lambda: _final(stack, ids) == len(ids), 30, "the rescuer to finish every job")
        before = {i: stack.r.hgetall(keys.job(i)) for i in ids}
    finally:
        a.signal(signal.SIGCONT)
    # Its in-flight batch ends (its result is refused: the job is final), and it lets go of the
    # rest of what it held, whichever comes first: its next beat finds them taken over ("lost
    # N jobs"), or its next batch's START finds them final and drops them. Either way its
    # beat record then says it holds nothing.
    wait_for(lambda: "batch items=" in a.log(), 10, "the zombie's late batch to end")
    wait_for(
        lambda: stack.r.hget(keys.worker("zombie"), "held_items") == b"0",
        15,
        "the zombie to let go of what it held",
    )
    # Two orders are both right for the in-flight batch: it ends first and FINISH refuses its
    # result (the jobs are final), or the beat notices first and the result is dropped unwritten.
    log_ = a.log()
    lost = re.search(r"lost \d+ jobs to another worker", log_)
    noticed_first = lost is not None and lost.start() < log_.index("batch items=")
    if not noticed_first:
        wait_for(lambda: "results not written: their jobs were already final" in a.log(), 10,
                 "the zombie's late result to be refused")  # fmt: skip
    assert {i: stack.r.hgetall(keys.job(i)) for i in ids} == before
    jobs = [decode_job(before[i]) for i in ids]
    assert all(j.status is Status.SUCCEEDED for j in jobs)
    assert [j.outputs.tolist() for j in jobs] == [[expected_vector(t)] for t in texts]  # type: ignore[union-attr]
    wait_for(lambda: len(pubs.counts) >= len(ids), 10, "completions")
    assert all(pubs.counts[i] == 1 for i in ids), pubs.counts
    # The rescuer's entries stayed the rescuer's; the zombie serves on.
    consumers = {
        c["name"]: c["pending"]
        for c in stack.r.xpending(keys.stream("echo"), keys.GROUP)["consumers"]
    }
    assert consumers.get(b"zombie", 0) == 0
    assert a.alive() and b.alive()
    r = httpx.post(
        f"{base}/v1/infer", json={"inputs": [f"after {i}" for i in range(4)]}, timeout=20
    )
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    pubs.close()
    a.stop()
    assert a.popen.returncode == 0, a.log()
