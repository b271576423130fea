"""Real processes for integration tests: workers and API servers on a real Redis.

Each process logs to a file under the test's tmp dir; the logs are printed when a
test fails so a broken stack explains itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from inferq.redis_server import free_port
from inferq.shared import keys

ROOT = Path(__file__).resolve().parents[2]


def metric(base: str, name: str, **labels: str) -> float:
    """The value of `name` with exactly `labels` on the API's /metrics (0 when absent)."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.02) -> Any:
    """Poll `cond` until truthy; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class Proc:
    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


class Stack:
    """Starts inferq processes against one Redis URL; stops them all at teardown."""

    def __init__(self, redis_url: str, tmp: Path, *, cluster: bool = False) -> None:
        self.redis_url = redis_url
        self.tmp = tmp
        self.cluster = cluster
        self.procs: list[Proc] = []
        # The commands tests use exist on both; a cluster client routes them by key.
        self.r: redis.Redis = (
            cast(redis.Redis, redis.RedisCluster.from_url(redis_url))
            if cluster
            else redis.Redis.from_url(redis_url)
        )

    def env(self, **overrides: Any) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
        env.update(
            INFERQ_REDIS_URL=self.redis_url,
            INFERQ_DEVICE="cpu",
            INFERQ_MODEL="echo",
            INFERQ_LOG_LEVEL="INFO",
            INFERQ_HEARTBEAT_S="0.2",
            INFERQ_READ_BLOCK_MS="200",
            PYTHONUNBUFFERED="1",
        )
        if self.cluster:
            env["INFERQ_REDIS_CLUSTER"] = "true"
        env.update({f"INFERQ_{k.upper()}": str(v) for k, v in overrides.items()})
        return env

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log_path = self.tmp / f"{name}-{len(self.procs)}.log"
        proc = Proc(name, [sys.executable, "-m", "inferq.cli", *args], env, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, *, model: str | None = None, wait: bool = True, **settings: Any) -> Proc:
        env = self.env(**settings)
        name = (model or env["INFERQ_MODEL"]).split("=")[0]
        proc = self._start("worker", ["worker"] + (["--model", model] if model else []), env)
        if wait:
            self.wait_worker(name, proc)
        return proc

    def wait_worker(self, model: str, proc: Proc, timeout_s: float = 60.0) -> None:
        def up() -> bool:
            if not proc.alive():
                raise AssertionError(f"worker exited ({proc.popen.returncode}):\n{proc.log()}")
            # Live, and this very process: a killed worker's entry lingers until its TTL.
            for member in self.r.zrangebyscore(
                keys.workers(model), int(time.time() * 1000), "+inf"
            ):
                if self.r.hget(keys.worker(member.decode()), "pid") == str(proc.pid).encode():
                    return True
            return False

        wait_for(up, timeout_s, f"a live {model} worker")

    def api(self, **settings: Any) -> str:
        port = free_port()
        proc = self._start("api", ["api", "--port", str(port)], self.env(**settings))
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if not proc.alive():
                raise AssertionError(f"api exited ({proc.popen.returncode}):\n{proc.log()}")
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 30, "the API to answer /healthz")
        return base

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} pid={p.pid} =====\n{p.log()}" for p in self.procs)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.r.close()
