"""Redis Sentinel and INFERQ_REDIS_WAIT_REPLICAS, with real processes.

A master, one replica and three sentinels on free ports; an `echo` worker and an API that
know only the sentinels (their INFERQ_REDIS_URL points nowhere). Client threads submit (with
an Idempotency-Key, retrying 503s) and long-poll while the master is failed over twice: by
`SENTINEL FAILOVER` (the old master keeps serving the clients already connected to it until
the sentinels demote it, about ten seconds later) and by SIGKILL. With
INFERQ_REDIS_WAIT_REPLICAS=1 no acknowledged job may be lost.

What "twice" can mean across a failover, and what is asserted:

- *duplicated*: two job records for one client request on the surviving master. Never.
- *ran twice*: the worker ran a job again because the result it wrote went to a master whose
  last writes were then discarded (results are replicated asynchronously). Allowed, counted.
- *republished*: a client read a final result that was later replaced by such a re-run's
  (same outcome, newer timings). Allowed, counted; the outputs must be the same.

Numbers go to test-artifacts/sentinel-failover.json.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from redis.sentinel import Sentinel

from inferq.redis_server import RedisServer, RedisServerError, find_redis_server, free_port
from inferq.shared import keys
from inferq.shared.jobs import Job, decode_job
from inferq.worker.models.echo import EchoModel, expected_vector
from tests.conftest import in_ci
from tests.integration.stack import ROOT, Stack, wait_for

MASTER = "mymaster"
RUN_LOG_ENV = "SENTINEL_TEST_RUN_LOG"  # not INFERQ_: read by LoggedEcho, not by Settings
ARTIFACTS = ROOT / "test-artifacts"
FINAL = {"succeeded", "failed", "expired", "cancelled"}
# Each failover phase waits for this many new acknowledged submits: proof the API follows.
PER_PHASE = 40
IN_FLIGHT = 4  # jobs each client thread submits before it waits for them


class LoggedEcho(EchoModel):
    """echo that appends every text it runs to $SENTINEL_TEST_RUN_LOG (one write per batch,
    O_APPEND, so concurrent batches never interleave a line)."""

    def run(self, batch: list[Any]) -> np.ndarray:
        fd = os.open(os.environ[RUN_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(f"{t}\n" for t in batch).encode())
        finally:
            os.close(fd)
        return super().run(batch)


@pytest.fixture(scope="module")
def redis_binary() -> str:
    try:
        return find_redis_server()
    except RedisServerError as e:
        if in_ci():
            pytest.fail(f"CI is set but no redis-server is available: {e}")
        pytest.skip(f"no redis-server: {e}")


def _node(path: Path, *replica_of: int) -> RedisServer:
    args = ["--repl-diskless-sync-delay", "0"]  # a (re)joining replica syncs at once
    if replica_of:
        args += ["--replicaof", "127.0.0.1", str(replica_of[0])]
    return RedisServer(path, appendonly=False, extra_args=args)


class SentinelNode:
    """One `redis-server --sentinel` on a free port, watching `MASTER` with short timeouts."""

    def __init__(self, binary: str, tmp: Path, index: int, master_port: int) -> None:
        self.port = free_port()
        conf = tmp / f"sentinel-{index}.conf"  # sentinel rewrites its config: one file each
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {tmp}\n"
            f"logfile {tmp / f'sentinel-{index}.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            # Also the least time between two failovers of one master (2×): keep it short.
            f"sentinel failover-timeout {MASTER} 2000\n"
        )
        self.proc = subprocess.Popen(
            [binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.client = redis.Redis(port=self.port, socket_timeout=1)

    def master_port(self) -> int | None:
        try:
            addr: Any = self.client.sentinel_get_master_addr_by_name(MASTER)
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    def sees_everyone(self) -> bool:
        try:
            state: Any = self.client.sentinel_master(MASTER)
        except redis.RedisError:
            return False
        return bool(state["num-slaves"] >= 1 and state["num-other-sentinels"] == 2)

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@dataclass
class Load:
    """Client threads: submit (retrying 503 with the same Idempotency-Key), then long-poll to
    a final state; what they were acknowledged and what they saw, under one lock."""

    base: str
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: dict[str, str] = field(default_factory=dict)  # job id → its text
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)  # job id → final view
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    given_up: int = 0  # submits never acknowledged before the load stopped (not accepted)

    def count(self, answer: str) -> None:
        with self.lock:
            self.answers[answer] += 1

    def _call(self, c: httpx.Client, method: str, url: str, **kw: Any) -> httpx.Response | None:
        try:
            r = c.request(method, url, **kw)
        except httpx.HTTPError as e:
            self.count(type(e).__name__)
            return None
        self.count(str(r.status_code))
        return r

    def submit(self, c: httpx.Client, text: str) -> str | None:
        key = uuid.uuid4().hex
        while not self.stop.is_set():
            r = self._call(
                c, "POST", "/v1/jobs", json={"input": text}, headers={"Idempotency-Key": key}
            )
            if r is not None and r.status_code in (200, 202):
                job_id: str = r.json()["id"]
                with self.lock:
                    self.accepted[job_id] = text
                return job_id
            # 503: no master yet, or the replicas do not have it yet (WAIT); both retryable.
            assert r is None or r.status_code == 503, (r.status_code, r.text)
            time.sleep(0.05)
        with self.lock:
            self.given_up += 1
        return None

    def final(self, c: httpx.Client, job_id: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # 404 is retried too: during a manual failover an API connection still on the old
            # master does not see a job created on the new one.
            r = self._call(c, "GET", f"/v1/jobs/{job_id}", params={"wait": 3})
            if r is not None and r.status_code == 200 and r.json()["status"] in FINAL:
                with self.lock:
                    self.seen[job_id] = r.json()
                return
            if r is None or r.status_code != 200:
                time.sleep(0.05)

    def client(self, i: int) -> None:
        """Rounds of IN_FLIGHT submits, then their long-polls: jobs queue up on the worker."""
        with httpx.Client(base_url=self.base, timeout=10) as c:
            n = 0
            while not self.stop.is_set():
                ids = [self.submit(c, f"sentinel {i}-{n + k}") for k in range(IN_FLIGHT)]
                n += IN_FLIGHT
                for job_id in ids:
                    if job_id is not None:
                        self.final(c, job_id)

    def acknowledged(self) -> int:
        with self.lock:
            return len(self.accepted)


def _synced_replica(port: int) -> bool:
    """The node on `port` is a replica whose initial sync is done (WAIT counts it from now)."""
    try:
        with redis.Redis(port=port, socket_timeout=1) as r:
            info = r.info("replication")
    except redis.RedisError:
        return False
    return info["role"] == "slave" and info.get("master_link_status") == "up"


@pytest.fixture
def cluster(
    redis_binary: str, tmp_path: Path
) -> Iterator[tuple[RedisServer, RedisServer, list[SentinelNode]]]:
    first = _node(tmp_path / "a")
    first.start()
    second = _node(tmp_path / "b", first.port)
    second.start()
    sentinels = [SentinelNode(redis_binary, tmp_path, i, first.port) for i in range(3)]
    try:
        # Sentinels find the replica and each other through the master (INFO, hello messages).
        wait_for(lambda: all(s.sees_everyone() for s in sentinels), 20, "sentinels to agree")
        yield first, second, sentinels
    finally:
        for s in sentinels:
            s.stop()
        second.kill()
        first.kill()


def _final_records(r: redis.Redis, ids: list[str]) -> dict[str, Job | None]:
    with r.pipeline(transaction=False) as p:
        for job_id in ids:
            p.hgetall(keys.job(job_id))
        raws = p.execute()
    return {i: (decode_job(raw) if raw else None) for i, raw in zip(ids, raws, strict=True)}


def _fail_over_twice(
    load: Load, first: RedisServer, second: RedisServer, sentinels: list[SentinelNode]
) -> dict[str, Any]:
    """Under load: SENTINEL FAILOVER to `second`, then SIGKILL it; after each, wait for
    PER_PHASE more acknowledged submits (the API followed the master)."""
    marks = [0]

    def progressed() -> None:
        floor = marks[-1] + PER_PHASE
        wait_for(lambda: load.acknowledged() >= floor, 40, f"{floor} acknowledged submits")
        marks.append(load.acknowledged())

    progressed()
    # 1. Manual: the replica is promoted at once; the old master, still taking writes from the
    # clients connected to it, is demoted (and its writes since the promotion dropped) later.
    t0 = time.monotonic()
    sentinels[0].client.execute_command("SENTINEL", "FAILOVER", MASTER)
    wait_for(lambda: sentinels[0].master_port() == second.port, 20, "the switch to b")
    wait_for(lambda: _synced_replica(first.port), 30, "the old master to rejoin as a replica")
    manual_s = time.monotonic() - t0
    progressed()
    # 2. The master dies; the sentinels promote the other node; it comes back as a replica.
    t0 = time.monotonic()
    second.kill()
    wait_for(lambda: all(s.master_port() == first.port for s in sentinels), 30, "switch to a")
    killed_s = time.monotonic() - t0
    second.start()  # same arguments: a replica of `first`, the master again
    progressed()
    return {
        "acknowledged_per_phase": [b - a for a, b in itertools.pairwise(marks)],
        "manual_failover_to_rejoined_s": round(manual_s, 1),
        "kill_to_new_master_s": round(killed_s, 1),
    }


def _audit(
    load: Load, r: redis.Redis, run_log: Path, job_keys: list[bytes] | None = None
) -> dict[str, list[str]]:
    """Every acknowledged job against the surviving master, the worker's runs and what the
    clients saw (see the module docstring for what each list means). `job_keys`: every job
    record's key, where a scan of `r` would not list each once (a cluster)."""
    ids = sorted(load.accepted)
    finals: dict[str, Job | None] = {}

    def all_final() -> bool:
        finals.update(_final_records(r, ids))
        return all(j is not None and j.status.is_final for j in finals.values())

    wait_for(all_final, 30, "every acknowledged job to be final", interval_s=0.2)
    right = {i: [expected_vector(load.accepted[i])] for i in ids}
    ok = [
        i
        for i in ids
        if (j := finals[i]) is not None
        and str(j.status) == "succeeded"
        and j.outputs is not None
        and j.outputs.tolist() == right[i]
    ]
    per_text: collections.Counter[str] = collections.Counter()
    for key in job_keys if job_keys is not None else r.scan_iter(match=keys.job("*"), count=1000):
        raw = r.hgetall(key)
        if raw and (job := decode_job(raw)).inputs and isinstance(job.inputs[0], str):
            per_text[job.inputs[0]] += 1
    runs = collections.Counter(run_log.read_text().splitlines())
    return {
        "completed": ok,
        "lost_or_wrong": [i for i in ids if i not in ok],
        "duplicated": [i for i in ids if per_text[load.accepted[i]] > 1],
        "never_ran": [i for i in ids if runs[load.accepted[i]] == 0],
        "ran_twice": [i for i in ids if runs[load.accepted[i]] > 1],
        "seen_wrong": [
            i
            for i, view in load.seen.items()
            if view["status"] != "succeeded" or view["outputs"] != right[i]
        ],
        "republished": [
            i
            for i, view in load.seen.items()
            if (j := finals[i]) is not None
            and view["timings"]["total_ms"] != j.timings()["total_ms"]
        ],
    }


def report_failover(
    name: str, load: Load, audit: dict[str, list[str]], timings: dict[str, Any], started: float
) -> None:
    """Write the run's numbers to test-artifacts/<name>-failover.json, then assert that no
    acknowledged job was lost, duplicated, never run or seen wrong, and that every client
    saw each of its jobs end."""
    numbers = {
        "accepted": len(load.accepted),
        **{claim: len(ids) for claim, ids in audit.items()},
        "never_acknowledged": load.given_up,
        **timings,
        "answers": dict(load.answers),
        "duration_s": round(time.monotonic() - started, 1),
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"{name}-failover.json").write_text(json.dumps(numbers, indent=2))
    print(f"{name} failover: {numbers}")
    for claim in ("lost_or_wrong", "duplicated", "never_ran", "seen_wrong"):
        assert not audit[claim], (claim, audit[claim][:5])
    assert set(load.seen) == set(load.accepted)


def test_api_and_worker_follow_two_failovers_and_lose_no_acknowledged_job(
    cluster: tuple[RedisServer, RedisServer, list[SentinelNode]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second, sentinels = cluster
    started = time.monotonic()
    run_log = tmp_path / "runs.log"
    monkeypatch.setenv(RUN_LOG_ENV, str(run_log))
    # Nothing listens on port 1: the clients must find the master through the sentinels.
    stack = Stack("redis://127.0.0.1:1/0", tmp_path)
    stack.r.close()
    follower = Sentinel([("127.0.0.1", s.port) for s in sentinels], socket_timeout=1)
    stack.r = follower.master_for(MASTER, socket_timeout=2)  # the test's own view follows too
    common: dict[str, Any] = {
        "redis_sentinels": ",".join(f"127.0.0.1:{s.port}" for s in sentinels),
        "long_poll_recheck_s": 0.5,
    }
    load: Load | None = None
    threads: list[threading.Thread] = []
    try:
        stack.worker(model=f"echo={__name__}:LoggedEcho", echo_batch_delay_ms=10, **common)
        load = Load(stack.api(redis_wait_replicas=1, **common))
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        timings = _fail_over_twice(load, first, second, sentinels)
        load.stop.set()
        for t in threads:
            t.join(70)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        # The API's completion subscriber resubscribed on the master that survived.
        wait_for(
            lambda: any(int(c.get("psub", 0)) for c in stack.r.client_list()),
            10,
            "the API's subscriber on the last master",
        )
        audit = _audit(load, stack.r, run_log)
        report_failover("sentinel", load, audit, timings, started)
    except BaseException:
        print(stack.logs())
        raise
    finally:
        if load is not None:
            load.stop.set()
        for t in threads:
            t.join(10)
        stack.close()
        for s in follower.sentinels:
            s.close()


def test_wait_replicas_refuses_an_unreplicated_submit_and_its_retry(
    tmp_path: Path, redis_binary: str
) -> None:
    """No replica: 503, although the job is recorded; the retry with the same key is refused
    too (it found the job but could not wait for it). Once a replica has synced, the retry is
    acknowledged, with the first job's id: one job in all."""
    master = _node(tmp_path / "m")
    master.start()
    replica = _node(tmp_path / "r", master.port)
    stack = Stack(master.url, tmp_path)
    try:
        stack.worker()
        base = stack.api(redis_wait_replicas=1, redis_timeout_s=1)
        key = {"Idempotency-Key": "only-once"}
        with httpx.Client(base_url=base, timeout=10) as c:
            first = c.post("/v1/jobs", json={"input": "replicate me"}, headers=key)
            assert first.status_code == 503 and first.headers["Retry-After"] == "1"
            again = c.post("/v1/jobs", json={"input": "replicate me"}, headers=key)
            assert again.status_code == 503
            (job_key,) = stack.r.scan_iter(match=keys.job("*"))  # recorded once, on the master
            replica.start()
            wait_for(lambda: _synced_replica(replica.port), 10, "the replica to sync")
            answers: list[httpx.Response] = []

            def acknowledged() -> bool:  # a client retries a 503 (the replica may still lag)
                answers.append(c.post("/v1/jobs", json={"input": "replicate me"}, headers=key))
                return answers[-1].status_code == 202

            wait_for(acknowledged, 15, "the retry to be acknowledged", interval_s=0.2)
            ok = answers[-1]
            assert keys.job(ok.json()["id"]).encode() == job_key
            done = c.get(f"/v1/jobs/{ok.json()['id']}", params={"wait": 10}).json()
            assert done["status"] == "succeeded"
            assert done["outputs"] == [expected_vector("replicate me")]
            assert len(list(stack.r.scan_iter(match=keys.job("*")))) == 1
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.close()
        replica.kill()
        master.kill()
