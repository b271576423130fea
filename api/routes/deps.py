"""Typed dependencies, so handlers never reach into `app.state` and signatures stay short.

All `async def`: FastAPI runs a sync dependency in a thread pool, one hop per request.
`create_app` builds the process's parts once (`api.parts.ApiParts`, on `app.state.parts`);
these hand them to the routes, typed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from inferq.api.batches.files import FileStore
from inferq.api.batches.leases import BatchLeases
from inferq.api.batches.store import BatchStore
from inferq.api.core.admission import ModelCatalog, RedisMemory
from inferq.api.core.auth import check_admin, tenant_of
from inferq.api.core.listing import JobListing
from inferq.api.core.service import JobService
from inferq.api.parts import ApiParts, parts_of
from inferq.shared.errors import RequestError
from inferq.shared.metrics import ApiMetrics
from inferq.shared.producer import JobProducer
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings


def _parts(request: Request) -> ApiParts:
    return parts_of(request.app.state)


async def _jobs(request: Request) -> JobService:
    return _parts(request).jobs


async def _listing(request: Request) -> JobListing:
    return _parts(request).listing


async def _settings(request: Request) -> Settings:
    return _parts(request).settings


async def _queue(request: Request) -> JobProducer:
    return _parts(request).queue


async def _registry(request: Request) -> WorkerRegistry:
    return _parts(request).registry


async def _catalog(request: Request) -> ModelCatalog:
    return _parts(request).catalog


async def _memory(request: Request) -> RedisMemory:
    return _parts(request).memory


async def _metrics(request: Request) -> ApiMetrics:
    return _parts(request).metrics


async def _files(request: Request) -> FileStore:
    return _parts(request).files


async def _batches(request: Request) -> BatchStore:
    return _parts(request).batches


async def _leases(request: Request) -> BatchLeases:
    return _parts(request).leases


async def _all(request: Request) -> ApiParts:
    return _parts(request)


async def authenticate(request: Request) -> str:
    """The caller's tenant ('' when the API is open); 401 otherwise."""
    return tenant_of(_parts(request).api_keys, request.headers.get("authorization", ""))


async def require_admin(request: Request) -> None:
    """An operator's route: 401 without a valid key, 403 for a tenant's (`check_admin`)."""
    parts = _parts(request)
    check_admin(parts.admin_keys, parts.api_keys, request.headers.get("authorization", ""))


async def viewer(request: Request) -> bool:
    """A caller with any valid key (or anyone, on an open API): True if it is an admin's,
    who may see operator detail (workers' hosts and PIDs); 401 for no valid key at all."""
    try:
        await require_admin(request)
        return True
    except RequestError:
        await authenticate(request)  # not an admin: a tenant then, or 401
        return False


Parts = Annotated[ApiParts, Depends(_all)]
Jobs = Annotated[JobService, Depends(_jobs)]
Catalog = Annotated[ModelCatalog, Depends(_catalog)]
Memory = Annotated[RedisMemory, Depends(_memory)]
Listing = Annotated[JobListing, Depends(_listing)]
Config = Annotated[Settings, Depends(_settings)]
Queue = Annotated[JobProducer, Depends(_queue)]
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
