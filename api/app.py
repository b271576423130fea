"""The API app factory: one Redis pool, one completion subscriber, one metrics registry per
process; one router per resource; one error table (`inferq.api.errors`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from inferq.api import batches, embeddings, errors, files, health, jobs, observability, status
from inferq.api.auth import authenticate, load_api_keys
from inferq.api.batch_runner import BatchRunner
from inferq.api.notifier import Notifier
from inferq.api.schemas import InferRequest, SubmitRequest
from inferq.api.service import JobService
from inferq.api.webhook_dispatch import Dispatcher
from inferq.api.webhooks import check_settings as check_webhook_settings
from inferq.shared.metrics import api_metrics
from inferq.shared.queue import JobQueue
from inferq.shared.redis_conn import api_client, pubsub_client
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings

log = logging.getLogger("inferq.api")

# Bodies the routes parse themselves (JSON or multipart), so FastAPI does not list them.
_BODIES = (SubmitRequest, InferRequest, embeddings.EmbeddingsRequest)


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


def create_app(settings: Settings) -> FastAPI:
    metrics = api_metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.redis_url.get_secret_value()
        # Set: both clients find (and follow) the master through the sentinels.
        sentinel = {
            "sentinels": settings.redis_sentinels,
            "sentinel_master": settings.redis_sentinel_master,
            "cluster": settings.redis_cluster,
        }
        redis = api_client(
            url, timeout_s=settings.redis_timeout_s, pool_size=settings.redis_pool_size, **sentinel
        )
        notifier = Notifier(
            pubsub_client(url, connect_timeout_s=settings.redis_timeout_s, **sentinel)
        )
        await notifier.start()
        queue = JobQueue(redis, result_ttl_s=settings.result_ttl_s, shards=settings.stream_shards)
        app.state.jobs = JobService(settings, queue, WorkerRegistry(redis), notifier, metrics)
        # Webhook deliveries (when a signing key is set); its blocking reads get their own
        # connection without a socket timeout, like the notifier's.
        webhooks = Dispatcher.launch(
            settings, queue, metrics,
            lambda: pubsub_client(url, connect_timeout_s=settings.redis_timeout_s, **sentinel),
        )  # fmt: skip
        # Batch API: the file and batch stores, and this process's share of running batches.
        batch_runner = await BatchRunner.launch(app.state, redis, metrics)
        log.info("api ready: models=%s", ",".join(sorted(settings.served_models)))
        if not app.state.api_keys:
            log.warning("INFERQ_API_KEYS is not set: the API is open to anyone who can reach it")
        try:
            yield
        finally:
            await batch_runner.stop()  # hands its leases back: another process resumes at once
            notifier.wake_all()  # open long-polls answer with the current state
            await notifier.close()
            if webhooks is not None:
                await webhooks.stop()
            await redis.aclose()

    api_keys = load_api_keys(settings)
    check_webhook_settings(settings)  # a malformed secret list or allow-list stops the start
    # The schema and docs are endpoints too: with keys set they are not served openly.
    docs = {} if not api_keys else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(
        **docs,  # type: ignore[arg-type]
        title="inferq",
        version="0.1.0",
        summary="Memory-bounded microbatching inference behind a Redis queue.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.api_keys = api_keys
    app.state.metrics = metrics
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    errors.install(app)
    # Behind INFERQ_API_KEYS: everything but liveness/readiness and the status page's static
    # HTML (it holds no data; its script sends the key it is given to /v1/health).
    authed = [Depends(authenticate)]
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(health.authed, dependencies=authed)
    app.include_router(embeddings.router)
    app.include_router(files.router, dependencies=authed)
    app.include_router(batches.router, dependencies=authed)
    app.include_router(observability.router, dependencies=authed)
    app.include_router(status.router)
    # INFERQ_MAX_BODY_BYTES, but INFERQ_MAX_BATCH_FILE_BYTES for file uploads.
    app.add_middleware(
        files.UploadLimit,
        max_body_bytes=settings.max_body_bytes,
        max_file_bytes=settings.max_batch_file_bytes,
    )
    return app
