"""HTTP load generators (httpx, asyncio): closed loop (N clients) and open loop (Poisson).

Only ever aimed at 127.0.0.1, bounded in time and in request count. One item per request.
Latency is measured per request; in the open loop it starts at the *scheduled* arrival
time, so a stalled server cannot hide its queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

_BATCH_SIZE = re.compile(rb'"batch_size":(\d+)')
_ID = re.compile(rb'"id":"([^"]+)"')
MAX_REQUESTS = 200_000
MAX_IN_FLIGHT = 4096


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go. kind: infer (inferq sync), jobs (submit + long-poll), seed, litserve."""

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


async def _one(client: httpx.AsyncClient, base: str, kind: str, text: str) -> int | None:
    """One item through `kind`; the job's batch size when the server reports one."""
    if kind == "jobs":
        r = await client.post(f"{base}/v1/jobs", json={"input": text})
        if r.status_code != 202 or not (m := _ID.search(r.content)):
            raise RuntimeError(f"submit answered {r.status_code}")
        r = await client.get(f"{base}/v1/jobs/{m.group(1).decode()}", params={"wait": 30})
    else:
        path = "/predict" if kind == "litserve" else "/v1/infer"
        r = await client.post(f"{base}{path}", json={"input": text})
    if r.status_code != 200 or (kind in ("jobs", "infer") and b'"succeeded"' not in r.content):
        raise RuntimeError(f"answered {r.status_code}")
    m = _BATCH_SIZE.search(r.content)
    return int(m.group(1)) if m else None


def _client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0))


async def closed_loop(
    target: Target,
    texts: Sequence[str],
    tokens: Sequence[int],
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
) -> LoadResult:
    """`concurrency` clients, each sending its next request as soon as the last answered.

    Requests that both start after the warmup and finish before the end are counted.
    """
    res = LoadResult(duration_s=duration_s)
    order = itertools.cycle(range(len(texts)))
    t0 = time.perf_counter()
    start, end = t0 + warmup_s, t0 + warmup_s + duration_s
    sent = itertools.count()

    async def client_loop(client: httpx.AsyncClient, worker: int) -> None:
        base = target.bases[worker % len(target.bases)]
        while (now := time.perf_counter()) < end and next(sent) < MAX_REQUESTS:
            i = next(order)
            try:
                bs = await _one(client, base, target.kind, texts[i])
            except (httpx.HTTPError, RuntimeError):
                if now >= start:
                    res.errors += 1
                continue
            done = time.perf_counter()
            if now >= start and done <= end:
                res.latencies_ms.append((done - now) * 1000)
                res.real_tokens += tokens[i]
                if bs is not None:
                    res.batch_sizes.append(bs)

    async with _client(concurrency) as client:
        await asyncio.gather(*(client_loop(client, w) for w in range(concurrency)))
    return res


def arrivals(rate_per_s: float, duration_s: float, seed: int = 7) -> list[float]:
    """Poisson arrival offsets (seconds) over `duration_s`, deterministic for a seed."""
    rng, t, out = random.Random(seed), 0.0, []
    while len(out) < MAX_REQUESTS:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            break
        out.append(t)
    return out


async def open_loop(
    target: Target,
    texts: Sequence[str],
    tokens: Sequence[int],
    rate_per_s: float,
    duration_s: float,
    grace_s: float = 10.0,
) -> LoadResult:
    """Poisson arrivals at `rate_per_s`; a request unanswered `grace_s` after the end errs."""
    res = LoadResult(duration_s=duration_s)
    tasks: set[asyncio.Task[None]] = set()

    async def fire(client: httpx.AsyncClient, at: float, i: int, n: int) -> None:
        try:
            bs = await _one(client, target.bases[n % len(target.bases)], target.kind, texts[i])
        except (httpx.HTTPError, RuntimeError):
            res.errors += 1
            return
        res.latencies_ms.append((time.perf_counter() - at) * 1000)
        res.real_tokens += tokens[i]
        if bs is not None:
            res.batch_sizes.append(bs)

    async with _client(MAX_IN_FLIGHT) as client:
        t0 = time.perf_counter()
        for n, offset in enumerate(arrivals(rate_per_s, duration_s)):
            at = t0 + offset
            if (delay := at - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= MAX_IN_FLIGHT:
                res.errors += 1  # dropped: the server is hopelessly behind
                continue
            task = asyncio.create_task(fire(client, at, n % len(texts), n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            res.errors += len(pending)
    return res
