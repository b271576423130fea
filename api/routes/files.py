"""/v1/files: OpenAI's Files API, the subset batches need (upload, read, list, delete).

Uploads are `multipart/form-data` with a `file` part and `purpose=batch` (the only purpose
served); the app's `UploadLimit` (`inferq.api.middleware`) gives POST /v1/files its own
body limit, `INFERQ_MAX_BATCH_FILE_BYTES`. Files belong to the caller's tenant; another
tenant gets 404 and never sees them listed. Storage: `inferq.api.batches.files`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from inferq.api.batches.files import CHUNK_BYTES, PURPOSES, new_file_id
from inferq.api.core.admission import FILE_WEIGHT
from inferq.api.middleware import BodyTooLarge
from inferq.api.responses import FastJSON, list_page
from inferq.api.routes.deps import Config, Files, Memory, Tenant
from inferq.shared.errors import InputInvalid, InputTooLarge, Overloaded
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v1", tags=["files"])

# Files leave only by deletion or their TTL (days): a client should not retry in a hurry.
QUOTA_RETRY_S = 3600


def check_file_quota(usage: tuple[int, int], size: int, settings: Settings, tenant: str) -> None:
    """429 when one more file of `size` bytes would pass the tenant's file quotas."""
    count, held = usage
    if count >= settings.tenant_max_files:
        raise Overloaded(
            f"tenant {tenant!r} keeps {count} files (INFERQ_TENANT_MAX_FILES="
            f"{settings.tenant_max_files}): delete some first",
            QUOTA_RETRY_S,
            "tenant_files",
        )
    if held + size > settings.tenant_max_file_bytes:
        raise Overloaded(
            f"tenant {tenant!r} keeps {held} bytes of files; {size} more would pass "
            f"INFERQ_TENANT_MAX_FILE_BYTES={settings.tenant_max_file_bytes}",
            QUOTA_RETRY_S,
            "tenant_file_bytes",
        )


_UPLOAD_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": list(PURPOSES)},
                    },
                }
            }
        },
    }
}


@router.post("/files", openapi_extra=_UPLOAD_SCHEMA)
async def upload_file(
    request: Request, files: Files, memory: Memory, settings: Config, tenant: Tenant
) -> FastJSON:
    """Upload a JSONL file of batch requests (`purpose=batch`)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InputInvalid("POST /v1/files takes multipart/form-data: a 'file' and 'purpose=batch'")
    # A tenant with no room left is refused before its upload is read (up to
    # INFERQ_MAX_BATCH_FILE_BYTES); once the size is known, checked again (usage read
    # afresh, plus this process's uploads of the tenant that read did not see).
    check_file_quota(await files.usage(tenant), 0, settings, tenant)
    limit = settings.max_batch_file_bytes
    # Redis memory for the upload is reserved before it is read, by its Content-Length (a
    # chunked one: by its size once read), and held until its bytes are in Redis: uploads
    # under way at once cannot pass one check together and fill Redis part way.
    declared = min(_content_length(request), limit)
    async with memory.admit(declared, FILE_WEIGHT) as held:
        purpose, filename, content = await _read_upload(request, limit)
        if len(content) > declared:
            await held.grow(len(content) - declared)
        file_id = new_file_id()
        usage = await files.usage_with_uploads(tenant)
        check_file_quota(usage, len(content), settings, tenant)
        with files.uploading(tenant, file_id, len(content)):  # no await since the check
            rec = await files.create(tenant, filename, purpose, content, file_id=file_id)
        held.landed()
    return FastJSON(rec.view())


def _content_length(request: Request) -> int:
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else 0


async def _read_upload(request: Request, limit: int) -> tuple[str, str, bytes]:
    """(purpose, filename, content) of the form, checked."""
    try:
        async with request.form(max_files=1, max_fields=4) as form:
            purpose = form.get("purpose")
            upload = form.get("file")
            if not isinstance(purpose, str):
                raise InputInvalid("missing form field 'purpose' (use 'batch')")
            if purpose not in PURPOSES:
                raise InputInvalid(
                    f"purpose {purpose[:64]!r} is not supported here; use {', '.join(PURPOSES)}"
                )
            if upload is None or isinstance(upload, str):
                raise InputInvalid("missing file part 'file'")
            content = await upload.read(limit + 1)  # one byte past the limit is enough to refuse
            filename = (upload.filename or "upload.jsonl")[:255]
    except BodyTooLarge as e:
        raise InputTooLarge(f"upload exceeds INFERQ_MAX_BATCH_FILE_BYTES={limit} bytes") from e
    if len(content) > limit:
        raise InputTooLarge(f"file exceeds INFERQ_MAX_BATCH_FILE_BYTES={limit} bytes")
    return purpose, filename, content


@router.get("/files")
async def list_files(
    files: Files,
    tenant: Tenant,
    limit: int = Query(10_000, ge=1, le=10_000),
    after: str | None = Query(None, max_length=128),
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = Query(None, max_length=64),
) -> FastJSON:
    """The caller's files, newest first (`order=asc` for oldest first)."""
    recs, more = await files.page(tenant, limit=limit, after=after, order=order, purpose=purpose)
    data = [r.view() for r in recs]
    return FastJSON(list_page(data, more))


@router.get("/files/{file_id}")
async def get_file(file_id: str, files: Files, tenant: Tenant) -> FastJSON:
    return FastJSON((await files.get(file_id, tenant)).view())


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, files: Files, tenant: Tenant) -> Response:
    """The file's bytes, streamed a chunk at a time (one bounded Redis read per chunk)."""
    rec = await files.get(file_id, tenant)
    first = await files.chunk(file_id, 0)  # read before answering: Redis down is still a 503
    if len(first) < CHUNK_BYTES or rec.size <= CHUNK_BYTES:
        return Response(first, media_type="application/octet-stream")

    async def rest() -> AsyncIterator[bytes]:
        yield first
        for offset in range(CHUNK_BYTES, rec.size, CHUNK_BYTES):
            part = await files.chunk(file_id, offset)
            if not part:
                return  # deleted or expired meanwhile: the length tells the client
            yield part

    headers = {"content-length": str(rec.size)}
    return StreamingResponse(rest(), media_type="application/octet-stream", headers=headers)


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, files: Files, tenant: Tenant) -> FastJSON:
    """Delete a file; 409 while a running batch reads it."""
    await files.delete(file_id, tenant)
    return FastJSON({"id": file_id, "object": "file", "deleted": True})
