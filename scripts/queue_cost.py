"""What the Redis queue costs per job at saturation: the worker's side, batch by batch.

Submits N one-item jobs to a private redis-server (AOF on, as `inferq up` runs it), then
drains them the way the worker does, COUNT jobs per round: XREADGROUP, claim (one script
call for the batch), start (one), finish (one MULTI: final writes + XACK/XDEL). Reports
wall µs per job for the drain and redis-server CPU µs per job (INFO cpu, before/after),
so the number excludes the model and the HTTP tier.

Run: .venv/bin/python scripts/queue_cost.py [--jobs 5000] [--count 1,8,32] [--no-aof]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from redis.asyncio import Redis

from inferq.redis_server import RedisServer
from inferq.shared.consumer import JobConsumer
from inferq.shared.jobs import Job, Status, encode_final, new_job_id, now_ms
from inferq.shared.producer import JobProducer
from inferq.shared.queue import Final

MODEL = "cost"


async def redis_cpu_s(r: Redis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def one(url: str, jobs: int, count: int) -> tuple[float, float, float]:
    r = Redis.from_url(url)
    api, q = JobProducer(r, result_ttl_s=60), JobConsumer(r, result_ttl_s=60)
    await r.flushall()
    await r.config_resetstat()
    await q.ensure_group(MODEL)
    t0, c0 = time.perf_counter(), await redis_cpu_s(r)
    for _ in range(jobs):
        await api.submit(Job(id=new_job_id(MODEL), model=MODEL, inputs=["a short sentence"]))
    submit_s, submit_cpu = time.perf_counter() - t0, await redis_cpu_s(r) - c0
    out = np.zeros((1, 384), np.float32)
    t0, c0 = time.perf_counter(), await redis_cpu_s(r)
    done = 0
    while done < jobs:
        entries = await q.read(MODEL, "w", count=count, block_ms=None)
        claimed = await q.claim([e.job_id for e in entries], now_ms())
        await q.start([e.job_id for e in entries], [True] * len(entries), [0] * len(entries))
        finals = [
            Final(MODEL, e.stream, e.entry_id, e.job_id,
                  encode_final(Status.SUCCEEDED, finished_ms=now_ms(), outputs=out))
            for e, j in zip(entries, claimed, strict=True) if j is not None
        ]  # fmt: skip
        await q.finish(finals)
        done += len(entries)
    drain_s, drain_cpu = time.perf_counter() - t0, await redis_cpu_s(r) - c0
    stats = await r.info("commandstats")
    await r.config_resetstat()
    await r.aclose()
    per = 1e6 / jobs
    print(
        f"COUNT {count:>3}: worker side {drain_s * per:7.1f} µs/job wall, redis CPU "
        f"{drain_cpu * per:6.1f} µs/job | submit (one by one) {submit_s * per:6.1f} µs/job wall, "
        f"redis CPU {submit_cpu * per:5.1f} µs/job"
    )
    top = sorted(stats.items(), key=lambda kv: -float(kv[1]["usec"]))[:6]
    print("   redis time by command, µs/job (submit + drain): " + ", ".join(
        f"{k.removeprefix('cmdstat_')} {float(v['usec']) / jobs:.1f}" for k, v in top
    ))  # fmt: skip
    return drain_s * per, drain_cpu * per, submit_s * per


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--count", default="1,8,32")
    p.add_argument("--no-aof", action="store_true", help="redis-server without appendonly")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = RedisServer(Path(d) / "redis", appendonly=not args.no_aof)
        server.start()
        try:
            for count in (int(c) for c in args.count.split(",")):
                asyncio.run(one(server.url, args.jobs, count))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
