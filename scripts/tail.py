"""Where the open-loop tail comes from: p99 against p50 at a fraction of the peak, by phase.

Starts inferq as `inferq bench` does (Redis with AOF, one worker, one API) serving
`minilm-null` (minilm's tokenizer and output, no compute: the path alone), finds the peak
with 32 closed-loop clients, then sends Poisson arrivals at `--load` of it. Every answer of
`POST /v1/infer` carries its job's timings, so each request splits into: client (its scheduled
arrival → the load generator sent it), queued (created → a worker took it), run (taken →
final: batching wait, prepare, the model, the write), and the rest (sent → API → submit,
and final → the answer read: the API's share, the network, reading the answer). Prints the percentiles of each, and the same split over the slowest 1 %, and how many AOF rewrites
Redis made during the open loop.

Run: .venv/bin/python scripts/tail.py [--load 0.5] [--seconds 20] [--env KEY=VALUE ...]
     [--tree DIR]   (another checkout's code, as scripts/stack_cpu.py runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack_cpu import server_env

from inferq.bench import inputs, load, systems
from inferq.bench.http import Connection
from inferq.bench.stats import percentile

PHASES = ("total", "client", "queued", "run", "rest")


async def open_loop(base: str, bodies: list[bytes], rate: float, seconds: float) -> list[dict]:
    """Poisson arrivals; per request its total ms (from its scheduled arrival) and phases."""
    rng = random.Random(11)
    idle: list[Connection] = []
    out: list[dict] = []
    tasks: set[asyncio.Task[None]] = set()

    async def fire(at: float, body: bytes) -> None:
        conn = idle.pop() if idle else Connection(base)
        lag = (time.perf_counter() - at) * 1000  # the load generator's own delay in sending
        try:
            status, raw = await conn.request("POST", "/v1/infer", body)
        finally:
            idle.append(conn)
        total = (time.perf_counter() - at) * 1000
        if status != 200:
            out.append({"error": status})
            return
        t = orjson.loads(raw)["timings"]
        queued, run = t.get("queued_ms") or 0, t.get("run_ms") or 0
        rest = total - queued - run - lag
        out.append(
            {"at": at, "total": total, "client": lag, "queued": queued, "run": run, "rest": rest}
        )

    t0, offset, n = time.perf_counter(), 0.0, 0
    while True:
        offset += rng.expovariate(rate)
        if offset >= seconds:
            break
        at = t0 + offset
        if (delay := at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(fire(at, bodies[n % len(bodies)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", type=float, default=0.5, help="fraction of the closed-loop peak")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--corpus", default="null")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    p.add_argument("--tree", type=Path, help="run the servers from this checkout of inferq")
    p.add_argument("--dump", type=Path, help="write every request (wall time, phases) as CSV")
    args = p.parse_args()
    site_dir = tempfile.TemporaryDirectory()
    env = server_env(args.env, args.tree, Path(site_dir.name))
    ready = inputs.load(args.corpus)
    bodies = [b.data if hasattr(b, "data") else orjson.dumps({"input": b}) for b in ready.bodies]
    with tempfile.TemporaryDirectory() as d:
        run = systems.inferq(Path(d), "cpu", "auto", env, model=ready.model)
        try:
            asyncio.run(load.closed_loop(run.target, ready.bodies, ready.costs, 32, 2.0))
            peak = asyncio.run(load.closed_loop(run.target, ready.bodies, ready.costs, 32, 6.0))
            rps = len(peak.latencies_ms) / 6.0
            rate = rps * args.load
            print(
                f"peak {rps:.0f} req/s (32 clients, p50 {percentile(peak.latencies_ms, 50):.2f} ms)"
            )
            print(f"open loop at {args.load:.0%}: {rate:.0f} req/s for {args.seconds:.0f} s")
            redis = None
            if run.redis_server is not None:  # Redis's own stalls (fsync, slow commands)
                import redis as redis_py

                redis = redis_py.Redis.from_url(run.redis_server.url)
                redis.config_set("latency-monitor-threshold", 10)
                rewrites = int(redis.info("persistence")["aof_rewrites"])
            got = asyncio.run(open_loop(run.target.bases[0], bodies, rate, args.seconds))
            if redis is not None:
                for event in redis.execute_command("LATENCY", "LATEST"):
                    print("redis latency event:", event)
                # Each rewrite forks Redis and writes all it holds: on a small host, the
                # open-loop tail's largest cause (docs/benchmarks.md, "One connection...").
                rewrites = int(redis.info("persistence")["aof_rewrites"]) - rewrites
                fork_ms = int(redis.info("stats")["latest_fork_usec"]) / 1000
                print(
                    f"redis AOF rewrites during the open loop: {rewrites} (last fork {fork_ms:.1f} ms)"
                )
        finally:
            run.close()
    ok = [r for r in got if "error" not in r]
    if args.dump is not None:
        wall = time.time() - time.perf_counter()  # perf_counter → Unix seconds
        rows = [f"{r['at'] + wall:.4f},{r['total']:.2f},{r['queued']},{r['run']}" for r in ok]
        args.dump.write_text("at,total_ms,queued_ms,run_ms\n" + "\n".join(rows) + "\n")
    print(f"{len(ok)} answered, {len(got) - len(ok)} errors")
    print("| phase | p50 ms | p90 | p99 | p99.9 | max |")
    print("|---|---|---|---|---|---|")
    for ph in PHASES:
        xs = [r[ph] for r in ok]
        qs = [percentile(xs, q) for q in (50, 90, 99, 99.9)]
        print(f"| {ph} | " + " | ".join(f"{q:.2f}" for q in qs) + f" | {max(xs):.2f} |")
    slow = sorted(ok, key=lambda r: r["total"])[-max(1, len(ok) // 100) :]
    print(
        "slowest 1 %, mean ms: "
        + ", ".join(f"{ph} {statistics.mean(r[ph] for r in slow):.2f}" for ph in PHASES)
    )


if __name__ == "__main__":
    main()
