"""How each system under test is started on 127.0.0.1, and what to measure it by."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from inferq.bench import infinity as inf
from inferq.bench.load import Target
from inferq.bench.procs import BenchError, Proc, bench_env, python, wait_for, wait_http
from inferq.redis_server import RedisServer, free_port
from inferq.shared import keys

# LitServe needs a batch_timeout > 0 to batch at all; 5 ms is the usual value. inferq runs with
# its own default INFERQ_MAX_WAIT_MS (0: it batches what arrives while the device is busy).
MAX_WAIT_MS = 5.0
MAX_BATCH_SIZE = 32  # inferq's INFERQ_MAX_BATCH_SIZE default; LitServe gets the same
# The seed pattern per model: JSON texts for minilm, multipart uploads for the classifier.
SEED_APPS = {
    "minilm": "inferq.bench.seed_app:app",
    "efficientnet-lite0": "inferq.bench.seed_images_app:app",
}
LITSERVE_MODELS = ("minilm",)
# The models each served system is measured on (a run starts it once per model). The floors
# serve the echo corpus only: they are the bottom of inferq's path, not embedders.
SERVES: dict[str, tuple[str, ...]] = {
    "seed": ("minilm", "efficientnet-lite0"),
    "inferq": ("minilm", "efficientnet-lite0", "echo"),
    "litserve": LITSERVE_MODELS,
    "infinity": ("minilm",),
    "infinity-optimum": ("minilm",),
    "floor-fastapi": ("echo",),
    "floor-redis": ("echo",),
}
FLOORS = ("floor-fastapi", "floor-redis")
INFINITY_START_S = 300.0  # its warm-up runs full batches of 1 and 256 tokens before /health


@dataclass
class Running:
    """A started system: where to send load, whose memory to read, what to stop."""

    name: str
    target: Target
    mem_pid: int
    procs: list[Proc] = field(default_factory=list)
    worker: Proc | None = None
    redis_server: RedisServer | None = None
    agreement: float | None = None  # Infinity: min cosine against inferq's vectors

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        if self.redis_server is not None:
            self.redis_server.stop()


def _base_env(device: str, backend: str, model: str, extra: dict[str, str]) -> dict[str, str]:
    return bench_env(BENCH_DEVICE=device, BENCH_BACKEND=backend, BENCH_MODEL=model, **extra)


def _one_server(
    name: str, argv: list[str], env: dict[str, str], log_dir: Path, port: int, health: str
) -> Running:
    """One server process on `port`, ready once `health` answers 200; stopped if it never does.
    `name` is the system (seed | litserve: the request kind); its log is `<name>-<model>.log`."""
    proc = python(f"{name}-{env['BENCH_MODEL']}", argv, env, log_dir)
    base = f"http://127.0.0.1:{port}"
    run = Running(name, Target((base,), name), proc.pid, [proc])
    try:
        wait_http(proc, f"{base}{health}")
    except Exception:
        run.close()
        raise
    return run


def seed(
    log_dir: Path, device: str, backend: str, extra: dict[str, str], model: str = "minilm"
) -> Running:
    if model not in SEED_APPS:
        raise BenchError(f"no seed app for model {model!r}: have {sorted(SEED_APPS)}")
    port = free_port()
    argv = ["-m", "uvicorn", SEED_APPS[model], "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", "--no-access-log"]  # fmt: skip
    env = _base_env(device, backend, model, extra)
    return _one_server("seed", argv, env, log_dir, port, "/healthz")


def litserve(
    log_dir: Path, device: str, backend: str, extra: dict[str, str], model: str = "minilm"
) -> Running:
    if model not in LITSERVE_MODELS:
        raise BenchError(f"the LitServe app serves {', '.join(LITSERVE_MODELS)} only, not {model}")
    port = free_port()
    env = _base_env(device, backend, model, extra)
    env.update(
        BENCH_MAX_BATCH_SIZE=str(MAX_BATCH_SIZE), BENCH_BATCH_TIMEOUT_S=str(MAX_WAIT_MS / 1000)
    )
    argv = ["-m", "inferq.bench.litserve_app", str(port)]
    return _one_server("litserve", argv, env, log_dir, port, "/health")


def inferq_env(
    url: str, model: str, device: str, backend: str, level: str, extra: dict[str, str]
) -> dict[str, str]:
    env = bench_env(
        INFERQ_REDIS_URL=url,
        INFERQ_MODEL=model,
        INFERQ_DEVICE=device,
        INFERQ_BACKEND=backend,
        INFERQ_LOG_LEVEL=level,
    )
    env.update(extra)
    return env


def inferq(
    log_dir: Path,
    device: str,
    backend: str,
    extra: dict[str, str],
    *,
    model: str = "minilm",
    apis: int = 1,
) -> Running:
    """Redis + one worker + `apis` API processes. The worker logs at INFO, as `inferq up`
    runs it: its per-batch INFO line is how the bench counts batches and padded tokens."""
    server = RedisServer(log_dir / f"redis-{model}", appendonly=True)
    server.start()
    run = Running(f"inferq-{model}", Target((), "infer"), 0, redis_server=server)
    try:
        wenv = inferq_env(server.url, model, device, backend, "INFO", extra)
        worker = python(f"worker-{model}", ["-m", "inferq.cli", "worker"], wenv, log_dir)
        run.procs.append(worker)
        run.worker, run.mem_pid = worker, worker.pid
        r = redis.Redis.from_url(server.url)

        def up() -> bool:
            worker.check()
            return bool(r.zrangebyscore(keys.workers(model), int(time.time() * 1000), "+inf"))

        wait_for(up, 180, f"a live {model} worker")
        r.close()
        bases = []
        for i in range(apis):
            port = free_port()
            aenv = inferq_env(server.url, model, device, backend, "WARNING", extra)
            api = python(
                f"api{i}-{model}", ["-m", "inferq.cli", "api", "--port", str(port)], aenv, log_dir
            )
            run.procs.append(api)
            bases.append(f"http://127.0.0.1:{port}")
            wait_http(api, f"{bases[-1]}/healthz")
    except Exception:
        run.close()
        raise
    run.target = Target(tuple(bases), "infer")
    return run


def floor(log_dir: Path, name: str, extra: dict[str, str]) -> Running:
    """floor-fastapi | floor-redis (bench/floor_app.py). floor-redis gets its own Redis, run
    as inferq's is (AOF on), so the round trip costs what one of inferq's would."""
    if name not in FLOORS:
        raise BenchError(f"unknown floor {name!r}: have {FLOORS}")
    kind = name.removeprefix("floor-")
    port = free_port()
    argv = ["-m", "inferq.bench.floor_app", kind, str(port)]
    server = None
    if kind == "redis":
        server = RedisServer(log_dir / "redis-floor", appendonly=True)
        server.start()
        argv.append(server.url)
    base = f"http://127.0.0.1:{port}"
    run = Running(name, Target((base,), name), 0, redis_server=server)
    try:
        proc = python(name, argv, bench_env(**extra), log_dir)
        run.procs.append(proc)
        run.mem_pid = proc.pid
        wait_http(proc, f"{base}/healthz")
    except Exception:
        run.close()
        raise
    return run


def infinity(log_dir: Path, name: str, device: str, extra: dict[str, str]) -> Running:
    """`infinity` (torch engine) or `infinity-optimum` from its own venv, on the minilm
    directory inferq loads; checked to embed as inferq does before it is measured. BenchError
    (the system is skipped) when its venv is missing."""
    venv = inf.venv()
    if (why := inf.missing(venv)) is not None:
        raise BenchError(why)
    engine = inf.ENGINES[name]
    model_id, cwd = str(inf.model_dir()), None
    if engine == "optimum":
        # Run inside the exported directory as `.`: see bench/infinity.py for why.
        cwd = inf.ensure_onnx(venv, inf.model_dir(), log_dir / f"{name}-export.log")
        model_id = "."
    port = free_port()
    proc = Proc(
        name,
        inf.argv(venv, engine, model_id, port, device),
        inf.env(extra),
        log_dir / f"{name}.log",
        cwd=cwd,
    )
    base = f"http://127.0.0.1:{port}"
    run = Running(name, Target((base,), "infinity"), proc.pid, [proc])
    try:
        wait_http(proc, f"{base}/health", timeout_s=INFINITY_START_S)
        run.agreement = inf.agreement(base, device, extra)
    except Exception:
        run.close()
        raise
    return run
