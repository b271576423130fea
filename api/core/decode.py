"""Request bodies, decoded and checked by compiled code: their JSON fields (orjson, then
explicit checks), and their typed inputs as clients send them → as they travel in Redis.

**Fields.** `/v1/jobs`, `/v1/infer` and `/v1/embeddings` are the hot routes: a quiet request
spends more CPU building and validating pydantic models than on anything it does. The
protocols' parsers (`protocols.v1.job_body`, `protocols.embeddings.embeddings_body`), built
on the helpers here, take exactly what the strict pydantic models
(`core.schemas.SubmitRequest`, `InferRequest`, `protocols.embeddings.EmbeddingsRequest`)
take, which is exactly what the OpenAPI document says; `tests/unit/api/core/test_decode.py`
holds the two to the same answers on generated bodies, valid and not. The models stay the
documentation (and the multipart path's). A refusal is `InvalidBody`: the route answers it
as a pydantic failure would be (422, `invalid_request`, each problem with its location), or
in OpenAI's shape (400) on `/v1/embeddings`.

**Inputs**, checked on their way to Redis. JSON items are a string (text), `{"image": "<base64>"}` or `{"tensor": {"dtype", "shape",
"data"}}` with `data` base64 bytes (little-endian) or nested lists; multipart uploads are
image parts named `files`. What the API checks, without any image decoder or device:

- sizes: an image over `INFERQ_MAX_IMAGE_BYTES` or a tensor over `INFERQ_MAX_TENSOR_BYTES`
  → 413; a text over `INFERQ_MAX_INPUT_CHARS` → 413; more than `INFERQ_MAX_INPUTS_PER_JOB`
  inputs → 413;
- shape: an empty text, base64 that does not decode, an image whose first bytes are not
  JPEG, PNG or WebP, a tensor whose bytes do not match dtype × shape, an unknown dtype → 422,
  each naming the input's index.

Decoding (and refusing an undecodable image or a decompression bomb) is the worker's, in
its prepare thread. Images and tensors travel as raw msgpack `bin`, never base64 in Redis.

What a route hands the job pipeline (`core.service.JobService`) is a `Submission`: one job
as its request decoded, not yet checked against the model.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from inferq.shared.errors import InputInvalid, InputTooLarge
from inferq.shared.jobs import image_input, tensor_input
from inferq.shared.schema import TENSOR_DTYPES, InputKind
from inferq.shared.settings import Settings

_MAGIC = {  # leading bytes → format
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
}


# strict: what the OpenAPI schema says is exactly what is accepted (no "1.5" for a number, no
# true for an integer), the rule the compiled decoder (below) follows too.
class ImageItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    image: str = Field(description="The image file's bytes (JPEG, PNG or WebP), base64.")


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    dtype: str = Field(description=f"One of {', '.join(sorted(TENSOR_DTYPES))}.")
    shape: list[int] = Field(description="Dimensions, e.g. [3, 224, 224].")
    data: str | list[Any] = Field(description="Little-endian bytes as base64, or nested lists.")


class TensorItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tensor: TensorSpec


InputItem = str | ImageItem | TensorItem


def image_format(data: bytes) -> str | None:
    for magic, name in _MAGIC.items():
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return None


def check_image(data: bytes, index: int, settings: Settings) -> bytes:
    if len(data) > settings.max_image_bytes:
        raise InputTooLarge(
            f"input {index}: image of {len(data)} bytes is over "
            f"INFERQ_MAX_IMAGE_BYTES={settings.max_image_bytes}"
        )
    if image_format(data) is None:
        raise InputInvalid(f"input {index}: not a JPEG, PNG or WebP image (by its first bytes)")
    return data


def _b64(text: str, index: int, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputInvalid(f"input {index}: {what} is not valid base64 ({e})") from e


def _tensor(spec: TensorSpec, index: int, settings: Settings) -> dict[str, Any]:
    if spec.dtype not in TENSOR_DTYPES:
        raise InputInvalid(
            f"input {index}: tensor dtype {spec.dtype!r}; use one of {sorted(TENSOR_DTYPES)}"
        )
    if any(d < 0 for d in spec.shape) or len(spec.shape) > 8:
        raise InputInvalid(f"input {index}: tensor shape {spec.shape}: at most 8 dims, none < 0")
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    expected = math.prod(spec.shape) * dtype.itemsize
    if expected > settings.max_tensor_bytes:
        raise InputTooLarge(
            f"input {index}: tensor of {expected} bytes is over "
            f"INFERQ_MAX_TENSOR_BYTES={settings.max_tensor_bytes}"
        )
    if isinstance(spec.data, str):
        data = _b64(spec.data, index, "tensor data")
    else:
        try:
            array = np.asarray(spec.data, dtype=dtype)
        except (ValueError, TypeError, OverflowError) as e:
            raise InputInvalid(f"input {index}: tensor data does not fit {spec.dtype}: {e}") from e
        if list(array.shape) != spec.shape:
            raise InputInvalid(
                f"input {index}: tensor data has shape {list(array.shape)}, not {spec.shape}"
            )
        data = array.tobytes()
    if len(data) != expected:
        raise InputInvalid(
            f"input {index}: tensor data is {len(data)} bytes; {spec.dtype} × {spec.shape} "
            f"needs {expected}"
        )
    return tensor_input(spec.dtype, spec.shape, data)


def check_text(text: str, index: int, settings: Settings) -> str:
    if len(text) > settings.max_input_chars:
        raise InputTooLarge(
            f"input {index} has {len(text)} characters, over "
            f"INFERQ_MAX_INPUT_CHARS={settings.max_input_chars}"
        )
    if not text.strip():
        raise InputInvalid(f"input {index} is empty")
    return text


def json_values(raw: bytes) -> int:
    """About how many values a JSON body holds (its commas, brackets and braces: a string
    with commas inside counts a few too many). Counted on the raw bytes, at memchr speed,
    so an oversized body is refused before anything is parsed."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def check_json_budget(raw: bytes, settings: Settings) -> None:
    """413 for a JSON body with more values than INFERQ_MAX_JSON_VALUES: parsing it would
    build that many Python objects on the event loop (a nested-list tensor, say)."""
    if (n := json_values(raw)) > settings.max_json_values:
        raise InputTooLarge(
            f"the JSON body holds about {n} values, over INFERQ_MAX_JSON_VALUES="
            f"{settings.max_json_values}: send large tensors as base64 `data` (little-endian "
            "bytes) or as multipart uploads"
        )


def item_kinds(items: list[InputItem], settings: Settings) -> list[InputKind]:
    """Each input's kind, known from its shape before anything is decoded or converted."""
    if len(items) > settings.max_inputs_per_job:
        raise InputTooLarge(
            f"{len(items)} inputs exceed INFERQ_MAX_INPUTS_PER_JOB={settings.max_inputs_per_job}"
        )
    return [
        InputKind.TEXT
        if isinstance(item, str)
        else InputKind.IMAGE
        if isinstance(item, ImageItem)
        else InputKind.TENSOR
        for item in items
    ]


def image_kinds(files: list[bytes]) -> list[InputKind]:
    return [InputKind.IMAGE] * len(files)


def wire_inputs(items: list[InputItem], settings: Settings) -> tuple[list[Any], list[InputKind]]:
    """Checked inputs as they go into Redis, and each one's kind."""
    item_kinds(items, settings)  # the count first: nothing is converted past the limit
    if (
        set(map(type, items)) == {str}
        and max(map(len, items)) <= settings.max_input_chars  # type: ignore[arg-type]
        and all(map(str.strip, items))  # type: ignore[arg-type]
    ):
        # Texts alone, all within bounds: checked in C, no Python call an input. Any other
        # body takes the loop below, which converts each input and names a bad one.
        return list(items), [InputKind.TEXT] * len(items)
    values: list[Any] = []
    kinds: list[InputKind] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            values.append(check_text(item, i, settings))
            kinds.append(InputKind.TEXT)
        elif isinstance(item, ImageItem):
            values.append(image_input(check_image(_b64(item.image, i, "image"), i, settings)))
            kinds.append(InputKind.IMAGE)
        else:
            values.append(_tensor(item.tensor, i, settings))
            kinds.append(InputKind.TENSOR)
    return values, kinds


def wire_images(files: list[bytes], settings: Settings) -> tuple[list[Any], list[InputKind]]:
    """Uploaded image parts (multipart `files`) as they go into Redis."""
    if len(files) > settings.max_inputs_per_job:
        raise InputTooLarge(
            f"{len(files)} files exceed INFERQ_MAX_INPUTS_PER_JOB={settings.max_inputs_per_job}"
        )
    values = [image_input(check_image(data, i, settings)) for i, data in enumerate(files)]
    return values, [InputKind.IMAGE] * len(values)


#: The body of a JSON route that takes no inputs (POST /v1/batches: ids, an endpoint, a window,
#: at most 16 short metadata pairs) fits in this many bytes. The routes that take inputs are
#: bounded by INFERQ_MAX_BODY_BYTES (`middleware`) instead; both by INFERQ_MAX_JSON_VALUES.
MAX_CONTROL_JSON_BYTES = 64 * 1024
#: A job's `metadata`: OpenAI's bounds for the same field (16 pairs, 64-character keys,
#: 512-character values), so a label set made for one fits the other.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class InvalidBody(InputInvalid):
    """A body that does not decode: `detail` lists each problem as {loc, msg}."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(f"{loc}: {msg}")
        self.detail = [{"loc": loc, "msg": msg}]


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidBody("body", f"JSON decode error: {e}") from e
    if not isinstance(value, dict):
        raise InvalidBody("body", "Input should be an object")
    return value


def json_budget(raw: bytes, settings: Settings, max_bytes: int) -> dict[str, Any]:
    """A JSON route's body, within the one JSON budget: at most `max_bytes` and
    INFERQ_MAX_JSON_VALUES values (413 past either, checked before parsing), then an object."""
    if len(raw) > max_bytes:
        raise InputTooLarge(f"the JSON body is over {max_bytes} bytes ({len(raw)})")
    check_json_budget(raw, settings)
    return json_object(raw)


def number(value: Any, loc: str, *, gt: float | None = None, ge: float | None = None) -> float:
    # A JSON number, never a bool (a bool is an int to Python) nor a numeric string.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBody(loc, "Input should be a valid number")
    number = float(value)
    if gt is not None and not number > gt:
        raise InvalidBody(loc, f"Input should be greater than {gt:g}")
    if ge is not None and not number >= ge:
        raise InvalidBody(loc, f"Input should be greater than or equal to {ge:g}")
    return number


def optional_str(value: Any, loc: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidBody(loc, "Input should be a valid string")
    return value


def forbid_extra(obj: dict[str, Any], allowed: frozenset[str] | set[str], loc: str) -> None:
    for key in obj:
        if key not in allowed:
            raise InvalidBody(f"{loc}{key}", "Extra inputs are not permitted")


def _tensor_item(value: Any, loc: str) -> TensorItem:
    if not isinstance(value, dict):
        raise InvalidBody(loc, "Input should be an object")
    forbid_extra(value, {"dtype", "shape", "data"}, f"{loc}.")
    for name in ("dtype", "shape", "data"):
        if name not in value:
            raise InvalidBody(f"{loc}.{name}", "Field required")
    dtype, shape, data = value["dtype"], value["shape"], value["data"]
    if not isinstance(dtype, str):
        raise InvalidBody(f"{loc}.dtype", "Input should be a valid string")
    if not isinstance(shape, list) or any(
        isinstance(d, bool) or not isinstance(d, int) for d in shape
    ):
        raise InvalidBody(f"{loc}.shape", "Input should be a list of integers")
    if not isinstance(data, str | list):
        raise InvalidBody(f"{loc}.data", "Input should be a string (base64) or a list")
    spec = TensorSpec.model_construct(dtype=dtype, shape=shape, data=data)
    return TensorItem.model_construct(tensor=spec)


def _item(value: Any, loc: str) -> InputItem:
    """A string, `{"image": str}` or `{"tensor": {dtype, shape, data}}`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        if isinstance(value.get("image"), str):
            return ImageItem.model_construct(image=value["image"])
        if "tensor" in value:
            return _tensor_item(value["tensor"], f"{loc}.tensor")
    raise InvalidBody(
        loc, 'an input is a string, {"image": "<base64>"} or {"tensor": {"dtype", "shape", "data"}}'
    )


def input_items(body: dict[str, Any]) -> list[InputItem]:
    """A job body's inputs: exactly one of `input` (one item) or `inputs` (a list)."""
    inputs, single = body.get("inputs"), body.get("input")
    if (inputs is None) == (single is None):
        raise InvalidBody("body", "give exactly one of 'input' (one item) or 'inputs' (a list)")
    if single is not None:
        return [_item(single, "input")]
    if not isinstance(inputs, list):
        raise InvalidBody("inputs", "Input should be a valid list")
    if not inputs:
        raise InvalidBody("body", "'inputs' is empty: give at least one")
    if set(map(type, inputs)) == {str}:  # texts alone: the list is its own answer, no call each
        return inputs
    return [_item(v, f"inputs.{i}") for i, v in enumerate(inputs)]


def metadata(value: Any, loc: str = "metadata") -> dict[str, str]:
    """A job's labels: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidBody(loc, "Input should be a valid dictionary")
    if len(value) > MAX_METADATA_PAIRS:
        raise InvalidBody(loc, f"Dictionary should have at most {MAX_METADATA_PAIRS} items")
    for k, v in value.items():
        if len(k) > MAX_METADATA_KEY:
            raise InvalidBody(
                f"{loc}.{k[:MAX_METADATA_KEY]}",
                f"a key should have at most {MAX_METADATA_KEY} characters",
            )
        if not isinstance(v, str):
            raise InvalidBody(f"{loc}.{k}", "Input should be a valid string")
        if len(v) > MAX_METADATA_VALUE:
            raise InvalidBody(
                f"{loc}.{k}", f"String should have at most {MAX_METADATA_VALUE} characters"
            )
    return value


@dataclass(slots=True)
class Submission:
    """One job as a route parsed it: JSON items or uploaded image files, not yet checked."""

    items: list[InputItem] = field(default_factory=list)
    files: list[bytes] = field(default_factory=list)
    model: str | None = None
    tenant: str = ""
    priority: str = "normal"
    timeout_s: float | None = None
    idempotency_key: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    webhook: str | None = None  # URL to deliver the final job to
    webhook_events: tuple[str, ...] | None = None  # the final statuses it fires on; None: all
    metadata: dict[str, str] = field(default_factory=dict)  # the caller's labels
    result_ttl_s: int | None = None  # how long the final record lives; None: the default

    def answered_inline(self, settings: Settings) -> bool:
        """Answered inline: True, kept INFERQ_SYNC_RESULT_TTL_S, unless it set a TTL or webhook."""
        if self.result_ttl_s is not None or self.webhook is not None:
            return False
        self.result_ttl_s = min(settings.sync_result_ttl_s, settings.result_ttl_s)
        return True
