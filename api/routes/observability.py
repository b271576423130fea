"""What an operator scrapes or lists: `/metrics` (Prometheus, admin only) and `/v1/models`
(every caller; its workers' detail, hosts and PIDs among it, for admins only)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response

from inferq.api.responses import FastJSON
from inferq.api.routes.deps import Catalog, Config, Metrics, Parts, Registry, Viewer
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import now_ms
from inferq.shared.metrics import CONTENT_TYPE_LATEST, render

log = logging.getLogger("inferq.api")

router = APIRouter(tags=["observability"])  # every caller with a key (`Viewer`)
admin = APIRouter(tags=["observability"])  # the operator's: INFERQ_ADMIN_KEYS (the app adds it)

_MODEL_WORKER_FIELDS = ("id", "host", "device", "backend", "token_ceiling", "calibration")


@router.get("/v1/models")
async def models(
    settings: Config, catalog: Catalog, registry: Registry, detail: Viewer
) -> FastJSON:
    """Served models: what each takes and gives, whether a worker serves it; for an admin
    also its target and live workers (device, backend, live ceiling, calibration)."""
    names = sorted(settings.served_models)
    try:
        workers = await registry.beats(names, now_ms())
        infos = {n: await catalog.info(n) for n in names}
        code = 200
    except QueueUnavailable as e:
        log.warning("/v1/models: redis unreachable: %s", e)
        workers, infos, code = {}, {}, 503
    listed = []
    for n in names:
        info = infos.get(n)
        entry: dict[str, object] = {"name": n, "ready": bool(workers.get(n))}
        if detail:
            entry["target"] = settings.served_models[n].target
        if info is not None:
            entry |= {
                "inputs": list(info.inputs),
                "output": info.output,
                "parameters": info.parameters,
                "max_cost": info.max_cost,
                "matryoshka_dims": list(info.matryoshka_dims),  # `dimensions` it takes
            }
        if detail:
            beats = workers.get(n, [])
            entry["workers"] = [{f: w.get(f) for f in _MODEL_WORKER_FIELDS} for w in beats]
        listed.append(entry)
    body: dict[str, object] = {"default": settings.default_model.name, "models": listed}
    if code != 200:
        body["error"] = {"code": "unavailable", "message": "the queue is unreachable"}
    return FastJSON(body, status_code=code)


@admin.get("/metrics", include_in_schema=False)
async def metrics(settings: Config, parts: Parts, m: Metrics) -> Response:
    """The API's registry in Prometheus text; queue depths are read from Redis first."""
    m.requests_waiting.set(parts.notifier.waiting)
    try:
        for n in sorted(settings.served_models):
            m.queue_depth.labels(model=n).set(await parts.queue.queue_depth(n))
    except QueueUnavailable as e:  # serve the rest; the gauge keeps its last value
        log.warning("/metrics: queue depth not refreshed, redis unreachable: %s", e)
    return Response(render(m.registry), media_type=CONTENT_TYPE_LATEST)
