"""Typed dependencies, so handlers never reach into `app.state` and signatures stay short.

All `async def`: FastAPI runs a sync dependency in a thread pool, one hop per request.
`create_app` puts each component on `app.state`; these hand them to the routes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from inferq.api.batches.files import FileStore
from inferq.api.batches.leases import BatchLeases
from inferq.api.batches.store import BatchStore
from inferq.api.core.auth import check_admin, tenant_of
from inferq.api.core.service import JobService
from inferq.shared.errors import RequestError
from inferq.shared.metrics import ApiMetrics
from inferq.shared.queue import JobQueue
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings


async def _jobs(request: Request) -> JobService:
    return request.app.state.jobs  # type: ignore[no-any-return]


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _queue(request: Request) -> JobQueue:
    return request.app.state.jobs.queue  # type: ignore[no-any-return]


async def _registry(request: Request) -> WorkerRegistry:
    return request.app.state.jobs.registry  # type: ignore[no-any-return]


async def _metrics(request: Request) -> ApiMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


async def _files(request: Request) -> FileStore:
    return request.app.state.files  # type: ignore[no-any-return]


async def _batches(request: Request) -> BatchStore:
    return request.app.state.batches  # type: ignore[no-any-return]


async def _leases(request: Request) -> BatchLeases:
    return request.app.state.batch_leases  # type: ignore[no-any-return]


async def authenticate(request: Request) -> str:
    """The caller's tenant ('' when the API is open); 401 otherwise."""
    return tenant_of(request.app.state.api_keys, request.headers.get("authorization", ""))


async def require_admin(request: Request) -> None:
    """An operator's route: 401 without a valid key, 403 for a tenant's (`check_admin`)."""
    state = request.app.state
    check_admin(state.admin_keys, state.api_keys, request.headers.get("authorization", ""))


async def viewer(request: Request) -> bool:
    """A caller with any valid key (or anyone, on an open API): True if it is an admin's,
    who may see operator detail (workers' hosts and PIDs); 401 for no valid key at all."""
    try:
        await require_admin(request)
        return True
    except RequestError:
        await authenticate(request)  # not an admin: a tenant then, or 401
        return False


Jobs = Annotated[JobService, Depends(_jobs)]
Config = Annotated[Settings, Depends(_settings)]
Queue = Annotated[JobQueue, Depends(_queue)]
Registry = Annotated[WorkerRegistry, Depends(_registry)]
Metrics = Annotated[ApiMetrics, Depends(_metrics)]
Files = Annotated[FileStore, Depends(_files)]
Batches = Annotated[BatchStore, Depends(_batches)]
Leases = Annotated[BatchLeases, Depends(_leases)]
Tenant = Annotated[str, Depends(authenticate)]
Viewer = Annotated[bool, Depends(viewer)]
IdempotencyKey = Annotated[
    str | None,
    Header(max_length=256, description="Same key, same tenant, within 24 h: the same job back."),
]


async def disconnected(request: Request) -> None:
    """Returns when the client goes away (its body is read, so only that is left to hear)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
