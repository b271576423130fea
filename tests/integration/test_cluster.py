"""Redis Cluster with sharded streams, with real processes: 3 masters + 3 replicas on free
ports (`inferq.redis_cluster`), `INFERQ_REDIS_CLUSTER=true`, `INFERQ_STREAM_SHARDS=3`.

The core path, long-poll, idempotency, priorities and take-over run on it; then a master
is SIGKILLed under load (with `INFERQ_REDIS_WAIT_REPLICAS=1`): its replica takes its slots
and every job the API acknowledged completes. Numbers go to test-artifacts/cluster-failover.json.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import redis
from redis.crc import key_slot

from inferq.redis_cluster import LocalCluster
from inferq.shared import keys
from inferq.shared.jobs import decode_job
from inferq.shared.schema import JobField
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for
from tests.integration.test_sentinel import RUN_LOG_ENV, Load, _audit, report_failover

SHARDS = 3


async def _submit(base: str, bodies: list[dict[str, Any]], **headers: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        return list(
            await asyncio.gather(*(c.post("/v1/jobs", json=b, headers=headers) for b in bodies))
        )


def _shard_of(job_id: str) -> int:
    where = keys.job_shard(job_id)
    assert where is not None, job_id
    return where[1]


def test_jobs_spread_over_shards_and_long_poll_on_a_cluster(cstack: Stack) -> None:
    cstack.worker(stream_shards=SHARDS)
    base = cstack.api(stream_shards=SHARDS)
    texts = [f"cluster {i}" for i in range(30)]
    replies = asyncio.run(_submit(base, [{"input": t} for t in texts]))
    assert all(r.status_code == 202 for r in replies), [r.text for r in replies]
    ids = [r.json()["id"] for r in replies]
    # Unpinned jobs take the shards in turn, and each record lives in its shard's slot.
    assert collections.Counter(_shard_of(i) for i in ids) == {0: 10, 1: 10, 2: 10}
    for i in ids:
        assert key_slot(keys.job(i).encode()) == key_slot(
            keys.stream("echo", shard=_shard_of(i), shards=SHARDS).encode()
        )
    # The three shards' slots are on different masters: the model uses the whole cluster.
    owners = {
        cstack.r.get_node_from_key(keys.stream("echo", shard=s, shards=SHARDS)).name
        for s in range(SHARDS)
    }  # type: ignore[attr-defined]
    assert len(owners) == SHARDS
    with httpx.Client(base_url=base, timeout=30) as c:
        for job_id, text in zip(ids, texts, strict=True):
            view = c.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
            assert view["status"] == "succeeded", view
            assert view["outputs"] == [expected_vector(text)]
        r = c.post("/v1/infer", json={"inputs": ["a", "b"]})
        assert r.status_code == 200 and r.json()["outputs"] == [
            expected_vector("a"),
            expected_vector("b"),
        ]
        # Everything final released its admission counts on every shard.
        wait_for(lambda: all(int(cstack.r.get(keys.queued_items("echo", s, SHARDS)) or 0) == 0
                             for s in range(SHARDS)), 10, "counters back to 0")  # fmt: skip
        # GET /v1/jobs merges the three shards' indexes (three masters), page by page.
        listed: list[str] = []
        after: str | None = None
        while True:
            page = c.get("/v1/jobs", params={"limit": 7, **({"after": after} if after else {})})
            assert page.status_code == 200, page.text
            listed += [j["id"] for j in page.json()["data"]]
            if not page.json()["has_more"]:
                break
            after = page.json()["last_id"]
        assert len(listed) == len(set(listed)) == 31 and set(ids) < set(listed)


def test_completions_reach_the_waiting_api_process_on_a_cluster(cstack: Stack) -> None:
    """Each shard's FINISH tells the API process that waits: a long poll on a second process
    (LISTEN on the job's shard), and a process's own sync requests. The re-read timer is
    past the waits, so an answer well before a wait's end came from a message."""
    slow = {"long_poll_recheck_s": 120, "max_long_poll_s": 120, "stream_shards": SHARDS}
    a, b = cstack.api(**slow), cstack.api(**slow)
    with httpx.Client(timeout=60) as c:
        job_id = c.post(f"{a}/v1/jobs", json={"input": "polled on b"}).json()["id"]
        polled: dict[str, httpx.Response] = {}
        poller = threading.Thread(
            target=lambda: polled.setdefault(
                "r", httpx.get(f"{b}/v1/jobs/{job_id}", params={"wait": 20}, timeout=60)
            )
        )
        poller.start()

        def named() -> int:
            raw = cstack.r.hget(keys.job(job_id), JobField.LISTENERS)
            return 0 if raw is None else len(msgpack.unpackb(raw).split())

        wait_for(lambda: named() == 2, 10, "B's poll to name B")
        cstack.worker(stream_shards=SHARDS)
        poller.join(60)
        r = polled["r"]
        assert r.json()["status"] == "succeeded" and r.elapsed.total_seconds() < 10, r.text
        for i in range(SHARDS):  # unpinned jobs take the shards in turn
            r = c.post(f"{a}/v1/infer", json={"input": f"told {i}", "wait": 20})
            assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
            assert r.elapsed.total_seconds() < 10, r.elapsed


def test_idempotency_keys_meet_their_first_job_on_a_cluster(
    cstack: Stack, local_cluster: LocalCluster
) -> None:
    cstack.worker(stream_shards=SHARDS)
    base = cstack.api(stream_shards=SHARDS)
    bodies = [{"input": f"idem {i}"} for i in range(6)]
    firsts, repeats = [], []
    for i, body in enumerate(bodies):
        key = f"key-{i}"
        firsts.append(asyncio.run(_submit(base, [body], **{"Idempotency-Key": key}))[0])
        # Concurrent repeats of the same key: one job in all.
        repeats += [
            (r, firsts[-1])
            for r in asyncio.run(_submit(base, [body] * 4, **{"Idempotency-Key": key}))
        ]
    assert all(r.status_code == 202 for r in firsts)
    assert all(r.json()["id"] == first.json()["id"] for r, first in repeats)
    assert len({_shard_of(r.json()["id"]) for r in firsts}) > 1  # keys pin different shards
    records = local_cluster.keys_on_masters(keys.job("*"))
    assert len(records) == len(bodies)


def test_high_priority_overtakes_low_across_shards(cstack: Stack) -> None:
    # Everything is queued, across all shards, before the worker starts: how fast the submits
    # go cannot decide the order (a worker already running ran the low ones while the high
    # ones were still being sent). Then one job at a time, slowly.
    base = cstack.api(stream_shards=SHARDS)
    blocker = asyncio.run(_submit(base, [{"input": "first"}]))[0].json()["id"]
    low = [
        r.json()["id"]
        for r in asyncio.run(
            _submit(base, [{"input": f"low {i}", "priority": "low"} for i in range(9)])
        )
    ]
    high = [
        r.json()["id"]
        for r in asyncio.run(
            _submit(base, [{"input": f"high {i}", "priority": "high"} for i in range(9)])
        )
    ]
    assert {_shard_of(i) for i in low} == {_shard_of(i) for i in high} == set(range(SHARDS))
    cstack.worker(stream_shards=SHARDS, echo_batch_delay_ms=60, max_batch_size=1, prefetch_items=1)
    with httpx.Client(base_url=base, timeout=30) as c:
        started = {
            i: c.get(f"/v1/jobs/{i}", params={"wait": 20}).json() for i in [blocker, *low, *high]
        }
    assert all(v["status"] == "succeeded" for v in started.values())
    finish = {i: decode_job(cstack.r.hgetall(keys.job(i))).finished_ms for i in low + high}
    # Lanes are read high first (a low lane still goes first once in 8 reads, never starved).
    high_done = sorted(finish[i] for i in high)
    low_done = sorted(finish[i] for i in low)
    assert high_done[-1] < low_done[-3], (high_done, low_done)
    assert sum(high_done) / len(high) < sum(low_done) / len(low)


def test_a_killed_worker_is_taken_over_on_a_cluster(cstack: Stack) -> None:
    quick = dict(stream_shards=SHARDS, heartbeat_ttl_s=1.0, heartbeat_s=0.2, read_block_ms=200)
    a = cstack.worker(worker_id="doomed", echo_batch_delay_ms=400, prefetch_items=12, **quick)
    base = cstack.api(stream_shards=SHARDS)
    texts = [f"taken over {i}" for i in range(12)]
    ids = [r.json()["id"] for r in asyncio.run(_submit(base, [{"input": t} for t in texts]))]

    def held_by_doomed() -> int:
        n = 0
        for s in range(SHARDS):
            for lane in keys.LANES:
                try:
                    info = cstack.r.xpending(keys.stream("echo", lane, s, SHARDS), keys.GROUP)
                except redis.ResponseError:
                    continue
                n += sum(int(c["pending"]) for c in info["consumers"] if c["name"] == b"doomed")
        return n

    wait_for(lambda: held_by_doomed() >= 6, 20, "the doomed worker to hold jobs")
    a.signal(signal.SIGKILL)
    cstack.worker(worker_id="rescuer", echo_batch_delay_ms=5, **quick)
    with httpx.Client(base_url=base, timeout=30) as c:
        for job_id, text in zip(ids, texts, strict=True):
            view = c.get(f"/v1/jobs/{job_id}", params={"wait": 20}).json()
            assert view["status"] == "succeeded" and view["outputs"] == [expected_vector(text)]
    assert held_by_doomed() == 0


def test_a_master_killed_under_load_loses_no_acknowledged_job(
    cstack: Stack, local_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic()
    run_log = tmp_path / "runs.log"
    monkeypatch.setenv(RUN_LOG_ENV, str(run_log))
    common: dict[str, Any] = {"stream_shards": SHARDS, "long_poll_recheck_s": 0.5}
    cstack.worker(
        model="echo=tests.integration.test_sentinel:LoggedEcho", echo_batch_delay_ms=10, **common
    )
    load = Load(cstack.api(redis_wait_replicas=1, **common))
    threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: load.acknowledged() >= 40, 40, "40 acknowledged submits")
        victim = local_cluster.master_of(keys.stream("echo", shard=0, shards=SHARDS))
        with load.lock:
            before = set(load.accepted)
        t0 = time.monotonic()
        victim.kill()
        local_cluster.wait_promoted(victim, keys.stream("echo", shard=0, shards=SHARDS))
        promoted_s = time.monotonic() - t0
        # The promoted replica has no replica of its own, so WAIT 1 refuses every submit on
        # its shard (503, retried) until the old master comes back as its replica.
        victim.start()
        local_cluster.wait_ok(30)

        # Shard 0's slots have a new master and take submits again.
        def new_on_shard0() -> int:
            with load.lock:
                return sum(1 for i in load.accepted if i not in before and _shard_of(i) == 0)

        wait_for(lambda: new_on_shard0() >= 10, 40, "10 more acknowledged submits on shard 0")
        load.stop.set()
        for t in threads:
            t.join(70)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        audit = _audit(load, cstack.r, run_log, local_cluster.keys_on_masters(keys.job("*")))
        report_failover(
            "cluster", load, audit, {"kill_to_cluster_ok_s": round(promoted_s, 1)}, started
        )
        assert not [a for a in load.answers if a.startswith("5") and a != "503"], load.answers
    finally:
        load.stop.set()
        for t in threads:
            t.join(10)


def test_a_fresh_start_reaches_a_cluster_whose_first_named_node_is_dead(
    cstack: Stack, local_cluster: LocalCluster
) -> None:
    """INFERQ_REDIS_URL as a seed list: with its first node SIGKILLed and its replica
    promoted, a worker and an API started afterwards, with the same setting, reach the
    cluster through the other seeds, and 200 jobs all complete."""
    stream = keys.stream("echo", shard=0, shards=SHARDS)
    victim = local_cluster.master_of(stream)
    others = [n for n in local_cluster.nodes if n is not victim]
    seeds = "redis://" + ",".join(f"{n.host}:{n.port}" for n in [victim, *others])
    local_cluster.wait_synced()
    victim.kill()
    try:
        local_cluster.wait_promoted(victim, stream)
        common: dict[str, Any] = {"stream_shards": SHARDS, "redis_url": seeds}
        cstack.worker(**common)
        base = cstack.api(**common)
        texts = [f"seeded {i}" for i in range(200)]
        replies = asyncio.run(_submit(base, [{"input": t} for t in texts]))
        assert [r.status_code for r in replies] == [202] * 200, [r.text for r in replies[:3]]
        with httpx.Client(base_url=base, timeout=30) as c:
            for r, text in zip(replies, texts, strict=True):
                view = c.get(f"/v1/jobs/{r.json()['id']}", params={"wait": 20}).json()
                assert view["status"] == "succeeded", view
                assert view["outputs"] == [expected_vector(text)]
    finally:
        victim.start()
        local_cluster.wait_ok(30)
