"""/v1/batches: OpenAI's Batch API over the queue; the routes (the records: `batch_store`).

POST /v1/batches checks the input file whole (`batch_lines.check_file`), then records the
batch as `validating` and adds it to `keys.BATCHES_ACTIVE`; the batch runner of some API
process (`inferq.api.batch_runner`) takes it from there:

    validating → in_progress → finalizing → completed
                      │  └──────────────────→ expired      (past completion_window)
                      └→ cancelling ────────→ cancelled    (POST /v1/batches/{id}/cancel)
    (input file gone when a runner starts it) → failed

Records, their status changes and leases live in `inferq.api.batch_store` (`BatchStore`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from inferq.api.auth import Tenant
from inferq.api.batch_lines import ENDPOINTS, check_file
from inferq.api.batch_store import WINDOWS, BatchStore
from inferq.api.deps import Config
from inferq.api.files import Files
from inferq.api.responses import FastJSON
from inferq.shared.errors import InputInvalid, JobNotFound

router = APIRouter(prefix="/v1", tags=["batches"])


async def _store(request: Request) -> BatchStore:
    return request.app.state.batches  # type: ignore[no-any-return]


Batches = Annotated[BatchStore, Depends(_store)]


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. output_expires_after: files keep our TTL

    input_file_id: str = Field(max_length=128, description="An uploaded file, purpose 'batch'.")
    endpoint: str = Field(max_length=128, description="'/v1/embeddings' or '/v1/infer'.")
    completion_window: str = Field(max_length=16, description="'24h'.")
    metadata: dict[str, str] | None = Field(None, description="Up to 16 string pairs.")


def _check(body: BatchCreate) -> None:
    if body.endpoint not in ENDPOINTS:
        raise InputInvalid(
            f"endpoint {body.endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}"
        )
    if body.completion_window not in WINDOWS:
        raise InputInvalid(
            f"completion_window {body.completion_window!r} is not supported; use "
            f"{', '.join(WINDOWS)}"
        )
    meta = body.metadata or {}
    if len(meta) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in meta.items()):
        raise InputInvalid(
            "metadata: at most 16 pairs, keys up to 64 and values up to 512 characters"
        )


@router.post("/batches")
async def create_batch(
    body: BatchCreate, request: Request, batches: Batches, files: Files, settings: Config,
    tenant: Tenant,
) -> FastJSON:  # fmt: skip
    """Run every request of an uploaded file through `endpoint`, in the low lane."""
    _check(body)
    src = await files.get(body.input_file_id, tenant)
    if src.purpose != "batch":
        raise InputInvalid(
            f"file {src.id!r} has purpose {src.purpose!r}; a batch's input needs purpose 'batch'"
        )
    content = await files.read(src)
    if content is None:
        raise JobNotFound(f"no file {src.id!r}")
    # Parsing up to INFERQ_MAX_BATCH_FILE_BYTES of JSON lines: off the event loop.
    total = await asyncio.to_thread(check_file, content, settings.max_batch_lines)
    rec = await batches.create(
        tenant, input_file_id=src.id, endpoint=body.endpoint, window=body.completion_window,
        total=total, metadata=body.metadata,
    )  # fmt: skip
    request.app.state.batch_runner.poke()  # start it here and now, not at the next scan
    return FastJSON(rec.view())


@router.get("/batches")
async def list_batches(
    batches: Batches,
    tenant: Tenant,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, max_length=128),
) -> FastJSON:
    """The caller's batches, newest first."""
    recs, more = await batches.page(tenant, limit=limit, after=after)
    data = [r.view() for r in recs]
    return FastJSON({
        "object": "list", "data": data, "has_more": more,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, batches: Batches, tenant: Tenant) -> FastJSON:
    return FastJSON((await batches.get(batch_id, tenant)).view())


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(
    batch_id: str, request: Request, batches: Batches, tenant: Tenant
) -> FastJSON:
    """Stop submitting its lines and cancel those still queued; it ends `cancelled`, with
    the outputs of the lines that finished. 409 once it has ended (or is finalizing)."""
    rec = await batches.cancel(batch_id, tenant)
    request.app.state.batch_runner.poke(batch_id)
    return FastJSON(rec.view())
