"""What each script of the quiet path costs inside Redis, alone, on an idle redis-server.

One job at a time, as a quiet request makes them: SUBMIT (the API), XREADGROUP + CLAIM with
the idle worker's start counted (the worker), FINISH with a 384-float vector (the worker's
completion: final write, ack, publish). Each phase runs N calls back to back; Redis's own
time per call comes from `INFO commandstats` (EVALSHA's usec, which includes the commands a
script runs), so the load generator's speed does not enter. The sum is Redis's time per job
on the quiet path (docs/benchmarks.md, "The CPU budget per request"). `--inputs 32` sends 32
inputs a job and finishes it with 32 vectors (49 KB of outputs); `--arg-kib` times a script
that does nothing with one argument of each size against a plain SET of it: what moving a
value into Lua costs by itself.

Run: .venv/bin/python scripts/lua_cost.py [--jobs 3000] [--no-aof] [--inputs 1]
     [--arg-kib 1,16,48,192]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
from redis.asyncio import Redis

from inferq.redis_server import RedisServer
from inferq.shared import keys
from inferq.shared.consumer import JobConsumer
from inferq.shared.jobs import Job, Status, encode_final, new_job_id, now_ms
from inferq.shared.producer import JobProducer
from inferq.shared.queue import Entry, Final

MODEL = "cost"


async def _usec(r: Redis) -> dict[str, tuple[int, float]]:
    stats = await r.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for k, v in stats.items()
    }


async def phase(r: Redis, n: int, call: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    """µs per call of each command `call` made, over `n` calls."""
    before = await _usec(r)
    for i in range(n):
        await call(i)
    after = await _usec(r)
    return {
        k: (after[k][1] - before.get(k, (0, 0.0))[1]) / n
        for k in after
        if after[k][0] > before.get(k, (0, 0.0))[0] and k != "info"
    }


async def run(url: str, jobs: int, inputs: int) -> None:
    r = Redis.from_url(url)
    api, q = JobProducer(r, result_ttl_s=60), JobConsumer(r, result_ttl_s=60)
    await r.flushall()
    await q.ensure_group(MODEL)
    ids = [new_job_id(MODEL) for _ in range(jobs)]
    entries: list[Entry] = []

    async def submit(i: int) -> None:
        await api.submit(
            Job(id=ids[i], model=MODEL, inputs=["one short sentence to echo"] * inputs)
        )

    async def claim(i: int) -> None:
        got = await q.read(MODEL, "w", count=1, block_ms=None)
        entries.extend(got)
        await q.claim([e.job_id for e in got], now_ms(), start_limit=3)

    out = np.zeros((inputs, 384), np.float32)

    async def finish(i: int) -> None:
        e = entries[i]
        fields = encode_final(Status.SUCCEEDED, finished_ms=now_ms(), outputs=out, worker="w")
        await q.finish([Final(MODEL, e.stream, e.entry_id, e.job_id, fields)])

    total = 0.0
    for name, call in (("SUBMIT", submit), ("XREADGROUP + CLAIM", claim), ("FINISH", finish)):
        costs = await phase(r, jobs, call)
        total += sum(v for k, v in costs.items() if k in ("evalsha", "xreadgroup"))
        shown = ", ".join(f"{k} {v:.1f}" for k, v in sorted(costs.items(), key=lambda kv: -kv[1]))
        print(f"{name:20} µs/call in Redis: {shown}")
    left = await r.xlen(keys.stream(MODEL))
    print(f"quiet path, Redis µs per job (scripts + the read): {total:.1f}  (stream left: {left})")
    await r.aclose()


async def arg_cost(url: str, calls: int, sizes_kib: list[int]) -> None:
    """Redis µs per call: a script that ignores its one argument, against SET of the same."""
    r = Redis.from_url(url)
    noop = r.register_script("return 1")
    key = "arg-cost"
    for kib in sizes_kib:
        value = b"x" * (kib * 1024)
        script = await phase(r, calls, lambda i, v=value: noop(keys=[key], args=[v]))
        plain = await phase(r, calls, lambda i, v=value: r.set(key, v))
        print(
            f"{kib:5d} KiB argument: script {script.get('evalsha', 0.0):7.1f} µs, "
            f"SET {plain.get('set', 0.0):5.1f} µs"
        )
    await r.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--no-aof", action="store_true", help="redis-server without appendonly")
    p.add_argument("--inputs", type=int, default=1, help="inputs (and output vectors) a job")
    p.add_argument("--arg-kib", help="comma-separated sizes: time one script argument of each")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = RedisServer(Path(d) / "redis", appendonly=not args.no_aof)
        server.start()
        try:
            if args.arg_kib:
                sizes = [int(x) for x in args.arg_kib.split(",")]
                asyncio.run(arg_cost(server.url, args.jobs, sizes))
            else:
                asyncio.run(run(server.url, args.jobs, args.inputs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
