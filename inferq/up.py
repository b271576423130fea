"""``inferq up``: Redis, the workers and the API processes on this machine, supervised until
Ctrl-C.

By default one worker and one API process; on a CUDA host two workers a GPU and about half
the cores left as API processes (``default_scale``). ``--devices`` starts one worker per device
(``all``: every CUDA device torch sees, else one on the CPU), ``--workers N`` N per device
(on a CPU they split the cores), ``--apis N`` N API processes. The supervisor binds the API
port itself and every API process accepts on that one socket (the kernel hands each new
connection to one of them), so N processes serve one port, each with its own Redis pool and
completion subscriber, and a restarting one never closes the port. Each child restarts on
its own with backoff; on stop the API processes go first (all at once), then the workers
(all at once, each draining), then Redis.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from inferq.redis_server import RedisServer, RedisServerError, free_port
from inferq.worker.calibration.fit import parse_budget
from inferq.worker.memory import host_total_bytes

__all__ = [
    "UpPlan",
    "cuda_devices",
    "default_scale",
    "host_gpus",
    "next_backoff_s",
    "plan_workers",
    "resolve_devices",
    "run_up",
]

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

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], pass_fds: Sequence[int] = ()
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.pass_fds = tuple(pass_fds)  # the shared listening socket, for API processes
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.backoff_s = 0.0
        self.restart_at = 0.0

    def start(self) -> None:
        # Own session: a terminal Ctrl-C reaches only the supervisor, which then stops the
        # API before the worker so no new jobs arrive while the worker drains its batch.
        self.proc = subprocess.Popen(
            self.argv, env=self.env, start_new_session=True, pass_fds=self.pass_fds
        )
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

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def reap(self, timeout_s: float) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _say(f"{self.name} did not stop within {STOP_TIMEOUT_S:g}s; killing it")
            proc.kill()
            proc.wait()
        _say(f"{self.name} stopped (code {proc.returncode})")


def _stop_all(group: Sequence[_Child], timeout_s: float) -> None:
    """SIGTERM the whole group at once (they drain in parallel), then wait for each."""
    for child in group:
        child.terminate()
    deadline = time.monotonic() + timeout_s
    for child in group:
        child.reap(max(0.0, deadline - time.monotonic()))


# --- what to start --------------------------------------------------------------------------

_DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|auto)$")


def _output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def cuda_devices() -> list[str]:
    """`cuda:0` … as torch numbers them (CUDA_VISIBLE_DEVICES applies), counted in a child
    process so the supervisor never holds a CUDA context; nvidia-smi when torch is absent.
    A CPU-only torch counts none, rightly: its workers could not use a GPU."""
    if importlib.util.find_spec("torch") is not None:
        out = _output([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"])
        lines = out.split()
        count = int(lines[-1]) if lines and lines[-1].isdigit() else 0
    elif shutil.which("nvidia-smi"):
        out = _output(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
        count = len([line for line in out.splitlines() if line.strip()])
    else:
        count = 0
    return [f"cuda:{i}" for i in range(count)]


def resolve_devices(spec: str | None) -> list[str] | None:
    """`--devices`: None (not given: the worker's INFERQ_DEVICE decides), `all` (every CUDA
    device, else the CPU), or a comma-separated list such as `cuda:0,cuda:1`."""
    if spec is None:
        return None
    if spec.strip() == "all":
        return cuda_devices() or ["cpu"]
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    bad = [d for d in devices if not _DEVICE.match(d)]
    if not devices or bad:
        raise ValueError(f"want 'all', or devices such as 'cuda:0,cuda:1' or 'cpu'; got {spec!r}")
    return devices


def host_gpus(devices: list[str] | None, device_setting: str) -> int:
    """How many GPUs `inferq up` will start workers on: the CUDA devices of `--devices`, or
    with none given and INFERQ_DEVICE auto or cuda, the host's (asking torch only where a
    driver is present, so a CPU host starts as fast as ever)."""
    if devices is not None:
        return sum(d.startswith("cuda") for d in devices)
    if device_setting not in ("auto", "cuda") and not device_setting.startswith("cuda:"):
        return 0
    if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return 0
    return 1 if cuda_devices() else 0  # workers go to INFERQ_DEVICE's one device


# On a GPU the process's Python, not the device, is the cap (an H200 with one worker: the
# worker at 1.04 cores, one GIL, the GPU 6 % busy; 3 workers + 6 APIs: 1.5× the items/s,
# the APIs at 0.65-0.72 cores each). So a CUDA host runs two workers a GPU and gives the API
# processes half of the cores left once the workers and Redis have theirs.
GPU_WORKERS = 2
MAX_AUTO_APIS = 16


def default_scale(gpus: int, cores: int) -> tuple[int, int]:
    """(workers per device, API processes) when `--workers` / `--apis` are not given: one of
    each on a CPU host (what beat the plain FastAPI pattern on 2 cores), more on a GPU host."""
    if gpus == 0:
        return 1, 1
    left = cores - gpus * GPU_WORKERS - 1  # one core for Redis
    return GPU_WORKERS, max(1, min(MAX_AUTO_APIS, left // 2))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan_workers(
    devices: list[str] | None,
    per_device: int,
    *,
    model_name: str,
    env: Mapping[str, str],
    cores: int | None = None,
    host: str | None = None,
) -> list[tuple[str, dict[str, str]]]:
    """(name, environment overrides) of each worker process to start.

    One worker and no `--devices`: no overrides, the worker's own settings decide (as before
    scaling existed). Otherwise each worker gets its INFERQ_DEVICE, a distinct, stable
    INFERQ_WORKER_ID (its consumer name: a restarted worker must find its own pending
    entries) and INFERQ_WORKERS_PER_DEVICE (workers on one device split its memory budget),
    and workers sharing the CPU split its cores: one batch at a time each, on
    cores ÷ workers threads, unless INFERQ_MODEL_THREADS / INFERQ_INTRA_OP_THREADS are set.
    """
    if per_device < 1:
        raise ValueError(f"--workers must be at least 1, got {per_device}")
    if devices is None and per_device == 1:
        return [("worker", {})]
    if devices is None:
        devices = [env.get("INFERQ_DEVICE", "auto")]
        if devices == ["auto"]:  # resolved here, so CPU workers can be told their share
            devices = [(cuda_devices() or ["cpu"])[0]]
    base = env.get("INFERQ_WORKER_ID") or host or socket.gethostname()
    on_cpu = devices.count("cpu") * per_device
    streams = int(env.get("INFERQ_MODEL_THREADS") or 0) or 1  # 0 = auto: one here
    share = max(1, (cores or _cores()) // max(1, on_cpu * streams))
    plan = []
    for device in devices:
        for k in range(per_device):
            overrides = {
                "INFERQ_DEVICE": device,
                "INFERQ_WORKER_ID": f"{base}:{device}:{model_name}:{k}",
                # They split the device's INFERQ_MEMORY_BUDGET (and, on CUDA, cap their
                # allocators at their share).
                "INFERQ_WORKERS_PER_DEVICE": str(devices.count(device) * per_device),
            }
            if device == "cpu" and on_cpu > 1:
                overrides["INFERQ_MODEL_THREADS"] = str(streams)
                overrides["INFERQ_INTRA_OP_THREADS"] = env.get("INFERQ_INTRA_OP_THREADS") or str(
                    share
                )
            plan.append((f"worker {device} #{k}", overrides))
    return plan


def _listen(host: str, port: int) -> socket.socket:
    """The API port, bound once here; every API process accepts on this one socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Inherited by the API processes only (Popen's pass_fds); the others close it.
    return socket.create_server((host, port), family=family, backlog=2048)


def redis_maxmemory(text: str, machine_bytes: int | None = None) -> int:
    """`INFERQ_REDIS_MAXMEMORY` in bytes: bytes with a unit ('2gb') or a share of the
    machine's memory ('25%', '0.25'); ValueError naming the text otherwise."""
    total = machine_bytes if machine_bytes is not None else host_total_bytes()
    try:
        return parse_budget(text, total)
    except ValueError as e:
        raise ValueError(f"INFERQ_REDIS_MAXMEMORY: {e}") from None


def _start_redis(data_dir: Path, maxmemory: int) -> RedisServer:
    port = DEFAULT_REDIS_PORT if _port_free("127.0.0.1", DEFAULT_REDIS_PORT) else free_port()
    server = RedisServer(data_dir / "redis", port=port, appendonly=True, maxmemory=maxmemory)
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


def _pid(child: _Child) -> str:
    return str(child.proc.pid) if child.proc else "?"


def _print_banner(host: str, port: int, workers: list[_Child], apis: list[_Child]) -> None:
    # A wildcard bind address is not something a browser can open.
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    shown = f"[{shown}]" if ":" in shown else shown
    for w in workers:
        _say(f"{w.name}:  pid {_pid(w)}")
    pids = ", ".join(_pid(a) for a in apis)
    _say(f"api:     http://{shown}:{port}  (pid {pids})")
    _say(f"docs:    http://{shown}:{port}/docs")
    _say("Ctrl-C to stop")


def _redis(
    data_dir: Path, redis_url: str | None, maxmemory: int
) -> tuple[RedisServer | None, str] | None:
    """Our own redis-server (unless given a URL) and the URL to use; None if it failed."""
    if redis_url is not None:
        _say(f"redis:   {_redacted(redis_url)}  (external, not managed here)")
        return None, redis_url
    try:
        server = _start_redis(Path(data_dir), maxmemory)
    except RedisServerError as exc:
        _say(f"could not start redis-server: {exc}")
        return None
    mib = maxmemory // 2**20
    _say(
        f"redis:   {server.url}  (data in {server.data_dir}, {server.binary}, maxmemory {mib} MiB)"
    )
    return server, server.url


def _children(
    plan: list[tuple[str, dict[str, str]]],
    apis: int,
    *,
    env: dict[str, str],
    model: str | None,
    api_args: list[str],
    fd: int,
) -> tuple[list[_Child], list[_Child]]:
    """(API processes, worker processes), not started yet."""
    base = [sys.executable, "-m", "inferq.cli"]
    worker_argv = [*base, "worker", *(["--model", model] if model else [])]
    workers = [_Child(name, worker_argv, env | overrides) for name, overrides in plan]
    api_argv = [*base, "api", *api_args, "--fd", str(fd)]
    names = ["api"] if apis == 1 else [f"api #{i}" for i in range(apis)]
    return [_Child(n, api_argv, env, pass_fds=(fd,)) for n in names], workers


def _supervise(server: RedisServer | None, children: list[_Child], stop: list[int]) -> None:
    """Restart whatever dies (with backoff) until a stop signal arrives."""
    redis_state = {"backoff_s": 0.0, "restart_at": 0.0}
    while not stop:
        now = time.monotonic()
        if server is not None:
            _check_redis(server, now, redis_state)
        for child in children:
            child.check(now)
        time.sleep(POLL_S)


@dataclass(frozen=True, slots=True)
class UpPlan:
    """What `inferq up` runs: where it listens, what it serves, its Redis, how many API
    processes and workers (on which devices)."""

    host: str
    port: int
    model: str | None
    data_dir: Path
    redis_url: str | None  # None: an embedded redis-server under data_dir
    env: Mapping[str, str] | None = None  # the children's environment (default: this one's)
    devices: list[str] | None = None
    workers: int = 1
    apis: int = 1
    model_name: str = ""
    maxmemory: str = "25%"


def run_up(up: UpPlan) -> int:
    """Run until SIGINT/SIGTERM; 0 on a clean stop, 1 if something could not start."""
    host, port, model, env, devices = up.host, up.port, up.model, up.env, up.devices
    data_dir, redis_url, workers, apis = up.data_dir, up.redis_url, up.workers, up.apis
    model_name, maxmemory = up.model_name, up.maxmemory
    stop_signals: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop_signals.append(signum)

    previous = _install_handlers(on_signal)
    server: RedisServer | None = None
    listener: socket.socket | None = None
    api_children: list[_Child] = []
    worker_children: list[_Child] = []
    try:
        child_env = dict(os.environ if env is None else env)
        try:
            plan = plan_workers(devices, workers, model_name=model_name or "model", env=child_env)
            redis_bytes = redis_maxmemory(maxmemory)
            listener = _listen(host, port)
        except (ValueError, OSError) as exc:  # bad --devices or maxmemory, or the port is taken
            _say(f"cannot start: {exc}")
            return 1
        if (got := _redis(data_dir, redis_url, redis_bytes)) is None:
            return 1
        server, child_env["INFERQ_REDIS_URL"] = got
        if model:
            child_env["INFERQ_MODEL"] = model
        api_children, worker_children = _children(
            plan,
            apis,
            env=child_env,
            model=model,
            fd=listener.fileno(),
            api_args=["--host", host, "--port", str(port)],
        )
        for child in [*worker_children, *api_children]:
            child.start()
        _print_banner(host, port, worker_children, api_children)

        _supervise(server, [*worker_children, *api_children], stop_signals)
        _say(f"got {signal.Signals(stop_signals[0]).name}; stopping")
        return 0
    finally:
        # APIs first so nothing new is accepted (then the port closes), then the workers so
        # they can finish their batches and hand back unstarted jobs, then Redis, which both
        # still need until they exit.
        _stop_all(api_children, STOP_TIMEOUT_S)
        if listener is not None:
            listener.close()
        _stop_all(worker_children, STOP_TIMEOUT_S)
        if server is not None:
            server.stop()
            _say("redis-server stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
