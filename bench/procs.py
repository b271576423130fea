"""Child processes for the bench: start, wait for readiness, read peak memory, stop.

The same ideas as the integration tests' stack (log to a file, poll a condition with a
deadline, SIGTERM then SIGKILL), kept separate so the bench never imports from tests/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx


class BenchError(RuntimeError):
    """A system under test could not be started or measured; the message says which."""


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return value


class Proc:
    """One child process whose stdout+stderr go to `log_path`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.log_path = name, log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        # Its own process group: servers that fork or spawn workers (LitServe) are stopped
        # whole, not left running to skew the next measurement.
        self.popen = subprocess.Popen(
            argv,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")

    def log_size(self) -> int:
        with contextlib.suppress(OSError):
            return self.log_path.stat().st_size
        return 0

    def read_log(self, start: int = 0) -> str:
        with self.log_path.open("rb") as fh:
            fh.seek(start)
            return fh.read().decode(errors="replace")

    def tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        pgid = self.popen.pid  # the session leader: its pid is the group id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout_s)
        # Whatever the leader left behind (spawned workers) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._log.close()


def python(name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> Proc:
    return Proc(name, [sys.executable, *args], env, log_dir / f"{name}.log")


def wait_http(proc: Proc, url: str, timeout_s: float = 120.0) -> None:
    def ok() -> bool:
        proc.check()
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ok, timeout_s, f"{proc.name} at {url}", interval_s=0.2)


def children(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of `pid` in MiB; nan when it cannot be read."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> None:
    """Restart VmHWM counting from the current RSS (`5` to clear_refs; Linux ≥ 4.0)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def tree_peak_rss_mb(pid: int) -> float:
    """The largest VmHWM in `pid`'s process tree: the process that holds the model."""
    return max((peak_rss_mb(p) for p in children(pid)), default=float("nan"))


def reset_tree_peak(pid: int) -> None:
    for p in children(pid):
        reset_peak(p)


def bench_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env
