"""`GET /v1/usage`: what the caller's tenant holds against its quotas, and nothing of anyone
else's (docs/operations.md, "Security and limits")."""

from __future__ import annotations

from fastapi import APIRouter

from inferq.api.responses import FastJSON
from inferq.api.routes.deps import Batches, Config, Files, Parts, Tenant

router = APIRouter(prefix="/v1", tags=["usage"])


@router.get("/usage")
async def usage(
    tenant: Tenant, parts: Parts, files: Files, batches: Batches, settings: Config
) -> FastJSON:
    """Per served model: items and input bytes queued, webhook deliveries not yet made; the
    tenant's files and running batches; each beside its cap."""
    cap_items, cap_bytes = parts.admission.tenant_caps()
    models = {}
    for name in sorted(settings.served_models):
        items, size, webhooks = await parts.queue.tenant_held(name, tenant)
        models[name] = {
            "queued_items": items,
            "queued_bytes": size,
            "webhooks_pending": webhooks,
            "max_queued_items": cap_items or None,
            "max_queued_bytes": cap_bytes or None,
            "max_webhooks_pending": settings.tenant_max_webhooks,
        }
    count, held = await files.usage(tenant)
    running = await batches.running(tenant)
    return FastJSON(
        {
            "tenant": tenant,
            "models": models,
            "files": {
                "count": count,
                "bytes": held,
                "max_count": settings.tenant_max_files,
                "max_bytes": settings.tenant_max_file_bytes,
            },
            "batches": {"running": running, "max_running": settings.tenant_max_batches},
        }
    )
