"""Files in Redis (OpenAI's Files API, the subset batches need; the routes are
`inferq.api.routes.files`): batch input files and the batches' output and error files.

A file is two keys, both with the TTL `INFERQ_BATCH_FILE_TTL_S`: its metadata hash
(`keys.file`) and its bytes (`keys.file_content`), plus a member of its tenant's index
(`keys.files`, scored by creation time). The bytes are written and read in chunks of
`CHUNK_BYTES` (SET, then SETRANGE at an offset: each call is idempotent, so redis-py's one
retry after a timeout cannot duplicate a chunk as APPEND would) and the metadata is written
last, so a file is visible only once whole. Batch output and error files are stored the
same way, under ids derived from the batch id (`inferq.api.batches.store.output_ids`).

A file being written lives under a key of its writer's own (`keys.file_upload`, TTL
`UPLOAD_TTL_S`, renewed with each chunk) and is RENAMEd to its content key once whole. A
write that fails (Redis full part way, the client gone) DELetes it; a process that dies
mid-write leaves it for `UPLOAD_TTL_S` at most. So no failed upload keeps its bytes for
days with no record to list, count or delete them, and two writers of one id (a batch's
finalize re-run by a second holder) never interleave their chunks.

Files belong to a tenant: `get` answers 404 for another tenant's file, as if absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from inferq.api.batches.pending import Pending
from inferq.shared import keys
from inferq.shared.errors import JobConflict, JobNotFound
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.schema import BATCH_FINAL, BatchField, FileField

log = logging.getLogger("inferq.api.batches")

# Per Redis call: bounds each command and reply, so one large file never holds Redis's one
# thread, nor a whole copy in a client or server buffer, for the time of its transfer.
CHUNK_BYTES = 1 << 20
PURPOSES = ("batch",)  # what clients may upload; "batch_output" files are ours
# A file being written outlives a dead writer by this much at most; renewed with each chunk,
# so only a writer that has stopped for this long loses it.
UPLOAD_TTL_S = 600


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
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> FileRecord:
        f = {as_str(k): as_str(v) for k, v in raw.items()}
        return cls(
            id=f[FileField.ID],
            tenant=f.get(FileField.TENANT, ""),
            filename=f.get(FileField.FILENAME, ""),
            purpose=f.get(FileField.PURPOSE, "batch"),
            size=int(f.get(FileField.BYTES, 0)),
            created_at=int(f.get(FileField.CREATED_AT, 0)),
            expires_at=int(f.get(FileField.EXPIRES_AT, 0)),
        )


class FileWriter:
    """Buffers up to `CHUNK_BYTES`, writes each chunk at its offset under a key of its own;
    `close` renames it into place and publishes, `abort` deletes it. A write or close that
    fails aborts by itself."""

    def __init__(self, store: FileStore, file_id: str) -> None:
        self.store = store
        self.file_id = file_id
        self.key = keys.file_upload(file_id, secrets.token_hex(8))
        self.offset = 0
        self.buf = bytearray()

    async def write(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= CHUNK_BYTES:
            await self._flush(CHUNK_BYTES)

    async def _flush(self, n: int) -> None:
        chunk = bytes(self.buf[:n])
        try:
            await self.store.put(self.key, self.offset, chunk)
        except BaseException:
            await self.abort()
            raise
        self.offset += len(chunk)
        del self.buf[:n]

    async def close(self, tenant: str, filename: str, purpose: str) -> FileRecord:
        if self.buf or self.offset == 0:
            await self._flush(len(self.buf))
        now = time.time()
        rec = FileRecord(
            id=self.file_id,
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            size=self.offset,
            created_at=int(now),
            expires_at=int(now) + self.store.ttl_s,
        )
        try:
            await self.store.place(self.key, self.file_id)
        except BaseException:
            await self.abort()
            raise
        try:
            await self.store.publish(rec, now)
        except BaseException:
            # Whole, but with no record nothing could list, count or delete it for days.
            await self.store.discard(keys.file_content(self.file_id))
            raise
        return rec

    async def abort(self) -> None:
        """Delete what was written so far; the writer is done."""
        self.buf.clear()
        await self.store.discard(self.key)


async def index_rank(redis: Redis, index: str, member: str, *, desc: bool) -> int | None:
    """`member`'s position in a tenant's index (zset), newest first if `desc`."""
    rank = await (redis.zrevrank if desc else redis.zrank)(index, member)
    return None if rank is None else int(cast(int, rank))


async def index_ids(redis: Redis, index: str, start: int, stop: int, *, desc: bool) -> list[str]:
    """Members of a tenant's index by position, inclusive, newest first if `desc`."""
    ids = await (redis.zrevrange if desc else redis.zrange)(index, start, stop)
    return [as_str(i) for i in cast(list[bytes], ids)]


def new_file_id() -> str:
    return f"file-{secrets.token_hex(16)}"  # 128 random bits: not enumerable


class FileStore:
    """Files in Redis, by tenant. Every method turns Redis failures into QueueUnavailable."""

    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._discards: set[asyncio.Future[None]] = set()  # deletions under way: kept referenced
        self._uploads = Pending()  # this process's uploads under way

    async def create(
        self, tenant: str, filename: str, purpose: str, content: bytes, *, file_id: str = ""
    ) -> FileRecord:
        writer = self.writer(file_id or new_file_id())
        await writer.write(content)
        return await writer.close(tenant, filename, purpose)

    async def usage_with_uploads(self, tenant: str) -> tuple[int, int]:
        """`usage` plus this process's uploads of the tenant that it did not see
        (`inferq.api.batches.pending`)."""
        return await self._uploads.count(tenant, lambda: self._usage(tenant))

    def uploading(
        self, tenant: str, file_id: str, nbytes: int
    ) -> contextlib.AbstractContextManager[None]:
        """Count the upload `file_id` of `nbytes` in `usage_with_uploads` while it is
        written; entered with no await after the quota check."""
        return self._uploads.adding(tenant, file_id, nbytes)

    def writer(self, file_id: str) -> FileWriter:
        """A file written a chunk at a time; writing the same id again replaces it."""
        return FileWriter(self, file_id)

    @unavailable
    async def put(self, key: str, offset: int, data: bytes) -> None:
        """One chunk of a file being written under `key` (a `keys.file_upload`)."""
        if offset == 0:  # SET: whatever an earlier, interrupted write left is replaced
            await self.redis.set(key, data, ex=UPLOAD_TTL_S)
            return
        async with self.redis.pipeline(transaction=True) as p:
            p.setrange(key, offset, data)
            p.expire(key, UPLOAD_TTL_S)
            await p.execute()

    @unavailable
    async def place(self, key: str, file_id: str) -> None:
        """A whole file's bytes from its upload key to its content key, with the file TTL."""
        content = keys.file_content(file_id)
        # Two calls (a cluster client pipelines no RENAME), the file TTL second: dying in
        # between leaves bytes with no record that lapse within UPLOAD_TTL_S.
        await self.redis.rename(key, content)
        await self.redis.expire(content, self.ttl_s)

    async def discard(self, key: str) -> None:
        """Delete a key of a write that failed. Shielded: it completes even when the writer
        was cancelled (a client gone mid-upload); a failure is logged, not raised (the caller
        is failing already, and an upload key lapses within `UPLOAD_TTL_S`)."""
        task = asyncio.ensure_future(self._discard(key))
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)

    async def _discard(self, key: str) -> None:
        try:
            await self.redis.delete(key)
        except Exception as e:  # Redis down as well: the key lapses by its TTL
            log.warning("could not delete %s after a failed write: %s", key, e)

    @unavailable
    async def publish(self, rec: FileRecord, score: float) -> None:
        index = keys.files(rec.tenant)
        fields = {
            FileField.ID: rec.id,
            FileField.TENANT: rec.tenant,
            FileField.FILENAME: rec.filename,
            FileField.PURPOSE: rec.purpose,
            FileField.BYTES: rec.size,
            FileField.CREATED_AT: rec.created_at,
            FileField.EXPIRES_AT: rec.expires_at,
        }
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

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(files, bytes) the tenant keeps, uploads and batch outputs alike, from its index;
        entries whose file has expired are dropped from the index on the way."""
        held = await self._usage(tenant)
        return len(held), sum(held.values())

    @unavailable
    async def _usage(self, tenant: str) -> dict[str, int]:
        """file id → bytes of each file the tenant keeps."""
        index = keys.files(tenant)
        ids = await index_ids(self.redis, index, 0, -1, desc=False)
        if not ids:
            return {}
        async with self.redis.pipeline(transaction=False) as p:
            for i in ids:
                p.hget(keys.file(i), FileField.BYTES)
            sizes = await p.execute()
        if gone := [i for i, size in zip(ids, sizes, strict=True) if size is None]:
            await self.redis.zrem(index, *gone)
        return {i: int(size) for i, size in zip(ids, sizes, strict=True) if size is not None}

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
                kind = as_str(raw.get(FileField.PURPOSE.encode(), b"")) if raw else ""
                if raw and (purpose is None or kind == purpose):
                    out.append(FileRecord.from_hash(raw))
        return out[:limit], len(out) > limit

    @unavailable
    async def delete(self, file_id: str, tenant: str) -> None:
        await self.get(file_id, tenant)
        # A batch still running reads its input file again if its runner is replaced. A
        # batch whose record is final may linger in BATCHES_ACTIVE until a runner drops it
        # (`BatchStore.deactivate`): it reads nothing more.
        active = [as_str(b) for b in await self.redis.smembers(keys.BATCHES_ACTIVE)]
        if active:
            async with self.redis.pipeline(transaction=False) as p:
                for b in active:
                    p.hmget(keys.batch(b), [BatchField.INPUT_FILE_ID, BatchField.STATUS])
                rows = await p.execute()
            for b, (input_id, status) in zip(active, rows, strict=True):
                running = status is not None and as_str(status) not in BATCH_FINAL
                if running and input_id is not None and as_str(input_id) == file_id:
                    raise JobConflict(
                        f"file {file_id!r} is the input of batch {b!r}, still running"
                    )
        # The file's two keys share a slot (one DEL); the tenant's index is in another, so
        # it goes second: dying in between leaves an index entry without its file, which
        # `page` drops.
        await self.redis.delete(keys.file(file_id), keys.file_content(file_id))
        await self.redis.zrem(keys.files(tenant), file_id)
