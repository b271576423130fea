"""The API's msgpack answers, read without the msgpack package (the client depends on httpx
and numpy only: `tests/unit/client/test_layout.py`).

`unpackb` decodes the msgpack format (nil, booleans, integers, floats, strings, bin, arrays,
maps; no ext types, which the API never sends). What it is fed is one small record whose
bulk is a few bin values, so pure Python costs little: each bin is one slice, never a loop.
`array` turns a packed array `{"dtype", "shape", "data"}` back into a numpy array.

Errors: `ValueError` for bytes that are not such msgpack (the caller wraps it in its own
`InvalidResponse`).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

# Nesting a job record never comes near; past it the bytes are refused, not recursed into.
MAX_DEPTH = 64

# Fixed-size values: first byte → (struct format, size).
_FIXED = {
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}
# Length-prefixed values: first byte → (kind, width of the length in bytes).
_SIZED = {
    0xC4: ("bin", 1),
    0xC5: ("bin", 2),
    0xC6: ("bin", 4),
    0xD9: ("str", 1),
    0xDA: ("str", 2),
    0xDB: ("str", 4),
    0xDC: ("array", 2),
    0xDD: ("array", 4),
    0xDE: ("map", 2),
    0xDF: ("map", 4),
}
_CONSTANTS = {0xC0: None, 0xC2: False, 0xC3: True}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise ValueError(f"msgpack truncated: {n} bytes wanted at offset {self.at}")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"msgpack nested deeper than {MAX_DEPTH}")
        first = self.take(1)[0]
        if first <= 0x7F:
            return first
        if first >= 0xE0:
            return first - 0x100
        if first <= 0xBF:
            return self.fixed_size(first, depth)
        if first in _CONSTANTS:
            return _CONSTANTS[first]
        if first in _FIXED:
            fmt, size = _FIXED[first]
            return struct.unpack(fmt, self.take(size))[0]
        if first in _SIZED:
            return self.sized(first, depth)
        raise ValueError(f"msgpack type byte 0x{first:02x} is not supported (ext types)")

    def fixed_size(self, first: int, depth: int) -> Any:
        # 0x80-0xBF: a map, an array or a string whose length sits in the type byte.
        if first <= 0x8F:
            return self.map(first & 0x0F, depth)
        if first <= 0x9F:
            return self.array(first & 0x0F, depth)
        return self.str(first & 0x1F)

    def sized(self, first: int, depth: int) -> Any:
        kind, width = _SIZED[first]
        n = int.from_bytes(self.take(width), "big")
        if kind == "bin":
            return self.take(n)
        if kind == "str":
            return self.str(n)
        return self.array(n, depth) if kind == "array" else self.map(n, depth)

    def str(self, n: int) -> str:
        return self.take(n).decode("utf-8")

    def array(self, n: int, depth: int) -> list[Any]:
        return [self.value(depth + 1) for _ in range(n)]

    def map(self, n: int, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            out[key] = self.value(depth + 1)
        return out


def unpackb(data: bytes) -> Any:
    """The one msgpack value in `data`; ValueError if that is not all `data` holds."""
    reader = _Reader(data)
    try:
        value = reader.value()
    except (struct.error, UnicodeDecodeError, TypeError) as e:
        raise ValueError(f"not msgpack: {e}") from e
    if reader.at != len(data):
        raise ValueError(f"msgpack: {len(data) - reader.at} bytes left after the value")
    return value


def is_array(value: Any) -> bool:
    """Whether `value` is a packed array as the API sends one."""
    return (
        isinstance(value, dict)
        and set(value) == {"dtype", "shape", "data"}
        and isinstance(value["data"], bytes)
    )


def array(value: dict[str, Any]) -> np.ndarray:
    """A packed array `{"dtype", "shape", "data"}` (little-endian bytes) as a numpy array in
    the machine's byte order; ValueError if the parts do not fit together."""
    try:
        dtype = np.dtype(value["dtype"]).newbyteorder("<")
        flat = np.frombuffer(value["data"], dtype=dtype)
        return flat.reshape([int(n) for n in value["shape"]]).astype(dtype.newbyteorder("="))
    except (TypeError, KeyError) as e:
        raise ValueError(f"not a packed array: {e!r}") from e
