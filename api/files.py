"""/v1/files: OpenAI's Files API, the subset batches need (upload, read, list, delete).

A file is two keys, both with the TTL `INFERQ_BATCH_FILE_TTL_S`: its metadata hash
(`keys.file`) and its bytes (`keys.file_content`), plus a member of its tenant's index
(`keys.files`, scored by creation time). The bytes are written and read in chunks of
`CHUNK_BYTES` (SET, then SETRANGE at an offset: each call is idempotent, so redis-py's one
retry after a timeout cannot duplicate a chunk as APPEND would) and the metadata is written
last, so a file is visible only once whole. Batch output and error files are stored the
same way, under ids derived from the batch id (`BatchStore.output_ids`).

Uploads are `multipart/form-data` with a `file` part and `purpose=batch` (the only purpose
served). `UploadLimit` gives POST /v1/files its own body limit, `INFERQ_MAX_BATCH_FILE_BYTES`,
instead of `INFERQ_MAX_BODY_BYTES`. Files belong to the caller's tenant; another tenant gets
404 and never sees them listed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from redis.asyncio import Redis
from starlette.types import ASGIApp, Receive, Scope, Send

from inferq.api.auth import Tenant
from inferq.api.deps import Config
from inferq.api.limits import BodyLimit, BodyTooLarge
from inferq.api.responses import FastJSON, error_body
from inferq.shared import keys
from inferq.shared.errors import InputInvalid, InputTooLarge, JobConflict, JobNotFound
from inferq.shared.redis_conn import unavailable

router = APIRouter(prefix="/v1", tags=["files"])

CHUNK_BYTES = 1 << 20  # per Redis call: bounds each reply (reliability guide #17)
FRAMING_BYTES = 64 * 1024  # multipart boundaries, part headers and the purpose field
PURPOSES = ("batch",)  # what clients may upload; "batch_output" files are ours
# A batch's final statuses (`batch_store.FINAL`): `delete` reads batch records too.
BATCH_FINAL = ("completed", "failed", "expired", "cancelled")


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    size: int
    created_at: int
    expires_at: int

    def view(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.id, "object": "file", "bytes": self.size, "created_at": self.created_at,
            "expires_at": self.expires_at, "filename": self.filename, "purpose": self.purpose,
            "status": "processed", "status_details": None,
        }  # fmt: skip

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> FileRecord:
        f = {_s(k): _s(v) for k, v in raw.items()}
        return cls(
            id=f["id"], tenant=f.get("tenant", ""), filename=f.get("filename", ""),
            purpose=f.get("purpose", "batch"), size=int(f.get("bytes", 0)),
            created_at=int(f.get("created_at", 0)), expires_at=int(f.get("expires_at", 0)),
        )  # fmt: skip


class FileWriter:
    """Buffers up to `CHUNK_BYTES`, writes each chunk at its offset; `close` publishes."""

    def __init__(self, store: FileStore, file_id: str) -> None:
        self.store = store
        self.file_id = file_id
        self.offset = 0
        self.buf = bytearray()

    async def write(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= CHUNK_BYTES:
            await self._flush(CHUNK_BYTES)

    async def _flush(self, n: int) -> None:
        chunk = bytes(self.buf[:n])
        await self.store.put(self.file_id, self.offset, chunk)
        self.offset += len(chunk)
        del self.buf[:n]

    async def close(self, tenant: str, filename: str, purpose: str) -> FileRecord:
        if self.buf or self.offset == 0:
            await self._flush(len(self.buf))
        now = time.time()
        rec = FileRecord(
            id=self.file_id, tenant=tenant, filename=filename, purpose=purpose,
            size=self.offset, created_at=int(now), expires_at=int(now) + self.store.ttl_s,
        )  # fmt: skip
        await self.store.publish(rec, now)
        return rec


async def index_rank(redis: Redis, index: str, member: str, *, desc: bool) -> int | None:
    """`member`'s position in a tenant's index (zset), newest first if `desc`."""
    rank = await (redis.zrevrank if desc else redis.zrank)(index, member)
    return None if rank is None else int(cast(int, rank))


async def index_ids(redis: Redis, index: str, start: int, stop: int, *, desc: bool) -> list[str]:
    """Members of a tenant's index by position, inclusive, newest first if `desc`."""
    ids = await (redis.zrevrange if desc else redis.zrange)(index, start, stop)
    return [_s(i) for i in cast(list[bytes], ids)]


def new_file_id() -> str:
    return f"file-{secrets.token_hex(16)}"  # 128 random bits: not enumerable


class FileStore:
    """Files in Redis, by tenant. Every method turns Redis failures into QueueUnavailable."""

    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s

    async def create(
        self, tenant: str, filename: str, purpose: str, content: bytes, *, file_id: str = ""
    ) -> FileRecord:
        writer = self.writer(file_id or new_file_id())
        await writer.write(content)
        return await writer.close(tenant, filename, purpose)

    def writer(self, file_id: str) -> FileWriter:
        """A file written a chunk at a time; writing the same id again replaces it."""
        return FileWriter(self, file_id)

    @unavailable
    async def put(self, file_id: str, offset: int, data: bytes) -> None:
        if offset == 0:  # SET: whatever an earlier, interrupted write left is replaced
            await self.redis.set(keys.file_content(file_id), data, ex=self.ttl_s)
        else:
            await self.redis.setrange(keys.file_content(file_id), offset, data)

    @unavailable
    async def publish(self, rec: FileRecord, score: float) -> None:
        index = keys.files(rec.tenant)
        fields = {
            "id": rec.id, "tenant": rec.tenant, "filename": rec.filename, "purpose": rec.purpose,
            "bytes": rec.size, "created_at": rec.created_at, "expires_at": rec.expires_at,
        }  # fmt: skip
        # The record and the index are in different cluster slots: two steps, the record
        # first. Dying in between leaves a whole file that is not listed (gone after its TTL;
        # a batch's finalize, re-run, publishes it again); never an index entry that a
        # concurrent `page` could drop as expired while its record is being written.
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.file(rec.id), mapping=fields)  # type: ignore[arg-type]
            p.expire(keys.file(rec.id), self.ttl_s)
            await p.execute()
        async with self.redis.pipeline(transaction=True) as p:
            p.zadd(index, {rec.id: score})
            # Index members outlive nothing: past the TTL their files are gone.
            p.zremrangebyscore(index, "-inf", f"({score - self.ttl_s}")
            p.expire(index, self.ttl_s)
            await p.execute()

    @unavailable
    async def get(self, file_id: str, tenant: str) -> FileRecord:
        raw = await self.redis.hgetall(keys.file(file_id))
        if not raw:
            raise JobNotFound(f"no file {file_id!r}")
        rec = FileRecord.from_hash(raw)
        if rec.tenant != tenant:
            raise JobNotFound(f"no file {file_id!r}")  # another tenant's: as if absent
        return rec

    @unavailable
    async def chunk(self, file_id: str, offset: int) -> bytes:
        data = await self.redis.getrange(
            keys.file_content(file_id), offset, offset + CHUNK_BYTES - 1
        )
        return cast(bytes, data)

    async def read(self, rec: FileRecord) -> bytes | None:
        """The whole content; None if it is gone (expired or deleted meanwhile)."""
        parts: list[bytes] = []
        for offset in range(0, rec.size, CHUNK_BYTES):
            part = await self.chunk(rec.id, offset)
            if not part:
                return None
            parts.append(part)
        data = b"".join(parts)
        return data if len(data) == rec.size else None

    @unavailable
    async def page(
        self, tenant: str, *, limit: int, after: str | None, order: str, purpose: str | None
    ) -> tuple[list[FileRecord], bool]:
        """Up to `limit` of the tenant's files after the id `after`, and whether more follow."""
        index = keys.files(tenant)
        desc = order == "desc"
        start = 0
        if after:
            rank = await index_rank(self.redis, index, after, desc=desc)
            if rank is None:
                return [], False  # an unknown cursor: nothing after it
            start = rank + 1
        out: list[FileRecord] = []
        while len(out) <= limit:
            span = max(limit + 1 - len(out), 16)
            ids = await index_ids(self.redis, index, start, start + span - 1, desc=desc)
            if not ids:
                break
            start += len(ids)
            async with self.redis.pipeline(transaction=False) as p:
                for i in ids:
                    p.hgetall(keys.file(i))
                raws = await p.execute()
            gone = [i for i, raw in zip(ids, raws, strict=True) if not raw]
            if gone:
                await self.redis.zrem(index, *gone)  # expired: drop from the index too
            for raw in raws:
                if raw and (purpose is None or _s(raw.get(b"purpose", b"")) == purpose):
                    out.append(FileRecord.from_hash(raw))
        return out[:limit], len(out) > limit

    @unavailable
    async def delete(self, file_id: str, tenant: str) -> None:
        await self.get(file_id, tenant)
        # A batch still running reads its input file again if its runner is replaced. A
        # batch whose record is final may linger in BATCHES_ACTIVE until a runner drops it
        # (`BatchStore.deactivate`): it reads nothing more.
        active = [_s(b) for b in await self.redis.smembers(keys.BATCHES_ACTIVE)]
        if active:
            async with self.redis.pipeline(transaction=False) as p:
                for b in active:
                    p.hmget(keys.batch(b), ["input_file_id", "status"])
                rows = await p.execute()
            for b, (input_id, status) in zip(active, rows, strict=True):
                running = status is not None and _s(status) not in BATCH_FINAL
                if running and input_id is not None and _s(input_id) == file_id:
                    raise JobConflict(
                        f"file {file_id!r} is the input of batch {b!r}, still running"
                    )
        # The file's two keys share a slot (one DEL); the tenant's index is in another, so
        # it goes second: dying in between leaves an index entry without its file, which
        # `page` drops.
        await self.redis.delete(keys.file(file_id), keys.file_content(file_id))
        await self.redis.zrem(keys.files(tenant), file_id)


async def _store(request: Request) -> FileStore:
    return request.app.state.files  # type: ignore[no-any-return]


Files = Annotated[FileStore, Depends(_store)]


class _UploadBodyLimit(BodyLimit):
    @staticmethod
    def reject(max_body_bytes: int) -> FastJSON:
        limit = max_body_bytes - FRAMING_BYTES
        return FastJSON(
            error_body(
                "body_too_large", f"upload exceeds INFERQ_MAX_BATCH_FILE_BYTES={limit} bytes"
            ),
            status_code=413,
        )


class UploadLimit:
    """The app's body limit, by route: POST /v1/files may carry a file of up to
    `max_file_bytes` (plus multipart framing), everything else `max_body_bytes`. Both
    refuse before the body is buffered (`inferq.api.limits.BodyLimit`)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_file_bytes: int) -> None:
        self.default = BodyLimit(app, max_body_bytes)
        self.upload = _UploadBodyLimit(app, max_file_bytes + FRAMING_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upload = (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path", "").rstrip("/") == "/v1/files"
        )
        await (self.upload if upload else self.default)(scope, receive, send)


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
async def upload_file(request: Request, files: Files, settings: Config, tenant: Tenant) -> FastJSON:
    """Upload a JSONL file of batch requests (`purpose=batch`)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InputInvalid("POST /v1/files takes multipart/form-data: a 'file' and 'purpose=batch'")
    limit = settings.max_batch_file_bytes
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
    rec = await files.create(tenant, filename, purpose, content)
    return FastJSON(rec.view())


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
    return FastJSON({
        "object": "list", "data": data, "has_more": more,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


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
