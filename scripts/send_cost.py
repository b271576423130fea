"""What bounding one command's write costs the client, in CPU: redis-py's own write (each
command under `asyncio.wait_for`, a task and a timer of its own) against `LeanConnection`'s
(`asyncio.timeout`), and against no timeout at all.

Two measures, alternated in rounds: the bare wrappers around a coroutine that does nothing,
and a PING round trip to an idle redis-server started here (the client's CPU time per PING,
`time.process_time`, so the server's time does not enter). Beside them, the floors a round
trip and a model-thread hop stand on: PING written and read on a bare asyncio stream (the
socket, the kernel and the event loop, no client library), and `run_in_executor` of a
function that does nothing (the worker's hop to its prepare and model threads).

Run: .venv/bin/python scripts/send_cost.py [--pings 20000] [--rounds 3] [--loop asyncio|uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from redis.asyncio import Redis

from inferq.redis_server import RedisServer
from inferq.shared.redis_conn import fast_packing


async def _nothing() -> None:
    return None


async def wrappers(n: int) -> dict[str, float]:
    """µs of CPU per call: bare, under wait_for, under asyncio.timeout."""
    out: dict[str, float] = {}
    t = time.process_time()
    for _ in range(n):
        await _nothing()
    out["bare"] = (time.process_time() - t) / n * 1e6
    t = time.process_time()
    for _ in range(n):
        await asyncio.wait_for(_nothing(), 5)
    out["wait_for"] = (time.process_time() - t) / n * 1e6
    t = time.process_time()
    for _ in range(n):
        async with asyncio.timeout(5):
            await _nothing()
    out["asyncio.timeout"] = (time.process_time() - t) / n * 1e6
    return out


async def pings(url: str, make: Callable[[], Redis], n: int) -> float:
    """µs of client CPU per PING."""
    client = make()
    try:
        await client.ping()
        t = time.process_time()
        for _ in range(n):
            await client.ping()
        return (time.process_time() - t) / n * 1e6
    finally:
        await client.aclose()


async def bare_pings(host: str, port: int, n: int) -> float:
    """µs of CPU per PING on a bare stream: what any client's round trip costs at least."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        ping = b"*1\r\n$4\r\nPING\r\n"
        t = time.process_time()
        for _ in range(n):
            writer.write(ping)
            if await reader.readuntil(b"\r\n") != b"+PONG\r\n":
                raise RuntimeError("PING did not answer PONG")
        return (time.process_time() - t) / n * 1e6
    finally:
        writer.close()


async def hops(n: int) -> float:
    """µs of CPU per hop to a one-thread pool and back (the thread's time included)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        await loop.run_in_executor(pool, int)
        t = time.process_time()
        for _ in range(n):
            await loop.run_in_executor(pool, int)
        return (time.process_time() - t) / n * 1e6


async def main(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d, RedisServer(Path(d)) as server:
        url = server.url
        clients: dict[str, Callable[[], Redis]] = {
            "redis-py, socket_timeout 5 s": lambda: Redis.from_url(url, socket_timeout=5.0),
            "LeanConnection, socket_timeout 5 s": lambda: fast_packing(
                Redis.from_url(url, socket_timeout=5.0)
            ),
            "redis-py, no socket_timeout": lambda: Redis.from_url(url),
        }
        got: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, us in (await wrappers(100_000)).items():
                got.setdefault(name, []).append(us)
            for name, make in clients.items():
                got.setdefault(name, []).append(await pings(url, make, n))
            got.setdefault("bare stream (no client library)", []).append(
                await bare_pings(server.host, server.port, n)
            )
            got.setdefault("thread hop (run_in_executor)", []).append(await hops(n))
        for name, values in got.items():
            spread = " ".join(f"{v:.1f}" for v in values)
            print(f"{name:40s} median {statistics.median(values):7.1f} µs  ({spread})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main(args.pings, args.rounds))
