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
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response

from inferq.api.responses import FastJSON
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import now_ms
from inferq.shared.metrics import CONTENT_TYPE_LATEST, ApiMetrics, api_metrics, render
from inferq.shared.queue import JobQueue
from inferq.shared.registry import WorkerRegistry

log = logging.getLogger("inferq.api")

router = APIRouter(tags=["observability"])

# Items older than this with no batch finished by any worker in that window: stalled.
STALLED_AFTER_S = 30.0

_UNREACHABLE = (QueueUnavailable,)


def metrics_of(app: FastAPI) -> ApiMetrics:
    """The app's `ApiMetrics` (`app.state.metrics`), created on first use if unset."""
    m = getattr(app.state, "metrics", None)
    if m is None:
        m = app.state.metrics = api_metrics()
    return m


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


async def health_report(
    queue: JobQueue, registry: WorkerRegistry, models: list[str]
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of `/v1/health`; Redis failures become `down`, never raise."""
    try:
        rtt_ms = await queue.ping()
        queues = await queue.lanes(models)
        now = now_ms()
        workers = await registry.beats(models, now)
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
    code, body = await health_report(
        request.app.state.jobs.queue, request.app.state.registry, models
    )
    return FastJSON(body, status_code=code)


_MODEL_WORKER_FIELDS = ("id", "host", "device", "backend", "token_ceiling", "calibration")


@router.get("/v1/models")
async def models(request: Request) -> FastJSON:
    """Served models, each with its live workers (device, backend, live ceiling, calibration)."""
    settings = request.app.state.settings
    names = sorted(settings.served_models)
    try:
        workers = await request.app.state.registry.beats(names, now_ms())
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
