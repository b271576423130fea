"""Jobs/s through inferq's queue: one Redis against a 3-master Redis Cluster, by API count.

The `echo` model at zero delay, so what is measured is the queue's path (submit, claim,
start, finish, publish, answer), not a model. For each Redis mode (`single`: one
`redis-server`; `cluster`: 3 masters + 3 replicas, `INFERQ_REDIS_CLUSTER=true`,
`INFERQ_STREAM_SHARDS=3`) and each API count, `inferq up --apis N --workers W` serves on one
port and a closed loop of `--clients` clients posts one-item `POST /v1/infer` requests for
`--seconds`. Prints one JSON line per run and a table.

    .venv/bin/python scripts/scale_bench.py --apis 1,2,4 --seconds 15 [--tree DIR]

Beside Redis's CPU per job it reads the API processes' and the workers' (`inferq up`'s
children, by role): with several APIs, what each job costs the front end as a whole.
`--tree` serves another checkout with this venv, as `stack_cpu.py --tree` does.

Everything shares this machine's cores (the load generator too): the numbers say where the
path saturates here, not what separate hosts would do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from stack_cpu import other_tree

from inferq.bench.load import Target, closed_loop
from inferq.bench.procs import Proc, bench_env, children, python, wait_http
from inferq.redis_cluster import LocalCluster
from inferq.redis_server import RedisServer, free_port


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes `pids` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _roles(up: Proc) -> dict[str, list[int]]:
    """`inferq up`'s children by role ("api", "worker"), read from their command lines."""
    roles: dict[str, list[int]] = {"api": [], "worker": []}
    for pid in children(up.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for role in roles:
            if role.encode() in argv:
                roles[role].append(pid)
    return roles


def _serve(
    url: str, cluster: bool, apis: int, workers: int, log_dir: Path, tree: dict[str, str]
) -> tuple[Proc, str]:
    port = free_port()
    env = bench_env(
        INFERQ_REDIS_URL=url, INFERQ_MODEL="echo", INFERQ_DEVICE="cpu", INFERQ_LOG_LEVEL="WARNING",
        INFERQ_REDIS_CLUSTER="true" if cluster else "false",
        INFERQ_STREAM_SHARDS="3" if cluster else "1", INFERQ_MAX_QUEUE="100000", **tree,
    )  # fmt: skip
    args = ["-m", "inferq.cli", "up", "--port", str(port), "--apis", str(apis)]
    args += ["--workers", str(workers)]
    proc = python(f"up-{'cluster' if cluster else 'single'}-{apis}", args, env, log_dir)
    base = f"http://127.0.0.1:{port}"
    wait_http(proc, f"{base}/readyz", 120)
    return proc, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apis", default="1,2,4")
    ap.add_argument("--modes", default="single,cluster")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--tree", type=Path, help="serve from this checkout of inferq (stack_cpu.py)")
    args = ap.parse_args()
    texts = [f"scale bench sentence {i}" for i in range(1000)]
    tmp = Path(tempfile.mkdtemp(prefix="inferq-scale-"))
    tree = other_tree(args.tree, tmp) if args.tree else {}
    rows: list[dict[str, object]] = []
    try:
        for mode in args.modes.split(","):
            cluster = mode == "cluster"
            redis: RedisServer | LocalCluster
            if cluster:
                redis = LocalCluster(tmp / "cluster")
            else:
                redis = RedisServer(tmp / "single", appendonly=True)
            redis.start()
            try:
                for apis in (int(a) for a in args.apis.split(",")):
                    proc, base = _serve(redis.url, cluster, apis, args.workers, tmp, tree)
                    nodes = redis.nodes if isinstance(redis, LocalCluster) else [redis]
                    pids = [n.pid for n in nodes if n.pid is not None]
                    roles = _roles(proc)
                    before = _cpu_s(pids)
                    before_roles = {r: _cpu_s(p) for r, p in roles.items()}
                    try:
                        res = asyncio.run(
                            closed_loop(Target((base,), "infer"), texts, [1] * len(texts),
                                        args.clients, args.seconds, warmup_s=3.0)
                        )  # fmt: skip
                    finally:
                        redis_cpu_s = _cpu_s(pids) - before  # warmup included: an upper bound
                        role_s = {r: _cpu_s(p) - before_roles[r] for r, p in roles.items()}
                        proc.stop()
                    lat = sorted(res.latencies_ms)
                    row = {
                        "redis": "3-master cluster, 3 shards" if cluster else "1 redis-server",
                        "apis": apis,
                        "workers": args.workers,
                        "clients": args.clients,
                        "jobs_per_s": round(len(lat) / args.seconds, 1),
                        "p50_ms": round(lat[len(lat) // 2], 1) if lat else None,
                        "p99_ms": round(lat[int(len(lat) * 0.99)], 1) if lat else None,
                        "errors": res.errors,
                        "redis_cpu_us_per_job": round(redis_cpu_s / max(1, len(lat)) * 1e6),
                        "redis_cpu_cores": round(redis_cpu_s / (args.seconds + 3.0), 2),
                        **{
                            f"{r}_cpu_us_per_job": round(s / max(1, len(lat)) * 1e6)
                            for r, s in role_s.items()
                        },
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                redis.stop()
        print(
            "\n| Redis | APIs | jobs/s | p50 ms | p99 ms | errors | Redis CPU µs/job | Redis cores "
            "| APIs' CPU µs/job | workers' CPU µs/job |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['redis']} | {r['apis']} | {r['jobs_per_s']} | {r['p50_ms']} | "
                  f"{r['p99_ms']} | {r['errors']} | {r['redis_cpu_us_per_job']} | "
                  f"{r['redis_cpu_cores']} | {r['api_cpu_us_per_job']} | "
                  f"{r['worker_cpu_us_per_job']} |")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
