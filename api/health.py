"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request

from inferq.api.responses import FastJSON
from inferq.shared.jobs import now_ms

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (no Redis call)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> FastJSON:
    """200 only when Redis answers and a live worker serves the default model."""
    jobs = request.app.state.jobs
    default = jobs.settings.default_model.name
    try:
        await jobs.queue.ping()
        unserved = [m for m in sorted(jobs.models) if not await jobs.registry.live(m, now_ms())]
    except Exception as e:  # any Redis failure means not ready; never a 500 here
        return FastJSON(
            {"status": "unavailable", "redis": False, "reason": str(e)}, status_code=503
        )
    ready = default not in unserved
    body = {"status": "ready" if ready else "no_worker", "redis": True, "unserved_models": unserved}
    return FastJSON(body, status_code=200 if ready else 503)
