"""The job record and its msgpack codec (schema-versioned; no pickle anywhere).

A job is stored as a Redis hash whose field values are each msgpack-encoded, so Lua
scripts can read single fields (`cmsgpack.unpack`) and a worker can update a few fields
without rewriting the record. Outputs travel as raw float32 bytes with dtype and shape
beside them, never as nested lists.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from inferq.shared.errors import CodecError
from inferq.shared.schema import FINAL, SCHEMA_VERSION, ErrorCode, Status
from inferq.shared.schema import JobField as F

__all__ = [
    "FINAL",
    "SCHEMA_VERSION",
    "ErrorCode",
    "Job",
    "JobError",
    "Status",
    "decode_job",
    "encode_final",
    "encode_submit",
    "new_job_id",
    "now_ms",
    "pack_field",
]


def new_job_id() -> str:
    """128 random bits, URL-safe; never a stream id (those are enumerable timestamps)."""
    return secrets.token_urlsafe(16)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class JobError:
    """Why a job did not succeed: an `ErrorCode` (a plain string if a newer writer sent one
    this reader does not know) and a message that names the input or limit."""

    code: str
    message: str


@dataclass(slots=True)
class Job:
    id: str
    model: str
    inputs: list[str]
    status: Status = Status.QUEUED
    tenant: str = ""
    priority: str = "normal"
    entry: str = ""  # stream entry id of the current delivery (set by the submit script)
    created_ms: int = field(default_factory=now_ms)
    deadline_ms: int = 0
    started_ms: int | None = None
    finished_ms: int | None = None
    attempts: int = 0
    outputs: np.ndarray | None = None
    error: JobError | None = None
    batch_size: int = 0
    batch_tokens: int = 0

    def timings(self) -> dict[str, int | None]:
        """queued: created → taken by a worker; run: taken → final (batching wait + model)."""
        started, finished = self.started_ms, self.finished_ms
        return {
            "queued_ms": None if started is None else started - self.created_ms,
            "run_ms": None if started is None or finished is None else finished - started,
            "total_ms": None if finished is None else finished - self.created_ms,
            "batch_size": self.batch_size or None,
            "batch_tokens": self.batch_tokens or None,
        }


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False)


def encode_outputs(outputs: np.ndarray) -> dict[str, Any]:
    arr = np.ascontiguousarray(outputs, dtype=np.float32)
    return {"dtype": "float32", "shape": list(arr.shape), "data": arr.tobytes()}


def decode_outputs(value: dict[str, Any]) -> np.ndarray:
    try:
        arr = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
        return arr.reshape(value["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"bad outputs payload: {e}") from e


def encode_submit(job: Job) -> dict[str, bytes]:
    """Fields written when a job is accepted."""
    return {
        F.VERSION: _pack(SCHEMA_VERSION),
        F.ID: _pack(job.id),
        F.MODEL: _pack(job.model),
        F.TENANT: _pack(job.tenant),
        F.PRIORITY: _pack(job.priority),
        F.STATUS: _pack(str(job.status)),
        F.INPUTS: _pack(job.inputs),
        F.ITEMS: _pack(len(job.inputs)),
        F.CREATED_MS: _pack(job.created_ms),
        F.DEADLINE_MS: _pack(job.deadline_ms),
        F.ATTEMPTS: _pack(job.attempts),
    }


def encode_final(
    status: Status,
    *,
    finished_ms: int,
    outputs: np.ndarray | None = None,
    error: JobError | None = None,
    batch_size: int = 0,
    batch_tokens: int = 0,
) -> dict[str, bytes]:
    """Fields written (once, guarded) when a job becomes final."""
    fields: dict[str, bytes] = {
        F.STATUS: _pack(str(status)),
        F.FINISHED_MS: _pack(finished_ms),
        F.BATCH_SIZE: _pack(batch_size),
        F.BATCH_TOKENS: _pack(batch_tokens),
    }
    if outputs is not None:
        fields[F.OUTPUTS] = _pack(encode_outputs(outputs))
    if error is not None:
        fields[F.ERROR] = _pack({"code": str(error.code), "message": error.message})
    return fields


def pack_field(value: Any) -> bytes:
    return _pack(value)


def _code(value: str) -> str:
    try:
        return ErrorCode(value)
    except ValueError:
        return value  # a code from a newer writer: shown as is


def decode_job(raw: dict[bytes, bytes]) -> Job:
    """Decode a full hash (HGETALL). Unknown fields are ignored (forward compatible)."""
    try:
        f = {k.decode(): _unpack(v) for k, v in raw.items()}
        if f.get(F.VERSION) != SCHEMA_VERSION:
            raise CodecError(f"unsupported job schema version {f.get(F.VERSION)!r}")
        err = f.get(F.ERROR)
        outputs = f.get(F.OUTPUTS)
        return Job(
            id=f[F.ID],
            model=f[F.MODEL],
            inputs=f.get(F.INPUTS, []),
            status=Status(f[F.STATUS]),
            tenant=f.get(F.TENANT, ""),
            priority=f.get(F.PRIORITY, "normal"),
            entry=f.get(F.ENTRY, ""),
            created_ms=f[F.CREATED_MS],
            deadline_ms=f.get(F.DEADLINE_MS, 0),
            started_ms=f.get(F.STARTED_MS),
            finished_ms=f.get(F.FINISHED_MS),
            attempts=f.get(F.ATTEMPTS, 0),
            outputs=None if outputs is None else decode_outputs(outputs),
            error=None if err is None else JobError(_code(err["code"]), err["message"]),
            batch_size=f.get(F.BATCH_SIZE, 0),
            batch_tokens=f.get(F.BATCH_TOKENS, 0),
        )
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, msgpack.UnpackException) as e:
        raise CodecError(f"undecodable job record: {e!r}") from e
