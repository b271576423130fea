"""Typed inputs as clients send them → as they travel in Redis, checked on the way.

JSON items are a string (text), `{"image": "<base64>"}` or `{"tensor": {"dtype", "shape",
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
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np
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
# true for an integer), the rule the routes' compiled decoder (`core.decode`) follows too.
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
