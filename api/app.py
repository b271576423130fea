"""The API app factory: one Redis pool, one completion subscriber, one metrics registry per
process; one router per resource (`routes/`); one error table (`core.errors`, served by
`handlers`); the background subsystems (`webhooks/`, `batches/`) built here and handed to
the routes that need them.

Why the webhook dispatcher and the batch leases run inside the API processes rather than a
role of their own: both are I/O loops (HTTP calls and Redis waits), which is what an API
process's event loop does all day; they scale out with the API replicas with nothing more
to deploy; and nobody who runs `inferq api` alone can end up with webhooks that are never
delivered or batches that never start. Their share of one process is bounded (slots per
target, an in-flight window per batch), so a slow target or a big batch costs its own work,
not the requests beside it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from redis.asyncio import Redis

from inferq.api import handlers
from inferq.api.batches.files import FileStore
from inferq.api.batches.leases import BatchLeases
from inferq.api.batches.store import BatchStore
from inferq.api.core.admission import Admission, ModelCatalog, RedisMemory
from inferq.api.core.auth import load_admin_keys, load_api_keys
from inferq.api.core.cache import ResultCache
from inferq.api.core.listing import JobListing
from inferq.api.core.schemas import InferRequest, SubmitRequest
from inferq.api.core.service import Checks, JobService
from inferq.api.middleware import UploadLimit
from inferq.api.parts import ApiParts
from inferq.api.protocols.embeddings import EmbeddingsRequest
from inferq.api.protocols.oip.body import BUDGET_BODIES, BodyBudget
from inferq.api.routes import (
    batches,
    embeddings,
    files,
    health,
    jobs,
    observability,
    oip,
    status,
    usage,
)
from inferq.api.routes.deps import authenticate, require_admin
from inferq.api.routes.fast import FastPath, HotTable, InferqAPI
from inferq.api.webhooks.contract import check_settings as check_webhook_settings
from inferq.api.webhooks.contract import submit_target
from inferq.api.webhooks.dispatcher import Dispatcher
from inferq.shared.heap import freeze_startup
from inferq.shared.metrics import ApiMetrics, api_metrics
from inferq.shared.producer import JobProducer, Notifier
from inferq.shared.redis_clients import api_client, pubsub_client, sibling
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings

log = logging.getLogger("inferq.api")

# Bodies the routes parse themselves (JSON or multipart), so FastAPI does not list them.
_BODIES = (SubmitRequest, InferRequest, EmbeddingsRequest)


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for body in _BODIES:
            js = body.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[body.__name__] = js
        app.openapi_schema = schema
    return app.openapi_schema


@dataclass(frozen=True, slots=True)
class Connections:
    """The process's Redis clients: `requests`, the pool every request and store uses, and
    `blocking()`, a new client for one long blocking read (the completion subscriber, the
    delivery reader), with no socket timeout and a connection of its own."""

    requests: Redis
    blocking: Callable[[], Redis]


def connect(settings: Settings) -> Connections:
    url = settings.redis_url.get_secret_value()
    # Set: both kinds of client find (and follow) the master through the sentinels.
    where = {
        "sentinels": settings.redis_sentinels,
        "sentinel_master": settings.redis_sentinel_master,
        "cluster": settings.redis_cluster,
    }
    requests = api_client(
        url,
        timeout_s=settings.redis_timeout_s,
        pool_size=settings.redis_pool_size,
        multiplex=settings.redis_multiplex,
        **where,
    )
    return Connections(
        requests, lambda: pubsub_client(url, connect_timeout_s=settings.redis_timeout_s, **where)
    )


def create_app(settings: Settings, *, redis: Redis | None = None) -> FastAPI:
    """The app. `redis`: a client to use instead of connecting to `INFERQ_REDIS_URL` (tests
    pass fakeredis or their own server's); blocking reads get siblings of it."""
    metrics = api_metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conns = connect(settings) if redis is None else Connections(redis, lambda: sibling(redis))
        notifier = Notifier(conns.blocking())
        await notifier.start()
        app.state.parts = parts = _build(settings, conns, notifier, metrics, api_keys, admin_keys)
        await parts.leases.start()
        webhooks = Dispatcher.launch(settings, parts.queue, metrics, conns.blocking)
        frozen = freeze_startup()  # full collections walk requests' objects only (shared.heap)
        log.info(
            "api ready: models=%s (%d startup objects frozen)",
            ",".join(sorted(settings.served_models)),
            frozen,
        )
        if not api_keys:
            log.warning("INFERQ_API_KEYS is not set: the API is open to anyone who can reach it")
        try:
            yield
        finally:
            await parts.leases.stop()  # hands its leases back: another process resumes at once
            notifier.wake_all()  # open long-polls answer with the current state
            await notifier.close()
            if webhooks is not None:
                await webhooks.stop()
            if redis is None:
                await conns.requests.aclose()

    api_keys = load_api_keys(settings)
    admin_keys = load_admin_keys(settings)
    check_webhook_settings(settings)  # a malformed secret list or allow-list stops the start
    # The schema and docs are endpoints too: with keys set they are not served openly.
    docs = {} if not api_keys else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = InferqAPI(
        **docs,  # type: ignore[arg-type]
        title="inferq",
        version="0.1.0",
        summary="Memory-bounded microbatching inference behind a Redis queue.",
        lifespan=lifespan,
    )
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    handlers.install(app)
    _mount(app, settings)
    return app


def _build(
    settings: Settings,
    conns: Connections,
    notifier: Notifier,
    metrics: ApiMetrics,
    api_keys: dict[bytes, str],
    admin_keys: dict[bytes, str],
) -> ApiParts:
    """Every part of the process, each built once, here."""
    redis = conns.requests
    queue = JobProducer(
        redis,
        result_ttl_s=settings.result_ttl_s,
        brief_ttl_s=settings.sync_result_ttl_s,
        shards=settings.stream_shards,
        keep_inputs=settings.keep_inputs,
        listener=notifier.listener,
    )
    registry = WorkerRegistry(redis)
    tenants = len(set(api_keys.values()))
    checks = Checks(
        catalog=ModelCatalog(settings, registry),
        # With several tenants, each holds at most its share of a model's queue.
        admission=Admission(
            settings.max_queue,
            settings.max_queue_bytes,
            tenant_share=settings.tenant_queue_share if tenants > 1 else 1.0,
            max_webhooks=settings.tenant_max_webhooks,
        ),
        cache=ResultCache(settings, redis) if settings.cache_ttl_s > 0 else None,
        memory=RedisMemory(redis, settings.redis_memory_high_water, metrics),
        webhook_target=submit_target,
    )
    service = JobService(settings, queue, notifier, metrics, checks)
    # The Batch API's stores (its routes read them) and this process's share of the running
    # batches.
    files = FileStore(redis, ttl_s=settings.batch_file_ttl_s)
    batches = BatchStore(redis, ttl_s=settings.batch_file_ttl_s)
    return ApiParts(
        settings=settings,
        api_keys=api_keys,
        admin_keys=admin_keys,
        metrics=metrics,
        queue=queue,
        registry=registry,
        notifier=notifier,
        catalog=checks.catalog,
        admission=checks.admission,
        memory=checks.memory,
        jobs=service,
        listing=JobListing(redis, list(settings.served_models), settings.stream_shards),
        files=files,
        batches=batches,
        leases=BatchLeases(batches, files, service, metrics),
        oip_bodies=BodyBudget(BUDGET_BODIES * settings.max_body_bytes),
    )


def _mount(app: InferqAPI, settings: Settings) -> None:
    """The routers, each behind what guards it, and the body limits."""
    # Behind INFERQ_API_KEYS: everything but liveness/readiness and the status page's static
    # HTML (it holds no data; its script sends the key it is given to /v1/health). The job,
    # embeddings, files and batches routes take the tenant as a parameter (what they touch
    # belongs to it). Health and metrics are the operator's: INFERQ_ADMIN_KEYS.
    authed = [Depends(authenticate)]
    admin = [Depends(require_admin)]
    mounted: list[tuple[APIRouter, list[Any]]] = [
        (jobs.router, []),
        (health.router, []),
        (health.admin, admin),
        (embeddings.router, []),
        (files.router, authed),
        (batches.router, authed),
        (observability.router, []),  # its route checks the key (`deps.Viewer`)
        (observability.admin, admin),
        (status.router, []),
        (usage.router, []),  # its route takes the tenant (`deps.Tenant`)
        # The Open Inference Protocol (/v2): its routes check the tenant themselves, so a 401
        # reads in the protocol's error shape; liveness and readiness are open.
        (oip.router, []),
    ]
    for router, guards in mounted:
        app.include_router(router, dependencies=guards)
    # INFERQ_MAX_BODY_BYTES, but INFERQ_MAX_BATCH_FILE_BYTES for file uploads.
    limits = {
        "max_body_bytes": settings.max_body_bytes,
        "max_file_bytes": settings.max_batch_file_bytes,
    }
    app.add_middleware(UploadLimit, **limits)
    # The hot JSON routes, ahead of the whole stack (`InferqAPI`); they apply the body limit
    # as they read (`FastPath`). Which requests they take is read off the routes just mounted.
    routes = [route for router, _ in mounted for route in router.routes]
    app.hot = FastPath(app.stack, settings.max_body_bytes, HotTable.of(routes))
