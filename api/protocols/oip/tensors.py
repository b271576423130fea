"""Open Inference Protocol tensors ↔ arrays, in both of the protocol's encodings.

- JSON: `data` is a list, flat or nested, in row-major order; BYTES elements are strings.
- Binary (the `binary_tensor_data` extension): the tensor's raw little-endian bytes after
  the JSON header; a BYTES tensor is its elements in row-major order, each a 4-byte
  little-endian length followed by that many bytes.

Pure: no I/O, no HTTP. A binary tensor is not copied here: a numeric one is `np.frombuffer`
over its slice of the request body, BYTES elements are `memoryview` slices of it; whoever
turns them into job inputs makes the one copy. Every refusal is `InputInvalid` naming the
tensor (the OIP routes answer it 400).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferq.shared.errors import InputInvalid

BYTES = "BYTES"
#: Numeric datatypes → their little-endian numpy dtype.
NUMERIC: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
DATATYPES = frozenset({*NUMERIC, BYTES})
#: Datatypes JSON cannot carry faithfully: a half float travels as binary data only.
BINARY_ONLY = frozenset({"FP16"})
MAX_DIMS = 8  # as inferq's own tensors (`core.decode`)
_LENGTH = struct.Struct("<I")

Element = str | bytes | memoryview
Values = np.ndarray | list[Element]


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor. `values`: a numeric array shaped `shape`, or a BYTES tensor's
    elements flat in row-major order (`str` from JSON, `memoryview` from binary data)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: Values

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1


def check_datatype(name: str, datatype: object) -> str:
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        shown = repr(datatype)[:32]
        raise InputInvalid(f"input '{name}': datatype {shown}; use one of {sorted(DATATYPES)}")
    return datatype


def check_shape(name: str, shape: object, max_elements: int) -> tuple[int, ...]:
    """A shape as the protocol sends it: a list of at most `MAX_DIMS` non-negative ints whose
    dimensions, zeros aside, multiply to at most `max_elements`. A zero makes a tensor empty
    whatever the other dimensions say, so they are bounded as if it were not there: no
    `[1, 0, 2**63]` reaches numpy (whose reshape refuses a dimension past int64 with a 500)."""
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        shown = repr(shape)[:64]
        raise InputInvalid(
            f"input '{name}': shape {shown}; a list of at most {MAX_DIMS} non-negative integers"
        )
    span = 1
    for d in shape:  # stops at the first dimension past the bound: no product of huge ints
        span *= max(d, 1)
        if span > max_elements:
            raise InputInvalid(
                f"input '{name}': shape {repr(shape)[:64]} spans more than {max_elements} "
                "elements (its dimensions multiplied, zeros aside): more than a body can carry"
            )
    return tuple(shape)


def byte_size(datatype: str, shape: tuple[int, ...]) -> int | None:
    """The raw bytes a numeric tensor takes; None for BYTES (its elements vary)."""
    dtype = NUMERIC.get(datatype)
    return None if dtype is None else math.prod(shape) * dtype.itemsize


# --- JSON ---
def from_json(name: str, datatype: str, shape: tuple[int, ...], data: object) -> Tensor:
    """A tensor from JSON `data`: flat (as many values as the shape holds) or nested
    exactly as the shape is."""
    if not isinstance(data, list):
        raise InputInvalid(f"input '{name}': data must be a list, not {type(data).__name__}")
    if datatype in BINARY_ONLY:
        raise InputInvalid(f"input '{name}': {datatype} travels as binary data only")
    if datatype == BYTES:
        return Tensor(name, datatype, shape, _json_strings(name, shape, data))
    return Tensor(name, datatype, shape, _json_numbers(name, datatype, shape, data))


def _layout(name: str, shape: tuple[int, ...], got: tuple[int, ...]) -> None:
    """Flat data with the shape's element count, or nested data shaped exactly like it."""
    if got == shape or (len(got) == 1 and got[0] == math.prod(shape)):
        return
    how = "flat" if len(got) == 1 else f"nested as {list(got)}"
    raise InputInvalid(
        f"input '{name}': data {how} ({math.prod(got)} values) does not match shape {list(shape)}"
    )


def _json_strings(name: str, shape: tuple[int, ...], data: list[Any]) -> list[Element]:
    try:
        array = np.asarray(data, dtype=object)
    except ValueError as e:  # nested lists of different lengths
        raise InputInvalid(f"input '{name}': data is not a regular nested list ({e})") from e
    _layout(name, shape, array.shape)
    values: list[Element] = array.reshape(-1).tolist()
    for i, v in enumerate(values):
        if type(v) is not str:
            raise InputInvalid(
                f"input '{name}': BYTES element {i} is {type(v).__name__}; JSON BYTES are strings"
            )
    return values


def _json_numbers(name: str, datatype: str, shape: tuple[int, ...], data: list[Any]) -> np.ndarray:
    dtype = NUMERIC[datatype]
    try:
        with np.errstate(over="raise", invalid="raise"):
            # Integers straight from Python's ints: exact past 2**53, and range-checked.
            exact = np.asarray(data, dtype=dtype) if dtype.kind in "iu" else None
            seen = np.asarray(data)  # the values as JSON held them: their kind is checked
            array = exact if exact is not None else seen.astype(dtype)
    except (OverflowError, FloatingPointError) as e:
        raise InputInvalid(f"input '{name}': a value is out of range for {datatype} ({e})") from e
    except (ValueError, TypeError) as e:  # ragged nesting, None, a string that is no number
        raise InputInvalid(f"input '{name}': data does not fit {datatype} ({e})") from e
    _layout(name, shape, seen.shape)
    if seen.size and not _same_kind(seen, array, dtype):
        raise InputInvalid(
            f"input '{name}': data holds {_kind_name(seen)} values, not {datatype} values"
        )
    return array.reshape(shape)


def _same_kind(seen: np.ndarray, array: np.ndarray, dtype: np.dtype[Any]) -> bool:
    """Whether JSON's values are of the datatype's kind: a JSON 1 is a fine FP32, but
    neither 1 nor 1.5 is a BOOL and 1.5 is no INT8."""
    kind = seen.dtype.kind
    if dtype.kind == "b":
        return kind == "b"
    if dtype.kind == "f":
        return kind in "iuf"
    # Integers; numpy reads int64 and uint64 values mixed as floats: integral ones pass.
    return kind in "iu" or (kind == "f" and bool(np.array_equal(array, seen)))


def _kind_name(array: np.ndarray) -> str:
    return {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point"}.get(
        array.dtype.kind, "non-numeric"
    )


def to_json(values: Values) -> list[Any] | np.ndarray:
    """JSON `data`, flat and row-major: a 1-d array (orjson writes numpy natively) or strings."""
    if isinstance(values, np.ndarray):
        return np.ascontiguousarray(values).reshape(-1)
    return [v if isinstance(v, str) else str(v, "utf-8") for v in values]


# --- binary ---
def from_binary(name: str, datatype: str, shape: tuple[int, ...], raw: memoryview) -> Tensor:
    """A tensor from its `binary_data_size` bytes of the body (not copied)."""
    if datatype == BYTES:
        return Tensor(name, datatype, shape, unpack_bytes(name, raw, math.prod(shape)))
    dtype = NUMERIC[datatype]
    need = math.prod(shape) * dtype.itemsize
    if len(raw) != need:
        raise InputInvalid(
            f"input '{name}': binary_data_size is {len(raw)} bytes; {datatype} × {list(shape)} "
            f"needs {need}"
        )
    return Tensor(name, datatype, shape, np.frombuffer(raw, dtype=dtype).reshape(shape))


def unpack_bytes(name: str, raw: memoryview, count: int) -> list[Element]:
    """`count` BYTES elements (4-byte little-endian length, then the bytes), which must fill
    `raw` exactly; each a slice of it."""
    out: list[Element] = []
    at, end = 0, len(raw)
    for i in range(count):
        if end - at < _LENGTH.size:
            raise InputInvalid(
                f"input '{name}': BYTES element {i} of {count} is truncated: its 4-byte length "
                f"starts at byte {at} of {end}"
            )
        (size,) = _LENGTH.unpack_from(raw, at)
        at += _LENGTH.size
        if size > end - at:
            raise InputInvalid(
                f"input '{name}': BYTES element {i} of {count} is truncated: it declares {size} "
                f"bytes, {end - at} remain"
            )
        out.append(raw[at : at + size])
        at += size
    if at != end:
        raise InputInvalid(
            f"input '{name}': {end - at} bytes are left over after its {count} BYTES elements "
            f"(binary_data_size {end})"
        )
    return out


def pack_bytes(values: Sequence[Element]) -> bytes:
    """BYTES elements in the binary encoding (str as UTF-8)."""
    parts: list[bytes | memoryview] = []
    for v in values:
        data = v.encode() if isinstance(v, str) else v
        parts += (_LENGTH.pack(len(data)), data)
    return b"".join(parts)


def to_binary(values: Values, datatype: str) -> bytes | memoryview:
    """The binary encoding of a tensor's values (a numeric array's bytes are not copied when
    already contiguous and of the datatype's dtype)."""
    if datatype == BYTES:
        return pack_bytes(values)  # type: ignore[arg-type]
    array = np.ascontiguousarray(values, dtype=NUMERIC[datatype])
    return array.data.cast("B") if array.size else b""  # no cast of a zero-size view
