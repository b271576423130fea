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
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np

from inferq.shared.errors import CodecError

SCHEMA_VERSION = 1


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL


FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.EXPIRED, Status.CANCELLED})


def new_job_id() -> str:
    """128 random bits, URL-safe; never a stream id (those are enumerable timestamps)."""
    return secrets.token_urlsafe(16)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class JobError:
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
        "v": _pack(SCHEMA_VERSION),
        "id": _pack(job.id),
        "model": _pack(job.model),
        "tenant": _pack(job.tenant),
        "priority": _pack(job.priority),
        "status": _pack(str(job.status)),
        "inputs": _pack(job.inputs),
        "items": _pack(len(job.inputs)),
        "created_ms": _pack(job.created_ms),
        "deadline_ms": _pack(job.deadline_ms),
        "attempts": _pack(job.attempts),
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
    fields = {
        "status": _pack(str(status)),
        "finished_ms": _pack(finished_ms),
        "batch_size": _pack(batch_size),
        "batch_tokens": _pack(batch_tokens),
    }
    if outputs is not None:
        fields["outputs"] = _pack(encode_outputs(outputs))
    if error is not None:
        fields["error"] = _pack({"code": error.code, "message": error.message})
    return fields


def pack_field(value: Any) -> bytes:
    return _pack(value)


def decode_job(raw: dict[bytes, bytes]) -> Job:
    """Decode a full hash (HGETALL). Unknown fields are ignored (forward compatible)."""
    try:
        f = {k.decode(): _unpack(v) for k, v in raw.items()}
        if f.get("v") != SCHEMA_VERSION:
            raise CodecError(f"unsupported job schema version {f.get('v')!r}")
        err = f.get("error")
        outputs = f.get("outputs")
        return Job(
            id=f["id"],
            model=f["model"],
            inputs=f.get("inputs", []),
            status=Status(f["status"]),
            tenant=f.get("tenant", ""),
            priority=f.get("priority", "normal"),
            entry=f.get("entry", ""),
            created_ms=f["created_ms"],
            deadline_ms=f.get("deadline_ms", 0),
            started_ms=f.get("started_ms"),
            finished_ms=f.get("finished_ms"),
            attempts=f.get("attempts", 0),
            outputs=None if outputs is None else decode_outputs(outputs),
            error=None if err is None else JobError(err["code"], err["message"]),
            batch_size=f.get("batch_size", 0),
            batch_tokens=f.get("batch_tokens", 0),
        )
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, msgpack.UnpackException) as e:
        raise CodecError(f"undecodable job record: {e!r}") from e
