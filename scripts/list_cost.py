"""What a page of GET /v1/jobs costs with many jobs held: time over HTTP, one client.

Fills a private redis-server with N jobs of one tenant through the real SUBMIT script (a
tenth of another tenant's beside them, every fourth finished, every third labelled), starts
the API (`inferq api`, no worker needed), then times pages side by side, request by request:
the newest page, a page deep in the listing (`after` a job half way), a status filter and a
metadata filter. Prints median and p99 per case and the jobs held.

Run from the repo root: .venv/bin/python scripts/list_cost.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from redis.asyncio import Redis

sys.path.insert(0, ".")
from inferq.redis_server import RedisServer
from inferq.shared import keys
from inferq.shared.consumer import JobConsumer
from inferq.shared.jobs import Job, Status, encode_final, new_job_id, now_ms
from inferq.shared.producer import JobProducer
from inferq.shared.queue import Final
from tests.integration.stack import Stack

MODEL = "echo"
KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"


async def fill(url: str, n: int) -> str:
    """N of tenant a's jobs (and n/10 of b's); returns the id of a's middle job."""
    r = Redis.from_url(url)
    api, q = JobProducer(r, result_ttl_s=86_400), JobConsumer(r, result_ttl_s=86_400)
    middle = ""
    out = np.zeros((1, 8), np.float32)
    sem = asyncio.Semaphore(64)

    async def one(i: int, tenant: str) -> None:
        nonlocal middle
        job = Job(id=new_job_id(MODEL), model=MODEL, inputs=[f"text {i}"], tenant=tenant)
        if i % 3 == 0:
            job.metadata = {"run": f"r{i % 7}"}
        async with sem:
            await api.submit(job)
            if i % 4 == 0:
                fields = encode_final(Status.SUCCEEDED, finished_ms=now_ms(), outputs=out)
                await q.finish([Final(MODEL, "", "", job.id, fields, tenant=tenant)])
        if tenant == "a" and i == n // 2:
            middle = job.id

    for start in range(0, n, 5000):
        await asyncio.gather(*(one(i, "a") for i in range(start, min(n, start + 5000))))
    await asyncio.gather(*(one(i, "b") for i in range(n // 10)))
    held = await r.zcard(keys.tenant_jobs(MODEL, 0, 1, "a"))
    print(
        f"tenant a holds {held} jobs; Redis used_memory {(await r.info('memory'))['used_memory_human']}"
    )
    await r.aclose()
    return middle


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    server = RedisServer(tmp / "redis", appendonly=False)
    server.start()
    stack = Stack(server.url, tmp)
    try:
        t = time.perf_counter()
        middle = asyncio.run(fill(server.url, args.jobs))
        print(f"filled in {time.perf_counter() - t:.1f} s")
        base = stack.api(log_level="WARNING", api_keys=f"a:{KEY_A},b:{KEY_B}")
        cases = {
            "newest page (limit 20)": {"limit": 20},
            "deep page (after the middle job)": {"limit": 20, "after": middle},
            "status=succeeded (limit 20)": {"limit": 20, "status": "succeeded"},
            "metadata[run]=r3 (limit 20)": {"limit": 20, "metadata[run]": "r3"},
            "limit 100": {"limit": 100},
        }
        lat: dict[str, list[float]] = {k: [] for k in cases}
        headers = {"Authorization": f"Bearer {KEY_A}"}
        with httpx.Client(base_url=base, timeout=10, headers=headers) as c:
            for params in cases.values():
                for _ in range(20):
                    assert c.get("/v1/jobs", params=params).status_code == 200
            for _ in range(args.requests):  # interleaved: load drift hits every case alike
                for name, params in cases.items():
                    t = time.perf_counter()
                    r = c.get("/v1/jobs", params=params)
                    lat[name].append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200 and r.json()["data"], r.text
        for name, xs in lat.items():
            p50, p99 = np.percentile(xs, [50, 99])
            print(f"{name:34s} n={len(xs)} median={p50:.2f} ms p99={p99:.2f} ms")
    finally:
        stack.close()
        server.stop()


if __name__ == "__main__":
    main()
