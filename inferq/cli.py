"""`inferq`: `up` (everything on one machine), `api`, `worker`, `calibrate`, `bench`.

Built on typer: every command's `--help` works without valid settings, because settings are
read only inside a command. Options that are settings (`--model`, `--device`, ...) take their
help text from the `Settings` field and override the environment; pydantic validates them
once, the same way it validates `INFERQ_*` variables.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from inferq.shared.settings import Settings

app = typer.Typer(
    help="Put a model behind an HTTP API: a FastAPI front end, Redis Streams, and one "
    "memory-bounded microbatching worker per device.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _about(field: str) -> str:
    """A setting's description, so the CLI never restates it."""
    description = Settings.model_fields[field].description or ""
    return f"{description} (env INFERQ_{field.upper()})"


def _settings(**overrides: Any) -> Settings:
    """The environment's settings with the options given on the command line on top."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in e.errors()
        ]
        typer.echo("inferq: invalid configuration:\n" + "\n".join(lines), err=True)
        raise typer.Exit(2) from None


BUDGET_HELP = (
    "Device memory to fit in: '6GiB', '512MiB' or a fraction ('0.8'). "
    "Default INFERQ_MEMORY_BUDGET, else 0.8."
)
BUDGET_HELP = (
    "Device memory to fit in: '6GiB', '512MiB' or a fraction ('0.8'). "
    "Default INFERQ_MEMORY_BUDGET, else 0.8."
)
Host = Annotated[str, typer.Option(help="Address the API listens on.")]
Port = Annotated[int, typer.Option(help="Port the API listens on.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help=_about("model"))]


Devices = Annotated[
    str | None,
    typer.Option(
        help="One worker per device: 'cuda:0,cuda:1', or 'all' (every CUDA device torch sees; "
        "the CPU when there is none). Default: one worker on INFERQ_DEVICE."
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Workers per device; on a CPU they split its cores. Default: 1, or 2 per GPU on a "
        "CUDA host (they split INFERQ_MEMORY_BUDGET).",
    ),
]
Apis = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="API processes, all serving --port. Default: 1, or on a CUDA host half the cores "
        "the workers and Redis leave (up to 16).",
    ),
]
Fd = Annotated[
    int | None,
    typer.Option(
        help="Accept on this inherited listening socket instead of binding --host/--port "
        "(`inferq up` passes it to each of its API processes)."
    ),
]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@app.command()
def up(
    host: Host = "127.0.0.1",
    port: Port = 8000,
    model: ModelOpt = None,
    devices: Devices = None,
    workers: Workers = None,
    apis: Apis = None,
) -> None:
    """Redis (unless INFERQ_REDIS_URL is set) + workers + API processes, supervised until
    Ctrl-C."""
    from inferq.up import UpPlan, default_scale, host_gpus, resolve_devices, run_up

    settings = _settings(model=model)
    try:
        chosen = resolve_devices(devices)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--devices") from None
    if workers is None or apis is None:
        auto_workers, auto_apis = default_scale(host_gpus(chosen, settings.device), _cores())
        workers, apis = workers or auto_workers, apis or auto_apis
    explicit_redis = "INFERQ_REDIS_URL" in os.environ
    redis_url = settings.redis_url.get_secret_value() if explicit_redis else None
    plan = UpPlan(
        host=host,
        port=port,
        model=model,
        data_dir=Path(settings.data_dir),
        redis_url=redis_url,
        devices=chosen,
        workers=workers,
        apis=apis,
        model_name=settings.default_model.name,
        maxmemory=settings.redis_maxmemory,
    )
    raise typer.Exit(run_up(plan))


@app.command()
def api(host: Host = "127.0.0.1", port: Port = 8000, fd: Fd = None) -> None:
    """The HTTP front end, against INFERQ_REDIS_URL (no torch, no device)."""
    from inferq.api.main import main as api_main

    raise typer.Exit(api_main(_settings(), host, port, fd=fd))


@app.command()
def worker(model: ModelOpt = None) -> None:
    """One device-owning worker, against INFERQ_REDIS_URL, until SIGTERM."""
    from inferq.worker.main import main as worker_main

    raise typer.Exit(worker_main(_settings(), model))


Url = Annotated[str, typer.Option(help="The API's base URL.")]
# The key comes from the option or the environment (envvar below), never a settings field:
# a client is not a server process, and a key in argv would show in `ps`.
KeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="INFERQ_CLIENT_KEY", help="Bearer key (or the env var)."),
]


@app.command()
def submit(
    texts: Annotated[list[str], typer.Argument(help="One input per argument.")],
    url: Url = "http://127.0.0.1:8000",
    api_key: KeyOpt = None,
    model: ModelOpt = None,
    priority: Annotated[str | None, typer.Option(help="high, normal or low.")] = None,
    timeout_s: Annotated[float | None, typer.Option(help="The job's deadline, s.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the result and print it.")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Same key, same job.")] = None,
) -> None:
    """Submit a job to a running API (with retries on 429/503) and print it as JSON."""
    from inferq.client.cli import submit_command

    if priority not in (None, "high", "normal", "low"):
        raise typer.BadParameter("high, normal or low", param_hint="--priority")
    raise typer.Exit(
        submit_command(
            texts,
            url=url,
            api_key=api_key,
            model=model,
            priority=priority,  # type: ignore[arg-type]
            timeout_s=timeout_s,
            wait=wait,
            idempotency_key=idempotency_key,
        )
    )


@app.command()
def get(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: Url = "http://127.0.0.1:8000",
    api_key: KeyOpt = None,
    wait_s: Annotated[float, typer.Option(help="Long-poll up to this long for it to end.")] = 0.0,
) -> None:
    """Print a job of a running API as JSON."""
    from inferq.client.cli import get_command

    raise typer.Exit(get_command(job_id, url=url, api_key=api_key, wait_s=wait_s))


def _ints(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"want comma-separated integers, got {text!r}") from None


@app.command()
def calibrate(
    model: ModelOpt = None,
    backend: Annotated[str | None, typer.Option(help=_about("backend"))] = None,
    onnx_variant: Annotated[str | None, typer.Option(help=_about("onnx_variant"))] = None,
    device: Annotated[str | None, typer.Option(help=_about("device"))] = None,
    budget: Annotated[str | None, typer.Option(help=BUDGET_HELP)] = None,
    margin: Annotated[float, typer.Option(help="Safety factor in (0, 1].")] = 0.9,
    lengths: Annotated[
        str | None, typer.Option(help="Item costs to probe, e.g. 16,64,256.")
    ] = None,
    batch_sizes: Annotated[str | None, typer.Option(help="Batch sizes, e.g. 1,4,16,32.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Largest padded probe.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per probe (median).")] = 3,
    time_limit_s: Annotated[float, typer.Option(help="Probing stops within this.")] = 80.0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure memory per cost unit on a device and turn a budget into the batch ceiling."""
    from inferq.shared.logs import setup_logging
    from inferq.worker.calibration.fit import DEFAULT_BUDGET
    from inferq.worker.calibration.probe import CalibrateOptions, format_table
    from inferq.worker.calibration.probe import calibrate as run

    settings = _settings(model=model, backend=backend, onnx_variant=onnx_variant, device=device)
    setup_logging(settings.log_level, settings.log_format)
    options = CalibrateOptions(
        budget=budget or settings.memory_budget or DEFAULT_BUDGET,
        margin=margin,
        lengths=_ints(lengths),
        batch_sizes=_ints(batch_sizes),
        max_tokens=max_tokens,
        repeats=repeats,
        time_limit_s=time_limit_s,
        progress=progress,
    )
    try:
        cal, path = run(settings, options)
    except ValueError as e:
        typer.echo(f"inferq calibrate: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(format_table(cal))
    typer.echo(f"written to {path}")


@app.command()
def bench(
    corpus: Annotated[
        str,
        typer.Option(
            help="Comma-separated corpora: short, mixed (minilm), images (efficientnet-lite0), "
            "echo (the echo model at zero delay: inferq's path beside the floors)."
        ),
    ] = "short,mixed",
    concurrency: Annotated[str, typer.Option(help="Closed-loop client counts.")] = "1,8,32,128",
    duration: Annotated[float, typer.Option(help="Measured seconds per point.")] = 6.0,
    warmup: Annotated[float, typer.Option(help="Unmeasured seconds before each point.")] = 1.0,
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    backend: Annotated[str, typer.Option(help="torch | onnx")] = "torch",
    repeat: Annotated[int, typer.Option(min=1, help="Runs; the table shows medians.")] = 1,
    systems: Annotated[
        str | None,
        typer.Option(
            help="Subset of: ceiling, seed, inferq, jobs, submit (POST /v1/jobs alone), litserve, "
            "infinity, infinity-optimum "
            "(Infinity's own venv, `make bench-infinity`), frontend, floor-fastapi, floor-redis "
            "(with --corpus echo). Default: all but infinity-optimum."
        ),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE for every server process (repeatable).")
    ] = None,
    quick: Annotated[bool, typer.Option(help="Smoke run: 1,8,32 clients, 2 s points.")] = False,
    out: Annotated[str | None, typer.Option(help="Results directory.")] = None,
    docs: Annotated[
        str | None, typer.Option(help="Where benchmarks.md/png go ('' = skip).")
    ] = None,
) -> None:
    """Measure inferq beside the model alone, the plain FastAPI pattern, LitServe and Infinity,
    and inferq's echo path beside bare FastAPI and FastAPI + one Redis round trip, one run."""
    from inferq.bench.main import ALL_SYSTEMS, DEFAULT_DOCS, DEFAULT_OUT, BenchOptions
    from inferq.bench.main import main as run

    options = BenchOptions(
        corpus=corpus,
        concurrency=concurrency,
        duration=duration,
        warmup=warmup,
        device=device,
        backend=backend,
        repeat=repeat,
        systems=systems or ALL_SYSTEMS,
        env=tuple(env or ()),
        quick=quick,
        out=DEFAULT_OUT if out is None else out,
        docs=DEFAULT_DOCS if docs is None else docs,
    )
    raise typer.Exit(run(options, sys.argv[2:]))


def main(argv: list[str] | None = None) -> int:
    """Entry point (`inferq`, `python -m inferq.cli`); returns the exit code."""
    try:
        app(args=argv, prog_name="inferq")  # standalone: usage errors print, then exit
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
