"""What an operator reads at `/v1/health`, as plain data (the routes: `routes.health`).

`/v1/health` comes from Redis only: the queue (XLEN and the first entry of each lane) and the
heartbeats the workers write (`inferq.shared.registry`). The API never touches a device;
device memory is what the workers last published.

| status     | when                                                                   |
|------------|------------------------------------------------------------------------|
| `ok`       | Redis answers and every served model has at least one live worker      |
| `degraded` | Redis answers, but a model has no live worker, or items have waited    |
|            | longer than `STALLED_AFTER_S` while no worker finished a batch in that |
|            | time                                                                   |
| `down`     | Redis does not answer (HTTP 503)                                       |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import now_ms
from inferq.shared.producer import JobProducer
from inferq.shared.registry import WorkerRegistry

# Items older than this with no batch finished by any worker in that window: stalled.
STALLED_AFTER_S = 30.0


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
    queue: JobProducer,
    registry: WorkerRegistry,
    models: list[str],
    webhooks: Callable[[], Awaitable[dict[str, int]]],
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of `/v1/health`; Redis failures become `down`, never raise.
    `webhooks`: the deliveries queued, retrying and dead (read by the webhook subsystem)."""
    try:
        rtt_ms = await queue.ping()
        queues = await queue.lanes(models)
        now = now_ms()
        workers = await registry.beats(models, now)
        deliveries = await webhooks()
    except QueueUnavailable as e:
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
        "webhooks": deliveries,
    }
    return 200, body
