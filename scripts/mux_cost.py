"""What one script call costs the client, in CPU: on redis-py's pooled connections, as the
API's `ScriptBatch` pipelines a turn's calls there, and on one multiplexed connection
(`inferq.shared.redis_conn.Multiplexed`, what the processes use by default).

N callers (tasks) each make calls of a one-line script with a 300-byte argument (a short
submit's size) back to back against an idle redis-server started here, under uvloop as the
processes run; the client's CPU per call is `time.process_time`, so the server's time does
not enter. The ways are alternated within each round (medians of the rounds).

Run: .venv/bin/python scripts/mux_cost.py [--calls 20000] [--callers 1,8,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from redis.asyncio import Redis

from inferq.redis_server import RedisServer
from inferq.shared.producer import ScriptBatch
from inferq.shared.redis_clients import api_client
from inferq.shared.redis_conn import register

SCRIPT = "return ARGV[1]"
PAYLOAD = b"x" * 300
WAYS = ("pooled", "pooled, ScriptBatch", "multiplexed")


def caller(way: str, client: Redis) -> Callable[[], Awaitable[object]]:
    script = register(client, SCRIPT)
    if way == "pooled, ScriptBatch":
        batch = ScriptBatch(client, script)
        return lambda: batch(["k"], [PAYLOAD])
    return lambda: script(keys=["k"], args=[PAYLOAD])


async def cost(url: str, way: str, calls: int, callers: int) -> float:
    """µs of client CPU per call."""
    client = api_client(url, timeout_s=5, pool_size=64, multiplex=way == "multiplexed")
    try:
        call = caller(way, client)
        await asyncio.gather(*(call() for _ in range(callers)))  # connected and loaded

        async def one_caller(n: int) -> None:
            for _ in range(n):
                await call()

        started = time.process_time()
        await asyncio.gather(*(one_caller(calls // callers) for _ in range(callers)))
        return (time.process_time() - started) / (calls // callers * callers) * 1e6
    finally:
        await client.aclose()


async def main(calls: int, callers: list[int], rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        server = RedisServer(Path(d), appendonly=False)
        server.start()
        try:
            got: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):
                for n in callers:
                    for way in WAYS:
                        got.setdefault((way, n), []).append(await cost(server.url, way, calls, n))
        finally:
            server.stop()
    print("| callers | " + " | ".join(f"{w}: µs a call" for w in WAYS) + " |")
    print("|---" * (len(WAYS) + 1) + "|")
    for n in callers:
        cells = [
            f"{statistics.median(got[w, n]):.1f} ({', '.join(f'{x:.1f}' for x in got[w, n])})"
            for w in WAYS
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--callers", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    uvloop.run(main(a.calls, [int(c) for c in a.callers.split(",")], a.rounds))
