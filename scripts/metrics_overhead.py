"""Requests/s of `POST /v1/jobs` with and without Prometheus metrics, same run.

Starts one redis-server and two API processes on it (echo model, no worker needed):

- `on`:  the real app; its counters count every submit, and a scraper reads `/metrics`
  every `--scrape-s` seconds during its rounds (a busy Prometheus);
- `off`: the same app with `app.state.metrics` replaced by no-op metrics, never scraped.

Rounds alternate in ABBA order (on, off, off, on, ...) so drift on the machine hits both
alike; the report gives every round and the median of each side. Usage:

    .venv/bin/python scripts/metrics_overhead.py --rounds 6 --seconds 5 --concurrency 32

It also times, in-process, the metric call a submit makes and one `/metrics` render:
on a busy machine those bound the overhead better than req/s differences do.
Redis is flushed between rounds, and INFERQ_MAX_QUEUE is raised so nothing is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from inferq.redis_server import RedisServer, free_port


class _NoOp:
    """Stands in for a Counter/Gauge/Histogram: every call does nothing."""

    def labels(self, *args: Any, **kwargs: Any) -> _NoOp:
        return self

    def inc(self, *args: Any, **kwargs: Any) -> None: ...

    def set(self, *args: Any, **kwargs: Any) -> None: ...

    def observe(self, *args: Any, **kwargs: Any) -> None: ...


def serve(mode: str, port: int) -> None:
    """The API process: the real app, with metrics on or replaced by no-ops."""
    import uvicorn
    from prometheus_client import CollectorRegistry

    from inferq.api.app import create_app
    from inferq.shared.metrics import ApiMetrics
    from inferq.shared.settings import Settings

    app = create_app(Settings())
    if mode == "off":
        noop: Any = _NoOp()
        app.state.metrics = ApiMetrics(CollectorRegistry(), noop, noop, noop)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def _load(base: str, seconds: float, concurrency: int, scrape_s: float) -> tuple[int, int]:
    """(successful submits, scrapes) in `seconds`; a scraper runs when scrape_s > 0."""
    body = {"inputs": ["a small text", "another short one"]}
    done = errors = scrapes = 0
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as c:
        deadline = time.monotonic() + seconds

        async def user() -> None:
            nonlocal done, errors
            while time.monotonic() < deadline:
                r = await c.post("/v1/jobs", json=body)
                if r.status_code == 202:
                    done += 1
                else:
                    errors += 1

        async def scraper() -> None:
            nonlocal scrapes
            while time.monotonic() < deadline:
                assert (await c.get("/metrics")).status_code == 200
                scrapes += 1
                await asyncio.sleep(scrape_s)

        tasks = [user() for _ in range(concurrency)]
        if scrape_s > 0:
            tasks.append(scraper())
        await asyncio.gather(*tasks)
    if errors:
        raise SystemExit(f"{errors} submits failed against {base}")
    return done, scrapes


def _wait_up(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"api {base} exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"api {base} did not come up")


def micro() -> tuple[float, float]:
    """In-process cost (µs) of what a submit adds (labels().inc()) and of one scrape."""
    import timeit

    from inferq.shared.metrics import api_metrics, render

    m = api_metrics()
    for i in range(4):
        m.queue_depth.labels(model=f"m{i}").set(i)
    n = 200_000
    inc_us = timeit.timeit(lambda: m.jobs_submitted.labels(model="echo").inc(), number=n) / n
    render_us = timeit.timeit(lambda: render(m.registry), number=2_000) / 2_000
    return inc_us * 1e6, render_us * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds per side (alternating)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of one round")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent clients")
    p.add_argument("--scrape-s", type=float, default=1.0, help="/metrics period on the 'on' side")
    p.add_argument("--serve", choices=["on", "off"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0

    with tempfile.TemporaryDirectory(prefix="inferq-overhead-") as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        server.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
        env |= {
            "INFERQ_REDIS_URL": server.url,
            "INFERQ_MODEL": "echo",
            "INFERQ_MAX_QUEUE": str(10**9),
            "INFERQ_LOG_LEVEL": "WARNING",
        }
        procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        try:
            for mode in ("on", "off"):
                port = free_port()
                argv = [sys.executable, __file__, "--serve", mode, "--port", str(port)]
                procs[mode] = (f"http://127.0.0.1:{port}", subprocess.Popen(argv, env=env))
            for base, proc in procs.values():
                _wait_up(base, proc)
            r = redis.Redis.from_url(server.url)
            rates: dict[str, list[float]] = {"on": [], "off": []}
            # Warm-up (imports, connection pools, Lua script cache), not counted.
            for mode in ("on", "off"):
                asyncio.run(_load(procs[mode][0], 1.0, args.concurrency, 0))
            for i in range(args.rounds * 2):
                # ABBA order (on, off, off, on, ...): a drift or an order effect cancels out.
                mode = ("on", "off")[(i % 2) ^ ((i // 2) % 2)]
                r.flushall()
                scrape_s = args.scrape_s if mode == "on" else 0
                n, scrapes = asyncio.run(
                    _load(procs[mode][0], args.seconds, args.concurrency, scrape_s)
                )
                rate = n / args.seconds
                rates[mode].append(rate)
                extra = f" ({scrapes} scrapes)" if mode == "on" else ""
                print(f"round {i // 2 + 1} metrics={mode:3s} {rate:8.1f} req/s{extra}", flush=True)
            r.close()
        finally:
            for _, proc in procs.values():
                proc.terminate()
                proc.wait(10)
            server.stop()
    inc_us, render_us = micro()
    print(
        f"in-process: counter labels().inc() {inc_us:.2f} µs, one /metrics render {render_us:.0f} µs"
    )
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(
        f"POST /v1/jobs, concurrency {args.concurrency}, {args.rounds}×{args.seconds:g}s per side: "
        f"median with metrics {on:.1f} req/s, without {off:.1f} req/s, "
        f"overhead {(off - on) / off * 100:+.1f}% ({(1 / on - 1 / off) * 1e6:+.1f} µs/request)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
