"""Is it up: `/healthz` (the process), `/readyz` (Redis takes new work + a worker for the
default model) and `/v1/health` (what an operator reads: `inferq.api.core.health`). None of
them ever answers 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from fastapi import APIRouter

from inferq.api.core.health import health_report
from inferq.api.responses import FastJSON
from inferq.api.routes.deps import Config, Memory, Queue, Registry
from inferq.api.webhooks.store import counts as webhook_counts
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import now_ms

log = logging.getLogger("inferq.api")

router = APIRouter(tags=["health"])
admin = APIRouter(tags=["health"])  # the operator's: INFERQ_ADMIN_KEYS (the app adds it)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (no Redis call)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(settings: Config, queue: Queue, registry: Registry, memory: Memory) -> FastJSON:
    """200 only when Redis answers and takes new work, and a live worker serves the default
    model. 503 with the reason while the memory guard refuses every submit (Redis past
    INFERQ_REDIS_MEMORY_HIGH_WATER) or Redis refused a write lately (OOM, MISCONF...):
    a balancer then sends new clients elsewhere rather than to certain 503s."""
    try:
        await queue.ping()
        refusing = await memory.refusing()
        now = now_ms()
        unserved = [m for m in sorted(settings.served_models) if not await registry.live(m, now)]
    except QueueUnavailable as e:
        # Redis's words name hosts and ports: the log has them, an unauthenticated caller not.
        log.warning("/readyz: redis unreachable: %s", e)
        body = {"status": "unavailable", "redis": False, "reason": "redis unreachable"}
        return FastJSON(body, status_code=503)
    if refusing is not None:
        body = {"status": "refusing", "redis": True, "reason": refusing}
        return FastJSON(body, status_code=503)
    ready = settings.default_model.name not in unserved
    body = {"status": "ready" if ready else "no_worker", "redis": True, "unserved_models": unserved}
    return FastJSON(body, status_code=200 if ready else 503)


@admin.get("/v1/health")
async def health(settings: Config, queue: Queue, registry: Registry) -> FastJSON:
    """Overall status, Redis round-trip, per model: queue depth, oldest age, live workers."""
    models = sorted(settings.served_models)

    def webhooks() -> Awaitable[dict[str, int]]:
        return webhook_counts(queue.redis, models, queue.shards)

    code, body = await health_report(queue, registry, models, webhooks)
    return FastJSON(body, status_code=code)
