"""The job record and its msgpack codec (schema-versioned; no pickle anywhere).

A job is stored as a Redis hash whose field values are each msgpack-encoded, so Lua
scripts can read single fields (`cmsgpack.unpack`) and a worker can update a few fields
without rewriting the record.

Inputs are msgpack values: a str is a text; `{"image": <bin>}` carries an encoded image's
bytes as they were uploaded (never base64 inside Redis); `{"tensor": {"dtype", "shape",
"data": <bin>}}` a raw array. Outputs are either vectors, as raw float32 bytes with dtype and
shape beside them (never nested lists), or `{"items": [...]}`: one msgpack value per input.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgpack
import numpy as np

from inferq.shared import keys
from inferq.shared.errors import CodecError
from inferq.shared.schema import FINAL, SCHEMA_VERSION, ErrorCode, InputKind, Status
from inferq.shared.schema import JobField as F

__all__ = [
    "FINAL",
    "SCHEMA_VERSION",
    "ErrorCode",
    "Job",
    "JobError",
    "Status",
    "decode_input",
    "decode_job",
    "decode_published",
    "encode_final",
    "encode_submit",
    "image_input",
    "input_bytes",
    "inputs_bytes",
    "new_job_id",
    "now_ms",
    "pack_field",
    "plain",
    "published_job",
    "tensor_input",
]


def new_job_id(model: str, shard: int = 0, shards: int = 1) -> str:
    """The shard's hash tag (`keys.tag`), a dot, then 128 random bits, URL-safe; never a
    stream id (those are enumerable timestamps)."""
    return f"{keys.tag(model, shard, shards)}.{secrets.token_urlsafe(16)}"


def now_ms() -> int:
    return int(time.time() * 1000)


class Clock(Protocol):
    """Two clocks, passed in so tests can drive time instead of waiting for it.
    `monotonic()` (seconds) orders and times things inside one process: batch waits, run
    times, the take-over schedule, stuck batches. `now_ms()` (wall milliseconds) is what job
    records carry: created, started and finished times and deadlines, across processes."""

    def monotonic(self) -> float: ...

    def now_ms(self) -> int: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now_ms(self) -> int:
        return now_ms()


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
    inputs: list[Any]  # see the module docstring for the three shapes
    status: Status = Status.QUEUED
    tenant: str = ""
    priority: str = "normal"
    entry: str = ""  # stream entry id of the current delivery (set by the submit script)
    created_ms: int = field(default_factory=now_ms)
    deadline_ms: int = 0
    started_ms: int | None = None
    finished_ms: int | None = None
    attempts: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: np.ndarray | list[Any] | None = None
    error: JobError | None = None
    batch_size: int = 0
    batch_tokens: int = 0
    worker: str = ""  # which worker wrote the outcome
    webhook: dict[str, Any] | None = None  # {"url": ...}: delivered when final
    cache: dict[str, Any] | None = None  # {"key", "ttl_s", "max_bytes"}: fill on success
    cached: bool = False  # answered from the result cache
    items: int = 0  # how many inputs it has (kept when a final record drops them)
    items_done: int = 0  # inputs with an output so far (per batch while running)
    cancel_requested: bool = False  # cancelled while running: its worker has not ended it yet
    metadata: dict[str, str] = field(default_factory=dict)  # the caller's labels
    result_ttl_s: int = 0  # how long the final record lives; 0: the server's INFERQ_RESULT_TTL_S

    def __post_init__(self) -> None:
        self.items = self.items or len(self.inputs)

    def timings(self) -> dict[str, int | bool | None]:
        """queued: created → taken by a worker; run: taken → final (batching wait + model)."""
        started, finished = self.started_ms, self.finished_ms
        return {
            "queued_ms": None if started is None else started - self.created_ms,
            "run_ms": None if started is None or finished is None else finished - started,
            "total_ms": None if finished is None else finished - self.created_ms,
            "batch_size": self.batch_size or None,
            "batch_tokens": self.batch_tokens or None,
            "cached": self.cached,
        }


#: One msgpack Packer a thread (a Packer keeps a buffer, so threads must not share one):
#: `msgpack.packb` builds a new Packer each call, ~0.3 µs against ~0.05 to pack a field, and a
#: job record is a dozen fields. A pack that raises leaves the buffer empty (msgpack resets
#: it), so the next one starts clean.
_packers = threading.local()


def _packer() -> Callable[[Any], bytes]:
    """This thread's `Packer.pack`: a record's encoder fetches it once and packs each field
    with it, a call into C a field rather than a Python call."""
    try:
        pack: Callable[[Any], bytes] = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    return pack


def _pack(value: Any) -> bytes:
    return _packer()(value)


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False)


def image_input(data: bytes) -> dict[str, bytes]:
    """An image input as Redis carries it: the uploaded file's bytes, never base64."""
    return {"image": data}


def tensor_input(dtype: str, shape: list[int], data: bytes) -> dict[str, Any]:
    """A raw-array input as Redis carries it: dtype, shape, little-endian bytes."""
    return {"tensor": {"dtype": dtype, "shape": shape, "data": data}}


def decode_input(value: Any) -> tuple[InputKind, str | bytes | tuple[str, tuple[int, ...], bytes]]:
    """One input off the wire: (TEXT, str), (IMAGE, bytes) or (TENSOR, (dtype, shape, data));
    `ValueError` naming what is off for anything else."""
    if isinstance(value, str):
        return InputKind.TEXT, value
    if isinstance(value, dict) and isinstance(value.get("image"), bytes):
        return InputKind.IMAGE, value["image"]
    if isinstance(value, dict) and isinstance(t := value.get("tensor"), dict):
        try:
            return InputKind.TENSOR, (str(t["dtype"]), tuple(t["shape"]), t["data"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed tensor: {e}") from e
    raise ValueError(f"unknown input shape {type(value).__name__}")


def input_bytes(value: Any) -> int:
    """What one input weighs in Redis (text as UTF-8; images and tensors by their bytes)."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict):
        if isinstance(value.get("image"), bytes):
            return len(value["image"])
        tensor = value.get("tensor")
        if isinstance(tensor, dict) and isinstance(tensor.get("data"), bytes):
            return len(tensor["data"])
    return 0


def inputs_bytes(values: list[Any]) -> int:
    """What a job's inputs weigh in Redis (`input_bytes` summed). Texts alone, the common
    body, are weighed in C (map over `str.encode`), with no Python call an input."""
    if set(map(type, values)) <= {str}:
        return sum(map(len, map(str.encode, values)))
    return sum(map(input_bytes, values))


def plain(value: Any) -> Any:
    """`value` with numpy arrays and scalars turned into lists and Python numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def encode_outputs(outputs: np.ndarray | list[Any]) -> dict[str, Any]:
    if isinstance(outputs, np.ndarray):
        arr = np.ascontiguousarray(outputs, dtype=np.float32)
        return {"dtype": "float32", "shape": list(arr.shape), "data": arr.tobytes()}
    return {"items": plain(outputs)}


def decode_outputs(value: dict[str, Any]) -> np.ndarray | list[Any]:
    try:
        if "items" in value:
            return list(value["items"])
        arr = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"]))
        return arr.reshape(value["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"bad outputs payload: {e}") from e


def encode_submit(job: Job) -> dict[str, bytes]:
    """Fields written when a job is accepted."""
    pack = _packer()
    fields = {
        F.VERSION: pack(SCHEMA_VERSION),
        F.ID: pack(job.id),
        F.MODEL: pack(job.model),
        F.TENANT: pack(job.tenant),
        F.PRIORITY: pack(job.priority),
        F.STATUS: pack(str(job.status)),
        F.INPUTS: pack(job.inputs),
        F.PARAMETERS: pack(job.parameters),
        F.ITEMS: pack(len(job.inputs)),
        F.BYTES: pack(inputs_bytes(job.inputs)),
        F.CREATED_MS: pack(job.created_ms),
        F.DEADLINE_MS: pack(job.deadline_ms),
        F.ATTEMPTS: pack(job.attempts),
    }
    if job.webhook is not None:
        fields[F.WEBHOOK] = pack(job.webhook)
    if job.cache is not None:
        fields[F.CACHE] = pack(job.cache)
    if job.cached:
        fields[F.CACHED] = pack(True)
    if job.metadata:
        fields[F.METADATA] = pack(job.metadata)
    if job.result_ttl_s:
        fields[F.RESULT_TTL] = pack(job.result_ttl_s)
    return fields


def encode_final(
    status: Status,
    *,
    finished_ms: int,
    outputs: np.ndarray | list[Any] | None = None,
    error: JobError | None = None,
    batch: tuple[int, int] = (0, 0),
    worker: str = "",
    items_done: int | None = None,
) -> dict[str, bytes]:
    """Fields written (once, guarded) when a job becomes final. `batch`: (items, tokens) of
    the largest batch it ran in. `items_done`: given by the worker that ran it; an outcome
    written elsewhere (cancel or expiry in the queue) keeps what the record says."""
    pack = _packer()
    fields: dict[str, bytes] = {
        F.STATUS: pack(str(status)),
        F.FINISHED_MS: pack(finished_ms),
        F.BATCH_SIZE: pack(batch[0]),
        F.BATCH_TOKENS: pack(batch[1]),
    }
    if items_done is not None:
        fields[F.ITEMS_DONE] = pack(items_done)
    if worker:
        fields[F.WORKER] = pack(worker)
    if outputs is not None:
        fields[F.OUTPUTS] = pack(encode_outputs(outputs))
    if error is not None:
        fields[F.ERROR] = pack({"code": str(error.code), "message": error.message})
    return fields


def pack_field(value: Any) -> bytes:
    return _pack(value)


# Members by value: a dict lookup, where calling the enum is two Python calls a record.
_STATUSES = {s.value: s for s in Status}
_CODES = {c.value: c for c in ErrorCode}


def _code(value: str) -> str:
    return _CODES.get(value, value)  # a code from a newer writer: shown as is


def decode_job(raw: dict[bytes, bytes]) -> Job:
    """Decode a full hash (HGETALL). Unknown fields are ignored (forward compatible)."""
    try:
        unpack = msgpack.unpackb  # called directly: a record is a dozen fields, read twice a job
        f = {k.decode(): unpack(v, raw=False) for k, v in raw.items()}
        if f.get(F.VERSION) != SCHEMA_VERSION:
            raise CodecError(f"unsupported job schema version {f.get(F.VERSION)!r}")
        err = f.get(F.ERROR)
        outputs = f.get(F.OUTPUTS)
        return Job(
            id=f[F.ID],
            model=f[F.MODEL],
            inputs=f.get(F.INPUTS, []),
            status=_STATUSES[f[F.STATUS]],
            tenant=f.get(F.TENANT, ""),
            priority=f.get(F.PRIORITY, "normal"),
            entry=f.get(F.ENTRY, ""),
            created_ms=f[F.CREATED_MS],
            deadline_ms=f.get(F.DEADLINE_MS, 0),
            started_ms=f.get(F.STARTED_MS),
            finished_ms=f.get(F.FINISHED_MS),
            attempts=f.get(F.ATTEMPTS, 0),
            parameters=f.get(F.PARAMETERS) or {},
            outputs=None if outputs is None else decode_outputs(outputs),
            error=None if err is None else JobError(_code(err["code"]), err["message"]),
            batch_size=f.get(F.BATCH_SIZE, 0),
            batch_tokens=f.get(F.BATCH_TOKENS, 0),
            worker=f.get(F.WORKER, ""),
            webhook=f.get(F.WEBHOOK),
            cache=f.get(F.CACHE),
            cached=bool(f.get(F.CACHED, False)),
            items=f.get(F.ITEMS, 0),
            items_done=f.get(F.ITEMS_DONE, 0),
            cancel_requested=bool(f.get(F.CANCEL, False)),
            metadata=f.get(F.METADATA) or {},
            result_ttl_s=f.get(F.RESULT_TTL, 0),
        )
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, msgpack.UnpackException) as e:
        raise CodecError(f"undecodable job record: {e!r}") from e


def decode_published(payload: bytes) -> Job | None:
    """The job a completion message carries (its record without inputs), or None when the
    message is the bare 'final' (the record was too large to send) or undecodable."""
    try:
        flat = msgpack.unpackb(payload, raw=True)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(flat, list) or len(flat) % 2:
        return None
    try:
        return decode_job(dict(zip(flat[::2], flat[1::2], strict=True)))
    except CodecError:
        return None


def published_job(payload: bytes | None, known: Job) -> Job | None:
    """The final job a completion message describes (`Notifier.watch`'s result), laid over
    `known`: the job as this waiter last read or created it. The message carries only what
    FINISH wrote and the fields the job's worker wrote while it ran (started, attempts,
    progress: `scripts.FINISH`), so the final job is `known` with those, less its inputs, as
    the final record is. None: read it back instead (no message, 'final', or undecodable)."""
    if not payload:
        return None
    try:
        flat = msgpack.unpackb(payload, raw=True)
        pairs = zip(flat[::2], flat[1::2], strict=True)
        f = {k.decode(): msgpack.unpackb(v, raw=False) for k, v in pairs}
        status = _STATUSES[f[F.STATUS]]
        if not status.is_final:
            return None
        err, outputs = f.get(F.ERROR), f.get(F.OUTPUTS)
        return replace(
            known,
            inputs=[],
            status=status,
            started_ms=f.get(F.STARTED_MS, known.started_ms),
            finished_ms=f.get(F.FINISHED_MS),
            attempts=f.get(F.ATTEMPTS, known.attempts),
            items_done=f.get(F.ITEMS_DONE, known.items_done),
            batch_size=f.get(F.BATCH_SIZE, 0),
            batch_tokens=f.get(F.BATCH_TOKENS, 0),
            worker=f.get(F.WORKER, known.worker),
            outputs=None if outputs is None else decode_outputs(outputs),
            error=None if err is None else JobError(_code(err["code"]), err["message"]),
        )
    except (CodecError, KeyError, TypeError, ValueError, AttributeError, msgpack.UnpackException):
        return None
