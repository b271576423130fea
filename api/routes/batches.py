"""/v1/batches: OpenAI's Batch API over the queue; the routes (the records: `batch_store`).

POST /v1/batches authenticates before it reads a byte of its body, reads at most
`decode.MAX_CONTROL_JSON_BYTES` of it (413 past that, unparsed), checks the input file whole
(`batches.lines.check_file`), then records the batch as `validating` and adds it to `keys.BATCHES_ACTIVE`; the batch leases of some API
process (`inferq.api.batches.leases`) take it from there:

    validating → in_progress → finalizing → completed
                      │  └──────────────────→ expired      (past completion_window)
                      └→ cancelling ────────→ cancelled    (POST /v1/batches/{id}/cancel)
    (input file gone when a runner starts it) → failed

Records, their status changes and leases live in `inferq.api.batches.store` (`BatchStore`).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferq.api.batches.files import FileStore
from inferq.api.batches.lines import ENDPOINTS, check_file
from inferq.api.batches.store import WINDOWS, BatchRecord, BatchStore, new_batch_id
from inferq.api.core.decode import MAX_CONTROL_JSON_BYTES, json_budget
from inferq.api.responses import FastJSON, list_page
from inferq.api.routes.deps import Batches, Config, Files, Leases, Memory, Tenant
from inferq.shared.errors import InputInvalid, InputTooLarge, JobNotFound, Overloaded
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v1", tags=["batches"])

QUOTA_RETRY_S = 60  # a running batch may take its whole window; this is a polite minimum


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


async def _limited_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it is declared or found to be over `max_bytes`:
    a large one is never buffered whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise InputTooLarge(f"the JSON body is over {max_bytes} bytes ({declared} declared)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise InputTooLarge(f"the JSON body is over {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_create(request: Request, settings: Settings) -> BatchCreate:
    """The body, read only now (the tenant is known: the route's dependencies ran first)
    and within the JSON budget; invalid → 422, as FastAPI's own validation answers."""
    doc = json_budget(
        await _limited_body(request, MAX_CONTROL_JSON_BYTES), settings, MAX_CONTROL_JSON_BYTES
    )
    try:
        return BatchCreate.model_validate(doc)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from e


# The body is read by the route (after authentication), not by FastAPI (before it): the
# schema is documented here instead.
_CREATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": BatchCreate.model_json_schema(ref_template="#/components/schemas/{model}")
            }
        },
    }
}


@router.post("/batches", openapi_extra=_CREATE_BODY)
async def create_batch(
    request: Request,
    batches: Batches,
    files: Files,
    leases: Leases,
    memory: Memory,
    settings: Config,
    tenant: Tenant,
) -> FastJSON:
    """Run every request of an uploaded file through `endpoint`, in the low lane."""
    await memory.check()  # Redis nearly full: 503 before anything is read
    body = await _read_create(request, settings)
    _check(body)
    batch_id = new_batch_id()
    if (running := await batches.running_with_creating(tenant)) >= settings.tenant_max_batches:
        raise Overloaded(
            f"tenant {tenant!r} has {running} batches running (INFERQ_TENANT_MAX_BATCHES="
            f"{settings.tenant_max_batches})",
            QUOTA_RETRY_S,
            "tenant_batches",
        )
    with batches.creating(tenant, batch_id):  # no await since the check
        rec = await _create(body, batch_id, batches, files, settings, tenant)
    leases.poke()  # start it here and now, not at the next scan
    return FastJSON(rec.view())


async def _create(
    body: BatchCreate,
    batch_id: str,
    batches: BatchStore,
    files: FileStore,
    settings: Settings,
    tenant: str,
) -> BatchRecord:
    src = await files.get(body.input_file_id, tenant)
    if src.purpose != "batch":
        raise InputInvalid(
            f"file {src.id!r} has purpose {src.purpose!r}; a batch's input needs purpose 'batch'"
        )
    content = await files.read(src)
    if content is None:
        raise JobNotFound(f"no file {src.id!r}")
    # Parsing up to INFERQ_MAX_BATCH_FILE_BYTES of JSON lines: off the event loop.
    total = await asyncio.to_thread(
        check_file, content, settings.max_batch_lines, settings.max_json_values
    )
    return await batches.create(
        tenant,
        input_file_id=src.id,
        endpoint=body.endpoint,
        window=body.completion_window,
        total=total,
        metadata=body.metadata,
        batch_id=batch_id,
    )


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
    return FastJSON(list_page(data, more))


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, batches: Batches, tenant: Tenant) -> FastJSON:
    return FastJSON((await batches.get(batch_id, tenant)).view())


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, batches: Batches, leases: Leases, tenant: Tenant) -> FastJSON:
    """Stop submitting its lines and cancel those still queued; it ends `cancelled`, with
    the outputs of the lines that finished. 409 once it has ended (or is finalizing)."""
    rec = await batches.cancel(batch_id, tenant)
    leases.poke(batch_id)
    return FastJSON(rec.view())
