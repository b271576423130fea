"""The CPU budget per request: what each process of a stack burns per answered request.

Starts each system the way `inferq bench` does (inferq: Redis with AOF + one worker + one
API; the floors: a FastAPI echo handler, alone or with one Redis round trip), warms it up,
runs N closed-loop clients for D seconds with the bench's load generator, and reads each
process's CPU from /proc/<pid>/stat (the load generator's from getrusage) around the
window. CPU per request is far steadier on a noisy machine than latency: it is the figure
to drive down (docs/benchmarks.md, "The CPU budget per request").

Run: .venv/bin/python scripts/stack_cpu.py [--systems inferq,floor-redis,floor-fastapi]
     [--corpus echo,short,null,null32] [--clients 1,32] [--seconds 8] [--repeat 3]
     [--env KEY=VALUE ...] [--tree DIR] [--answer json|msgpack]
The floors serve the echo corpus only. `null` and `null32` run `minilm-null` (minilm's
tokenizer and output, no compute) with one and 32 inputs a request: the whole path's CPU per
item on any machine. Prints one Markdown table (medians of --repeat), with µs per item
beside µs per request.
`--answer msgpack` asks inferq for its packed answer (`Accept: application/msgpack`, what the
Python client asks for: outputs as float32 bytes, not JSON numbers); the floors are skipped.
`--tree` runs the servers from another checkout (`git worktree add /tmp/before <commit>`)
with this venv, so that before and after differ in inferq's own code only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from inferq.bench import inputs, load, systems
from inferq.bench.stats import percentile

PROCESSES = ("api", "worker", "redis", "load generator")
WARMUP_S = 1.5
REPO = Path(__file__).resolve().parents[1]
# The editable install maps `inferq.*` onto this checkout with a finder that `site` loads
# before `sitecustomize`; rewriting its mapping there points the servers at another tree.
SITECUSTOMIZE = """import sys
for name, module in list(sys.modules.items()):
    if name.startswith("__editable___inferq"):
        module.MAPPING.update({{k: v.replace({here!r}, {there!r}, 1) for k, v in module.MAPPING.items()}})
"""


def other_tree(tree: Path, site_dir: Path) -> dict[str, str]:
    """The servers' environment for running `tree` instead of this checkout."""
    code = SITECUSTOMIZE.format(here=str(REPO), there=str(tree.resolve()))
    (site_dir / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": str(site_dir)}


def server_env(pairs: list[str], tree: Path | None, site_dir: Path) -> dict[str, str]:
    """The servers' environment: `inferq up`'s log level (a DEBUG worker logs more lines a
    batch), the `--env` KEY=VALUE pairs, and with `tree` that checkout's code."""
    env = {"INFERQ_LOG_LEVEL": "INFO"} | dict(kv.split("=", 1) for kv in pairs)
    if tree is not None:
        env |= other_tree(tree, site_dir)
        # The servers start with `python -m`, which puts their working directory first on
        # sys.path: inside this checkout that would import its `inferq/` ahead of the tree.
        os.chdir(site_dir)
    return env


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Point:
    """One window: requests/s, p50 ms, CPU µs per request by process."""

    rps: float
    p50_ms: float
    cpu_us: dict[str, float]

    @property
    def total_us(self) -> float:
        return sum(self.cpu_us.values())


def _pids(run: systems.Running) -> dict[str, int]:
    """The processes of a started system, by role (the floors' handler is their 'api')."""
    pids: dict[str, int] = {}
    if run.worker is not None:
        pids["worker"] = run.worker.pid
    pids["api"] = next(p.pid for p in run.procs if p is not run.worker)
    if run.redis_server is not None and run.redis_server.pid is not None:
        pids["redis"] = run.redis_server.pid
    return pids


def measure(run: systems.Running, ready: inputs.Inputs, clients: int, seconds: float) -> Point:
    asyncio.run(load.closed_loop(run.target, ready.bodies, ready.costs, clients, WARMUP_S))
    pids = _pids(run)

    def snapshot() -> dict[str, float]:
        return {k: cpu_s(v) for k, v in pids.items()} | {"load generator": self_cpu_s()}

    before = snapshot()
    res = asyncio.run(load.closed_loop(run.target, ready.bodies, ready.costs, clients, seconds))
    after = snapshot()
    n = max(1, len(res.latencies_ms))
    cpu = {k: 1e6 * (after[k] - before[k]) / n for k in before}
    return Point(len(res.latencies_ms) / seconds, percentile(res.latencies_ms, 50), cpu)


def start(system: str, log_dir: Path, model: str, env: dict[str, str]) -> systems.Running:
    if system == "inferq":
        return systems.inferq(log_dir, "cpu", "auto", env, model=model)  # as `inferq up` runs
    return systems.floor(log_dir, system, env)


def median_point(points: list[Point]) -> Point:
    keys = {k for p in points for k in p.cpu_us}

    def med(f: Callable[[Point], float]) -> float:
        return statistics.median(f(p) for p in points)

    return Point(
        med(lambda p: p.rps),
        med(lambda p: p.p50_ms),
        {k: med(lambda p, k=k: p.cpu_us.get(k, 0.0)) for k in keys},  # type: ignore[misc]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default="inferq,floor-redis,floor-fastapi")
    p.add_argument("--corpus", default="echo,short")
    p.add_argument("--clients", default="1,32")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    p.add_argument("--tree", type=Path, help="run the servers from this checkout of inferq")
    p.add_argument("--answer", choices=("json", "msgpack"), default="json")
    args = p.parse_args()
    site_dir = tempfile.TemporaryDirectory()
    env = server_env(args.env, args.tree, Path(site_dir.name))
    clients = [int(c) for c in args.clients.split(",")]
    print(
        "| system | corpus | clients | req/s | items/s | p50 ms | "
        + " | ".join(f"{k} µs/req" for k in PROCESSES)
        + " | total µs/req | total µs/item |"
    )
    print("|---" * (8 + len(PROCESSES)) + "|")
    for corpus_name in args.corpus.split(","):
        ready = inputs.load(corpus_name)
        if args.answer == "msgpack":
            bodies = [replace(b, accept=load.MSGPACK) for b in ready.bodies]
            ready = replace(ready, bodies=bodies)
            corpus_name += " (msgpack)"
        for system in args.systems.split(","):
            if system != "inferq" and (corpus_name != "echo" or args.answer != "json"):
                continue  # the floors are the echo path's bottom, not embedders
            runs: dict[int, list[Point]] = {c: [] for c in clients}
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as d:
                    run = start(system, Path(d), ready.model, env)
                    try:
                        for c in clients:
                            runs[c].append(measure(run, ready, c, args.seconds))
                    finally:
                        run.close()
            for c in clients:
                pt = median_point(runs[c])
                cells = " | ".join(
                    f"{pt.cpu_us[k]:.0f}" if k in pt.cpu_us else "–" for k in PROCESSES
                )
                per = ready.items_per_body
                print(
                    f"| {system} | {corpus_name} | {c} | {pt.rps:.0f} | {pt.rps * per:.0f} | "
                    f"{pt.p50_ms:.2f} | {cells} | {pt.total_us:.0f} | {pt.total_us / per:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
