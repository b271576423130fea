"""``inferq up``: Redis, one worker and one API on this machine, supervised until Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from inferq.redis_server import RedisServer, RedisServerError, free_port

__all__ = ["next_backoff_s", "run_up"]

DEFAULT_REDIS_PORT = 6390
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_AFTER_S = 60.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.5


def next_backoff_s(prev_s: float, ran_for_s: float) -> float:
    """Delay before restarting a child that exited after ``ran_for_s`` seconds of running.

    ``prev_s`` is the delay used before its last restart (0 when it never crashed). A child
    that stayed up for a minute counts as healthy again and starts over at the first step.
    """
    if prev_s <= 0 or ran_for_s >= BACKOFF_RESET_AFTER_S:
        return BACKOFF_INITIAL_S
    return min(prev_s * 2, BACKOFF_MAX_S)


def _say(message: str) -> None:
    print(f"[inferq up] {message}", flush=True)


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Same option Redis uses, so a TIME_WAIT left by the last run does not look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


class _Child:
    """One supervised subprocess with its own restart backoff."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.backoff_s = 0.0
        self.restart_at = 0.0

    def start(self) -> None:
        # Own session: a terminal Ctrl-C reaches only the supervisor, which then stops the
        # API before the worker so no new jobs arrive while the worker drains its batch.
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        self.started_at = time.monotonic()

    def check(self, now: float) -> None:
        if self.proc is None:
            if now >= self.restart_at:
                self.start()
                _say(f"{self.name} restarted (pid {self.proc.pid if self.proc else '?'})")
            return
        code = self.proc.poll()
        if code is None:
            return
        ran_for_s = now - self.started_at
        self.backoff_s = next_backoff_s(self.backoff_s, ran_for_s)
        self.restart_at = now + self.backoff_s
        self.proc = None
        _say(
            f"{self.name} exited unexpectedly with code {code} after {ran_for_s:.1f}s; "
            f"restarting in {self.backoff_s:g}s"
        )

    def stop(self, timeout_s: float) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _say(f"{self.name} did not stop within {timeout_s:g}s; killing it")
                proc.kill()
                proc.wait()
        _say(f"{self.name} stopped (code {proc.returncode})")


def _start_redis(data_dir: Path) -> RedisServer:
    port = DEFAULT_REDIS_PORT if _port_free("127.0.0.1", DEFAULT_REDIS_PORT) else free_port()
    server = RedisServer(data_dir / "redis", port=port, appendonly=True)
    server.start()
    return server


def _check_redis(server: RedisServer, now: float, state: dict[str, float]) -> None:
    if server.running or now < state["restart_at"]:
        return
    _say(f"redis-server died; restarting it on port {server.port}")
    try:
        server.restart()
        state["backoff_s"] = 0.0
        _say(f"redis-server back up (pid {server.pid})")
    except RedisServerError as exc:
        state["backoff_s"] = next_backoff_s(state["backoff_s"], 0.0)
        state["restart_at"] = now + state["backoff_s"]
        _say(f"redis-server restart failed, retrying in {state['backoff_s']:g}s: {exc}")


def _install_handlers(handler: Callable[[int, FrameType | None], None]) -> dict[int, Any]:
    """Route SIGINT/SIGTERM to ``handler``; returns the old handlers to put back."""
    previous: dict[int, Any] = {}
    # signal.signal only works on the main thread (tests may drive run_up from another).
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    return previous


def _print_banner(host: str, port: int, worker: _Child, api: _Child) -> None:
    # A wildcard bind address is not something a browser can open.
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    shown = f"[{shown}]" if ":" in shown else shown
    _say(f"worker:  pid {worker.proc.pid if worker.proc else '?'}")
    _say(f"api:     http://{shown}:{port}  (pid {api.proc.pid if api.proc else '?'})")
    _say(f"docs:    http://{shown}:{port}/docs")
    _say("Ctrl-C to stop")


def run_up(
    *,
    host: str,
    port: int,
    model: str | None,
    data_dir: Path,
    redis_url: str | None,
    env: Mapping[str, str] | None = None,
) -> int:
    stop_signals: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop_signals.append(signum)

    previous = _install_handlers(on_signal)

    server: RedisServer | None = None
    children: list[_Child] = []
    try:
        if redis_url is None:
            try:
                server = _start_redis(Path(data_dir))
            except RedisServerError as exc:
                _say(f"could not start redis-server: {exc}")
                return 1
            redis_url = server.url
            _say(f"redis:   {redis_url}  (data in {server.data_dir}, {server.binary})")
        else:
            _say(f"redis:   {_redacted(redis_url)}  (external, not managed here)")

        child_env = dict(os.environ if env is None else env)
        child_env["INFERQ_REDIS_URL"] = redis_url
        if model:
            child_env["INFERQ_MODEL"] = model
        base = [sys.executable, "-m", "inferq.cli"]
        worker_args = ["--model", model] if model else []
        worker = _Child("worker", [*base, "worker", *worker_args], child_env)
        api = _Child("api", [*base, "api", "--host", host, "--port", str(port)], child_env)
        children = [api, worker]
        worker.start()
        api.start()

        _print_banner(host, port, worker, api)

        redis_state = {"backoff_s": 0.0, "restart_at": 0.0}
        while not stop_signals:
            now = time.monotonic()
            if server is not None:
                _check_redis(server, now, redis_state)
            for child in (worker, api):
                child.check(now)
            time.sleep(POLL_S)
        _say(f"got {signal.Signals(stop_signals[0]).name}; stopping")
        return 0
    finally:
        # API first so nothing new is accepted, then the worker so it can finish its batch
        # and hand back unstarted jobs, then Redis, which both still need until they exit.
        for child in children:
            child.stop(STOP_TIMEOUT_S)
        if server is not None:
            server.stop()
            _say("redis-server stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
