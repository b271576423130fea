"""HTTP load generators (asyncio, bench.http): closed loop (N clients), open loop (Poisson).

Only ever aimed at 127.0.0.1, bounded in time and in request count. One item per request.
Latency is measured per request; in the open loop it starts at the *scheduled* arrival
time, so a stalled server cannot hide its queueing (no coordinated omission). Inputs are
texts (each sent as `{"input": text}`) or ready bodies (`http.Body`: image uploads, multipart),
all encoded before the clock starts.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack
import orjson

from inferq.bench.http import Body, Connection, HTTPError

MSGPACK = "application/msgpack"  # a job record's packed answer (POST /v1/infer only, here)
_BATCH_SIZE = re.compile(rb'"batch_size":(\d+)')
_ID = re.compile(rb'"id":"([^"]+)"')
MAX_REQUESTS = 200_000
MAX_IN_FLIGHT = 4096
# The route each request kind posts one item to; the rest (inferq, seed, floors) take
# inferq's POST /v1/infer.
PATHS = {"litserve": "/predict", "infinity": "/embeddings"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go. kind: infer (inferq sync), jobs (submit + long-poll), submit (POST
    /v1/jobs alone, answered 202), seed, litserve,
    infinity, floor-fastapi, floor-redis (PATHS: the route each kind posts to)."""

    bases: tuple[str, ...]
    kind: str

    def __post_init__(self) -> None:
        for b in self.bases:
            if not b.startswith("http://127.0.0.1:"):
                raise ValueError(f"bench only loads 127.0.0.1, got {b!r}")


@dataclass(slots=True)
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    errors: int = 0
    real_tokens: int = 0
    duration_s: float = 0.0


FAILED = (OSError, HTTPError, TimeoutError, RuntimeError)


async def _one(conn: Connection, kind: str, body: Body) -> int | None:
    """One item (`body`) through `kind`; the job's batch size when the server reports one."""
    if kind == "submit":  # the front door alone: accepted is the answer
        status, _ = await conn.request("POST", "/v1/jobs", body.data, body.content_type)
        if status != 202:
            raise RuntimeError(f"submit answered {status}")
        return None
    if kind == "jobs":
        status, content = await conn.request("POST", "/v1/jobs", body.data, body.content_type)
        if status != 202 or not (m := _ID.search(content)):
            raise RuntimeError(f"submit answered {status}")
        status, content = await conn.request("GET", f"/v1/jobs/{m.group(1).decode()}?wait=30")
    else:
        path = PATHS.get(kind, "/v1/infer")
        status, content = await conn.request(
            "POST", path, body.data, body.content_type, body.accept
        )
    if body.accept == MSGPACK and status == 200 and kind == "infer":
        record = msgpack.unpackb(content)
        if record.get("status") != "succeeded":
            raise RuntimeError(f"answered {status}, {record.get('status')}")
        return (record.get("timings") or {}).get("batch_size")  # type: ignore[no-any-return]
    if status != 200 or (kind in ("jobs", "infer") and b'"succeeded"' not in content):
        raise RuntimeError(f"answered {status}")
    m = _BATCH_SIZE.search(content)
    return int(m.group(1)) if m else None


Inputs = Sequence[str] | Sequence[Body]


def _bodies(inputs: Inputs) -> list[Body]:
    return [x if isinstance(x, Body) else Body(orjson.dumps({"input": x})) for x in inputs]


async def closed_loop(
    target: Target,
    inputs: Inputs,
    tokens: Sequence[int],
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
) -> LoadResult:
    """`concurrency` clients, each sending its next request as soon as the last answered.

    Requests that finish inside the window (after the warmup, before the end) are counted,
    whenever they started: counting only those that also started inside it would drop the
    last latency's worth of work, a third of a 4 s window at a 1.3 s p50 (128 clients).
    """
    res = LoadResult(duration_s=duration_s)
    bodies = _bodies(inputs)
    order = itertools.cycle(range(len(inputs)))
    t0 = time.perf_counter()
    start, end = t0 + warmup_s, t0 + warmup_s + duration_s
    sent = itertools.count()

    async def client_loop(worker: int) -> None:
        conn = Connection(target.bases[worker % len(target.bases)])
        try:
            await requests(conn)
        finally:
            conn.close()

    async def requests(conn: Connection) -> None:
        while (now := time.perf_counter()) < end and next(sent) < MAX_REQUESTS:
            i = next(order)
            try:
                bs = await _one(conn, target.kind, bodies[i])
            except FAILED:
                if start <= time.perf_counter() <= end:
                    res.errors += 1
                continue
            done = time.perf_counter()
            if start <= done <= end:
                res.latencies_ms.append((done - now) * 1000)
                res.real_tokens += tokens[i]
                if bs is not None:
                    res.batch_sizes.append(bs)

    await asyncio.gather(*(client_loop(w) for w in range(concurrency)))
    return res


def arrivals(rate_per_s: float, duration_s: float, seed: int = 7) -> list[float]:
    """Poisson arrival offsets (seconds) over `duration_s`, deterministic for a seed."""
    rng, t = random.Random(seed), 0.0
    out: list[float] = []
    while len(out) < MAX_REQUESTS:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            break
        out.append(t)
    return out


async def open_loop(
    target: Target,
    inputs: Inputs,
    tokens: Sequence[int],
    rate_per_s: float,
    duration_s: float,
    grace_s: float = 10.0,
) -> LoadResult:
    """Poisson arrivals at `rate_per_s`; a request unanswered `grace_s` after the end errs."""
    res = LoadResult(duration_s=duration_s)
    bodies = _bodies(inputs)
    tasks: set[asyncio.Task[None]] = set()
    idle: dict[str, list[Connection]] = {b: [] for b in target.bases}  # keep-alive pool per base

    async def fire(at: float, i: int, n: int) -> None:
        base = target.bases[n % len(target.bases)]
        conn = idle[base].pop() if idle[base] else Connection(base)
        try:
            bs = await _one(conn, target.kind, bodies[i])
        except FAILED:
            res.errors += 1
            return
        finally:
            idle[base].append(conn)
        res.latencies_ms.append((time.perf_counter() - at) * 1000)
        res.real_tokens += tokens[i]
        if bs is not None:
            res.batch_sizes.append(bs)

    t0 = time.perf_counter()
    for n, offset in enumerate(arrivals(rate_per_s, duration_s)):
        at = t0 + offset
        if (delay := at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_IN_FLIGHT:
            res.errors += 1  # dropped: the server is hopelessly behind
            continue
        task = asyncio.create_task(fire(at, n % len(inputs), n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    res.errors += await _settle(tasks, grace_s)
    for conns in idle.values():
        for conn in conns:
            conn.close()
    return res


async def _settle(tasks: set[asyncio.Task[None]], grace_s: float) -> int:
    """Wait `grace_s` for requests still out; cancel the rest and count them."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=grace_s)
    for task in pending:
        task.cancel()
    return len(pending)
