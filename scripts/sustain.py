"""Sustained load against a Redis with a memory cap: does the stack keep answering?

A benchmark of 10-30 s never meets what an hour at the same rate meets: every record a
request leaves in Redis stays for its TTL, so Redis holds about rate × TTL × record size, and
past `INFERQ_REDIS_MEMORY_HIGH_WATER` of maxmemory the API refuses new work (503). This starts
inferq as `inferq bench` does (Redis with AOF, one worker, one API), gives its Redis a
`--maxmemory` (CONFIG SET: scaled down, so minutes on this box stand for an hour on a GPU
host), runs N closed-loop clients for `--seconds`, and prints one row a `--window`: answers
and refusals a second, Redis's used memory, and the AOF rewrites so far (each forks Redis
and writes all it holds).

Run: .venv/bin/python scripts/sustain.py [--corpus null32] [--clients 32] [--seconds 120]
     [--window 10] [--maxmemory 1gb] [--env KEY=VALUE ...] [--tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack_cpu import server_env, start

from inferq.bench import inputs, load, systems


def redis_state(client: redis.Redis) -> tuple[int, int]:
    """(used_memory bytes, AOF rewrites so far)."""
    memory, persistence = client.info("memory"), client.info("persistence")
    return int(memory["used_memory"]), int(persistence.get("aof_rewrites", 0))


def row(t: float, res: load.LoadResult, window: float, used: int, rewrites: int) -> str:
    answered = len(res.latencies_ms) / window
    return f"| {t:.0f} | {answered:.0f} | {res.errors / window:.0f} | {used / 2**20:.0f} | {rewrites} |"


def run(run: systems.Running, ready: inputs.Inputs, args: argparse.Namespace) -> None:
    assert run.redis_server is not None
    client = redis.Redis.from_url(run.redis_server.url)
    client.config_set("maxmemory", args.maxmemory)
    print(f"maxmemory {args.maxmemory}, {args.clients} clients, corpus {args.corpus}")
    print("| s | answered/s | refused/s | Redis MiB | AOF rewrites |\n|---|---|---|---|---|")
    t = 0.0
    while t < args.seconds:
        res = asyncio.run(
            load.closed_loop(run.target, ready.bodies, ready.costs, args.clients, args.window)
        )
        t += args.window
        print(row(t, res, args.window, *redis_state(client)), flush=True)
    client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="null32")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--maxmemory", default="1gb", help="Redis's maxmemory (CONFIG SET)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    p.add_argument("--tree", type=Path, help="run the servers from this checkout of inferq")
    args = p.parse_args()
    site_dir = tempfile.TemporaryDirectory()
    env = server_env(args.env, args.tree, Path(site_dir.name))
    ready = inputs.load(args.corpus)
    with tempfile.TemporaryDirectory() as d:
        started = start("inferq", Path(d), ready.model, env)
        try:
            run(started, ready, args)
        finally:
            started.close()


if __name__ == "__main__":
    main()
