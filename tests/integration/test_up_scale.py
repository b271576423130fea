"""`inferq up --workers 2 --apis 2`: two supervised workers and two API processes on one port.

Several hundred jobs from several threads, each on a fresh connection (so the kernel spreads
them over the API processes): every job succeeds once, both workers run jobs (the job view's
`worker`), both API processes answer (their `X-Inferq-Api` id, each logged at start) and each
holds its own completion subscriber; on SIGTERM the API processes stop before the workers.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import redis

from inferq.redis_server import free_port
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import ROOT, wait_for
from tests.integration.test_up import _stop

JOBS = 300
THREADS = 6


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def test_up_with_two_workers_and_two_api_processes(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {
        "INFERQ_MODEL": "echo",
        "INFERQ_DEVICE": "cpu",
        "INFERQ_DATA_DIR": str(tmp_path / "data"),
        # A little device time per batch, so one worker alone would fall behind.
        "INFERQ_ECHO_BATCH_DELAY_MS": "5",
        "INFERQ_MAX_BATCH_SIZE": "4",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "up.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    argv = [sys.executable, "-m", "inferq.cli", "up", "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(
        [*argv, "--apis", "2"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def both_workers_live() -> bool:
            assert proc.poll() is None, log_path.read_text()
            try:
                body = httpx.get(f"{base}/v1/health", timeout=1).json()
            except (httpx.HTTPError, ValueError):
                return False
            return len(body.get("models", {}).get("echo", {}).get("workers", [])) == 2

        wait_for(both_workers_live, 60, "two live workers behind inferq up", interval_s=0.1)
        served_by: collections.Counter[str] = collections.Counter()
        ran_on: collections.Counter[str] = collections.Counter()
        ids: set[str] = set()
        failures: list[str] = []
        lock = threading.Lock()

        def client(i: int) -> None:
            # No keep-alive: every request is a new connection, which either process may take.
            limits = httpx.Limits(max_keepalive_connections=0)
            with httpx.Client(base_url=base, timeout=30, limits=limits) as c:
                for n in range(i, JOBS, THREADS):
                    text = f"scale {n}"
                    r = c.post("/v1/infer", json={"input": text, "wait": 20})
                    body = r.json()
                    with lock:
                        served_by[r.headers.get("x-inferq-api", "?")] += 1
                        ran_on[body.get("worker", "?")] += 1
                        ids.add(body.get("id", ""))
                        if r.status_code != 200 or body["outputs"] != [expected_vector(text)]:
                            failures.append(f"{text}: {r.status_code} {r.text[:200]}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures[:5]
        assert len(ids) == JOBS  # one job per request

        out = log_path.read_text()
        logged = set(re.findall(r"api process ([0-9a-f]{8}) \(pid", out))
        print(f"requests per API process: {dict(served_by)}; jobs per worker: {dict(ran_on)}")
        assert set(served_by) == logged and len(logged) == 2, (served_by, logged)
        assert all(n > 0 for n in served_by.values())
        assert len(ran_on) == 2 and "?" not in ran_on, ran_on
        # One completion subscriber per API process, on the Redis `inferq up` started.
        redis_url = re.search(r"redis:\s+(redis://\S+)", out).group(1)  # type: ignore[union-attr]
        with redis.Redis.from_url(redis_url) as r:
            subscribers = [c for c in r.client_list() if int(c.get("psub", 0)) > 0]
        assert len(subscribers) == 2, subscribers
        # Workers sharing the CPU split its cores: one batch at a time on cores ÷ 2 threads.
        share = max(1, _cores() // 2)
        assert out.count(f"model threads: 1 batches at once, {share} threads each") == 2

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        _stop(proc)
        log.close()
    out = log_path.read_text()
    # Every job succeeded once: the two workers' stop lines add up to exactly JOBS.
    ok = [int(n) for n in re.findall(r"stopped after [\d.]+s: .* jobs ok=(\d+)", out)]
    assert len(ok) == 2 and sum(ok) == JOBS, ok
    stops = re.findall(r"\[inferq up\] (api #\d|worker cpu #\d) stopped \(code", out)
    assert sorted(stops[:2]) == ["api #0", "api #1"], stops  # the APIs first
    assert sorted(stops[2:]) == ["worker cpu #0", "worker cpu #1"], stops
    try:
        httpx.get(f"{base}/healthz", timeout=1)
        raise AssertionError("API still answering after inferq up stopped")
    except httpx.ConnectError:
        pass
