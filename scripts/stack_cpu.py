"""Where the CPU goes in the inferq stack under a closed loop: per process, per request.

Starts Redis (AOF) + one worker + one API the way `inferq bench` does, runs N closed-loop
clients on /v1/infer for D seconds with the bench's load generator, and prints items/s,
latency, each process's CPU (from /proc/<pid>/stat; the load generator from getrusage)
and the worker's own batch lines (run time, items per batch).

Run: .venv/bin/python scripts/stack_cpu.py [--clients 32] [--seconds 10] [--corpus short]
     [--env KEY=VALUE ...]   (--corpus images: efficientnet-lite0, multipart uploads)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import statistics
import tempfile
import time
from pathlib import Path

from inferq.bench import inputs, load, systems
from inferq.bench.stats import percentile

_RUN = re.compile(r"batch items=(\d+) tokens=\d+/\d+ run_ms=([\d.]+)")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--corpus", default="short")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    args = p.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    ready = inputs.load(args.corpus)
    model = ready.model
    with tempfile.TemporaryDirectory() as d:
        run = systems.inferq(Path(d), "cpu", "torch", env, model=model)
        try:
            worker_log = Path(d) / f"worker-{model}.log"
            offset = worker_log.stat().st_size
            pids = {"worker": run.procs[0].pid, "api": run.procs[1].pid}
            assert run.redis_server is not None and run.redis_server.pid is not None
            pids["redis"] = run.redis_server.pid
            before = {k: cpu_s(v) for k, v in pids.items()} | {"load generator": self_cpu_s()}
            t0 = time.perf_counter()
            res = asyncio.run(
                load.closed_loop(run.target, ready.bodies, ready.costs, args.clients, args.seconds)
            )
            wall = time.perf_counter() - t0
            after = {k: cpu_s(v) for k, v in pids.items()} | {"load generator": self_cpu_s()}
            lines = worker_log.read_text()[offset:]
        finally:
            run.close()
    n = len(res.latencies_ms)
    print(
        f"{args.clients} clients, {args.corpus}, {model}: {n / args.seconds:.1f} items/s, "
        f"p50 {percentile(res.latencies_ms, 50):.1f} ms, "
        f"p99 {percentile(res.latencies_ms, 99):.1f} ms, errors {res.errors}"
    )
    for k in before:
        used = after[k] - before[k]
        print(
            f"  {k:15} {100 * used / wall:5.0f} % of a core, {1000 * used / max(n, 1):6.2f} ms/item"
        )
    batches = [(int(i), float(ms)) for i, ms in _RUN.findall(lines)]
    if batches:
        print(
            f"  worker batches: {len(batches)}, items per batch {statistics.mean(b[0] for b in batches):.1f}, "
            f"run p50 {statistics.median(b[1] for b in batches):.1f} ms, "
            f"device busy {sum(b[1] for b in batches) / 1000 / wall:.2f} stream-seconds per second"
        )


if __name__ == "__main__":
    main()
