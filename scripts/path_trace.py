"""Where one echo round trip spends its time: a hop-by-hop table of the queue's own path.

Starts the stack the way `inferq bench` does (Redis with AOF, one echo worker at zero delay,
one API), sends N sequential requests on one keep-alive connection, and lines each request
up against Redis's own record of it: `redis-cli monitor` (when Redis ran each command, µs
clock, which client sent it), and `INFO commandstats` over a first, untraced pass (how long
each command ran inside Redis). The table's rows are the gaps between the request's
landmarks (client send, SUBMIT, CLAIM, START, FINISH, client receive): medians over the
requests, with the Redis commands each hop sent.

Run: .venv/bin/python scripts/path_trace.py [--requests 300] [--route infer|jobs]
     [--env KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis

from inferq.bench import systems
from inferq.bench.http import Connection
from inferq.shared import lua
from inferq.shared.lua import queue as scripts

LANDMARKS = ("SUBMIT", "CLAIM", "START", "FINISH")
_LINE = re.compile(rb'^(\d+\.\d+) \[\d+ ([^\]]+)\] "([^"]+)"(?: "([^"]*)")?')


@dataclass
class Request:
    sent: float
    received: float
    events: list[tuple[float, str]] = field(default_factory=list)  # (time, command)

    def hops(self) -> list[tuple[str, float, list[str]]]:
        """(hop name, seconds, commands in it): a hop ends at each landmark script's first
        call, or at the client's receive; a landmark is counted in the hop it ends."""
        out: list[tuple[str, float, list[str]]] = []
        prev, at, cmds = "client", self.sent, []
        seen: set[str] = set()
        for t, cmd in self.events:
            cmds.append(cmd)
            if cmd in LANDMARKS and cmd not in seen:
                seen.add(cmd)
                out.append((f"{prev} → {cmd}", t - at, cmds))
                prev, at, cmds = cmd, t, []
        out.append((f"{prev} → client", self.received - at, cmds))
        return out


def script_names() -> dict[str, str]:
    """sha1 → script name, for the scripts one round trip runs."""
    out = {}
    for name in (*LANDMARKS, "REFRESH"):
        body = lua.source(getattr(scripts, name))
        out[hashlib.sha1(body.encode()).hexdigest()] = name
    return out


async def send(base: str, route: str, n: int) -> list[tuple[float, float]]:
    conn = Connection(base)
    body = orjson.dumps({"input": "one short sentence to echo"})
    times = []
    try:
        for i in range(n + 20):  # the first 20 warm the path up and are dropped
            t0 = time.time()
            if route == "jobs":
                status, content = await conn.request("POST", "/v1/jobs", body, "application/json")
                job_id = orjson.loads(content)["id"]
                status, content = await conn.request("GET", f"/v1/jobs/{job_id}?wait=30")
            else:
                status, content = await conn.request("POST", "/v1/infer", body, "application/json")
            t1 = time.time()
            if status != 200 or b'"succeeded"' not in content:
                raise RuntimeError(f"answered {status}: {content[:200]!r}")
            if i >= 20:
                times.append((t0, t1))
            await asyncio.sleep(0.005)  # let the worker's heartbeat and reads settle between
    finally:
        conn.close()
    return times


def parse_monitor(text: bytes, names: dict[str, str]) -> list[tuple[float, str, str]]:
    """(time, client, command name) per monitored command; scripts by their name."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        cmd = m.group(3).decode().upper()
        if cmd == "EVALSHA" and m.group(4):
            cmd = names.get(m.group(4).decode(), "EVALSHA?")
        out.append((float(m.group(1)), m.group(2).decode(), cmd))
    return out


def assign(reqs: list[Request], monitored: list[tuple[float, str, str]]) -> None:
    """Give each monitored command to the request in flight when Redis ran it."""
    i = 0
    for t, _client, cmd in monitored:
        while i < len(reqs) and t > reqs[i].received:
            i += 1
        if i == len(reqs):
            return
        if t >= reqs[i].sent:
            reqs[i].events.append((t, cmd))


def table(reqs: list[Request]) -> str:
    per: dict[str, list[float]] = defaultdict(list)
    cmds: dict[str, list[str]] = defaultdict(list)
    for r in reqs:
        for name, seconds, commands in r.hops():
            per[name].append(1e6 * seconds)
            cmds[name].append(" ".join(commands) or "–")
    rows = ["| hop | requests | median µs | p90 µs | Redis commands in the hop (most common) |",
            "|---|---|---|---|---|"]  # fmt: skip
    for name, us in per.items():
        us.sort()
        rows.append(
            f"| {name} | {len(us)} | {statistics.median(us):.0f} | {us[len(us) * 9 // 10]:.0f} "
            f"| {statistics.mode(cmds[name])} |"
        )
    total = sorted(1e6 * (r.received - r.sent) for r in reqs)
    rows.append(f"| **total** | {len(total)} | {statistics.median(total):.0f} | "
                f"{total[len(total) * 9 // 10]:.0f} | |")  # fmt: skip
    return "\n".join(rows)


def redis_table(stats: dict[str, dict[str, float]], requests: int) -> str:
    """INFO commandstats over the untraced requests: a script's time includes the commands
    it ran, which are also counted on their own rows."""
    rows = ["| command | calls per request | µs per call | µs per request |", "|---|---|---|---|"]
    for name, st in sorted(stats.items(), key=lambda kv: -kv[1]["usec"]):
        calls = st["calls"] / requests
        if calls >= 0.5:
            rows.append(
                f"| {name.removeprefix('cmdstat_').upper()} | {calls:.1f} | "
                f"{st['usec_per_call']:.1f} | {st['usec'] / requests:.1f} |"
            )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--route", choices=("infer", "jobs"), default="infer")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    args = p.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    with tempfile.TemporaryDirectory() as d:
        run = systems.inferq(Path(d), "cpu", "torch", env, model="echo")
        try:
            assert run.redis_server is not None
            url = run.redis_server.url
            r = redis.Redis.from_url(url)
            r.config_resetstat()
            port = url.rsplit(":", 1)[1].split("/")[0]
            # The same requests without the monitor first: tracing slows every hop.
            plain = asyncio.run(send(run.target.bases[0], args.route, args.requests))
            stats = r.info("commandstats")  # untraced: MONITOR would slow every command
            trace = Path(d) / "monitor.txt"
            with trace.open("wb") as out:  # a file: a pipe would fill and stall redis-cli
                monitor = subprocess.Popen(
                    ["stdbuf", "-oL", "redis-cli", "-p", port, "monitor"], stdout=out
                )
                time.sleep(0.3)  # the monitor's own connect; nothing is measured yet
                times = asyncio.run(send(run.target.bases[0], args.route, args.requests))
                time.sleep(0.3)
                monitor.terminate()
                monitor.wait(timeout=10)
            text = trace.read_bytes()
        finally:
            run.close()
    reqs = [Request(t0, t1) for t0, t1 in times]
    assign(reqs, parse_monitor(text, script_names()))
    print(f"{len(reqs)} sequential echo requests on /v1/{args.route}, one keep-alive connection\n")
    print(table(reqs))
    untraced = sorted(1e6 * (t1 - t0) for t0, t1 in plain)
    print(f"\nthe same without the monitor: median {statistics.median(untraced):.0f} µs, "
          f"p90 {untraced[len(untraced) * 9 // 10]:.0f} µs")  # fmt: skip
    print()
    print(redis_table(stats, len(plain) + 20))  # + the warm-up requests


if __name__ == "__main__":
    main()
