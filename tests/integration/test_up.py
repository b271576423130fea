"""`inferq up` end to end: its own Redis, a worker, the API; SIGTERM stops all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from inferq.redis_server import free_port
from tests.integration.stack import ROOT, wait_for


def test_inferq_up_serves_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env |= {
        "INFERQ_MODEL": "echo",
        "INFERQ_DEVICE": "cpu",
        "INFERQ_DATA_DIR": str(tmp_path / "data"),
    }
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
        assert (tmp_path / "data" / "redis" / "appendonlydir").exists()  # AOF on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    out = (tmp_path / "up.log").read_text()
    assert base in out
    # nothing left listening
    try:
        httpx.get(f"{base}/healthz", timeout=1)
        raise AssertionError("API still answering after inferq up stopped")
    except httpx.ConnectError:
        pass
