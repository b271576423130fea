"""What an operator reads: `/metrics`, `/v1/health`, `/v1/models`.

Everything here comes from Redis: the queue (XLEN and the first entry of each model's
stream) and the heartbeats the workers write (`keys.workers(model)` zset scored by
expiry ms, `keys.worker(id)` hash of strings). The API never touches a device; device
memory is what the workers last published.

`/v1/health` never answers 500: Redis unreachable is `down` with HTTP 503 and a body.

| status     | when                                                                   |
|------------|------------------------------------------------------------------------|
| `ok`       | Redis answers and every served model has at least one live worker      |
| `degraded` | Redis answers, but a model has no live worker, or items have waited    |
|            | longer than `STALLED_AFTER_S` while no worker finished a batch in that |
|            | time                                                                   |
| `down`     | Redis does not answer (HTTP 503)                                       |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response
from redis.asyncio import Redis
from redis.exceptions import RedisError

from inferq.api.responses import FastJSON
from inferq.shared import keys
from inferq.shared.jobs import now_ms
from inferq.shared.metrics import CONTENT_TYPE_LATEST, ApiMetrics, api_metrics, render

log = logging.getLogger("inferq.api")

router = APIRouter(tags=["observability"])

# Items older than this with no batch finished by any worker in that window: stalled.
STALLED_AFTER_S = 30.0

# Heartbeat fields (all strings in the hash) and how to read them; others pass through.
_INT_FIELDS = frozenset(
    {
        "pid",
        "token_ceiling",
        "last_batch_size",
        "last_batch_tokens",
        "last_batch_at_ms",
        "batches",
        "ooms",
        "held_items",
        "beat_ms",
        "mem_allocated",
        "mem_reserved",
        "mem_total",
    }
)
_FLOAT_FIELDS = frozenset({"items_per_s"})
# Output order (the hash's own order is arbitrary); fields not listed follow, sorted.
_ORDER = (
    "id", "host", "pid", "model", "backend", "device", "token_ceiling", "items_per_s",
    "last_batch_size", "last_batch_tokens", "last_batch_at_ms", "batches", "ooms",
    "held_items", "mem_allocated", "mem_reserved", "mem_total", "beat_ms",
)  # fmt: skip
_RANK = {f: i for i, f in enumerate(_ORDER)}
_UNREACHABLE = (RedisError, OSError, TimeoutError)


def metrics_of(app: FastAPI) -> ApiMetrics:
    """The app's `ApiMetrics` (`app.state.metrics`), created on first use if unset."""
    m = getattr(app.state, "metrics", None)
    if m is None:
        m = app.state.metrics = api_metrics()
    return m


def _text(v: bytes | str) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _number(v: str, kind: type[int] | type[float]) -> int | float | str | None:
    if v == "" or v.lower() == "none":
        return None
    try:
        return kind(float(v)) if kind is int else float(v)
    except ValueError:
        return v  # keep what the worker wrote rather than lose it


def _field_rank(kv: tuple[str, str]) -> tuple[int, str]:
    return _RANK.get(kv[0], len(_RANK)), kv[0]


def decode_heartbeat(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Any]:
    """A heartbeat hash as JSON-ready values: numbers as numbers, calibration parsed.

    Tolerant by design: missing fields are absent, unparsable numbers stay strings,
    a calibration that is not JSON is returned as its string.
    """
    out: dict[str, Any] = {}
    fields = sorted(((_text(k), _text(v)) for k, v in raw.items()), key=_field_rank)
    for key, val in fields:
        if key in _INT_FIELDS:
            out[key] = _number(val, int)
        elif key in _FLOAT_FIELDS:
            out[key] = _number(val, float)
        elif key == "calibration":
            try:
                out[key] = orjson.loads(val) if val else None
            except orjson.JSONDecodeError:
                out[key] = val
        else:
            out[key] = val
    return out


def _entry_ms(entry_id: bytes | str) -> int | None:
    """Milliseconds part of a stream entry id `<ms>-<seq>`."""
    head = _text(entry_id).split("-", 1)[0]
    return int(head) if head.isdigit() else None


async def _workers(redis: Redis, models: list[str], now: int) -> dict[str, list[dict[str, Any]]]:
    """Live workers per model: zset members with expiry ≥ now, then their heartbeat hashes."""
    async with redis.pipeline(transaction=False) as p:
        for m in models:
            p.zrangebyscore(keys.workers(m), now, "+inf")
        ids_per_model = [[_text(i) for i in ids] for ids in await p.execute()]
    flat = [wid for ids in ids_per_model for wid in ids]
    beats: list[Any] = []
    if flat:
        async with redis.pipeline(transaction=False) as p:
            for wid in flat:
                p.hgetall(keys.worker(wid))
            beats = await p.execute()
    by_id = {wid: decode_heartbeat(b or {}) for wid, b in zip(flat, beats, strict=True)}
    out: dict[str, list[dict[str, Any]]] = {}
    for m, ids in zip(models, ids_per_model, strict=True):
        # A member whose hash just expired still counts (its zset score says live).
        out[m] = [by_id[wid] | {"id": by_id[wid].get("id", wid)} for wid in sorted(ids)]
        for w in out[m]:
            beat = w.get("beat_ms")
            w["beat_age_ms"] = now - beat if isinstance(beat, int) else None
    return out


async def _queues(redis: Redis, models: list[str]) -> dict[str, tuple[int, int | None]]:
    """Per model, over all priority lanes: (entries, ms timestamp of the oldest or None)."""
    lanes = len(keys.LANES)
    async with redis.pipeline(transaction=False) as p:
        for m in models:
            for s in keys.streams(m):
                p.xlen(s)
                p.xrange(s, "-", "+", count=1)
        replies = await p.execute()
    out: dict[str, tuple[int, int | None]] = {}
    for i, m in enumerate(models):
        mine = replies[2 * lanes * i : 2 * lanes * (i + 1)]
        depth = sum(int(n) for n in mine[::2])
        firsts = [
            ms for first in mine[1::2] if first and (ms := _entry_ms(first[0][0])) is not None
        ]
        out[m] = (depth, min(firsts) if firsts else None)
    return out


def _model_status(
    depth: int, oldest_age_ms: int | None, workers: list[dict[str, Any]], now: int
) -> str:
    if not workers:
        return "unserved"
    stalled_ms = STALLED_AFTER_S * 1000
    if depth and oldest_age_ms is not None and oldest_age_ms > stalled_ms:
        last = max((w.get("last_batch_at_ms") or 0 for w in workers), default=0)
        last = last if isinstance(last, int) else 0
        if now - last > stalled_ms:
            return "stalled"
    return "ok"


async def health_report(redis: Redis, models: list[str]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of `/v1/health`; Redis failures become `down`, never raise."""
    started = time.perf_counter()
    try:
        await redis.ping()
        rtt_ms = round((time.perf_counter() - started) * 1000, 3)
        queues = await _queues(redis, models)
        now = now_ms()
        workers = await _workers(redis, models, now)
    except _UNREACHABLE as e:
        body = {
            "status": "down",
            "checked_at_ms": now_ms(),
            "redis": {"up": False, "rtt_ms": None, "error": f"{type(e).__name__}: {e}"},
            "models": {m: {"status": "unknown"} for m in models},
            "problems": ["redis unreachable"],
        }
        return 503, body
    per_model: dict[str, Any] = {}
    problems: list[str] = []
    for m in models:
        depth, oldest_ms = queues[m]
        age = max(0, now - oldest_ms) if oldest_ms is not None else None
        status = _model_status(depth, age, workers[m], now)
        if status == "unserved":
            problems.append(f"{m}: no live worker")
        elif status == "stalled":
            problems.append(f"{m}: items queued {age} ms and no batch finished")
        per_model[m] = {
            "status": status,
            "queue_depth": depth,
            "oldest_queued_age_ms": age,
            "workers": workers[m],
        }
    body = {
        "status": "degraded" if problems else "ok",
        "checked_at_ms": now,
        "redis": {"up": True, "rtt_ms": rtt_ms},
        "models": per_model,
        "problems": problems,
    }
    return 200, body


@router.get("/v1/health")
async def health(request: Request) -> FastJSON:
    """Overall status, Redis round-trip, per model: queue depth, oldest age, live workers."""
    models = sorted(request.app.state.settings.served_models)
    code, body = await health_report(request.app.state.redis, models)
    return FastJSON(body, status_code=code)


_MODEL_WORKER_FIELDS = ("id", "host", "device", "backend", "token_ceiling", "calibration")


@router.get("/v1/models")
async def models(request: Request) -> FastJSON:
    """Served models, each with its live workers (device, backend, live ceiling, calibration)."""
    settings = request.app.state.settings
    names = sorted(settings.served_models)
    try:
        workers = await _workers(request.app.state.redis, names, now_ms())
        code = 200
    except _UNREACHABLE as e:
        log.warning("/v1/models: redis unreachable: %s", e)
        workers, code = {}, 503
    body = {
        "default": settings.default_model.name,
        "models": [
            {
                "name": n,
                "target": settings.served_models[n].target,
                "workers": [
                    {f: w.get(f) for f in _MODEL_WORKER_FIELDS} for w in workers.get(n, [])
                ],
            }
            for n in names
        ],
    }
    if code != 200:
        body["error"] = {"code": "unavailable", "message": "the queue is unreachable"}
    return FastJSON(body, status_code=code)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The API's registry in Prometheus text; queue depths are read from Redis first."""
    m = metrics_of(request.app)
    names = sorted(request.app.state.settings.served_models)
    try:
        queue = request.app.state.jobs.queue
        for n in names:
            m.queue_depth.labels(model=n).set(await queue.queue_depth(n))
    except _UNREACHABLE as e:  # serve the rest; the gauge keeps its last value
        log.warning("/metrics: queue depth not refreshed, redis unreachable: %s", e)
    return Response(render(m.registry), media_type=CONTENT_TYPE_LATEST)
