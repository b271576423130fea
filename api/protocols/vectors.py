"""Smaller embedding vectors, per request: Matryoshka truncation and the compact encodings of
`/v1/embeddings` (`encoding_format`). Pure numpy, no HTTP: the endpoint
(`inferq.api.protocols.embeddings`), its batch lines and the recall benchmark
(`inferq.bench.recall`) all use these very functions.

Order: `truncate` first (when `dimensions` asks for it), then one encoding.

- `float`: the float32 vector. `base64`: its little-endian float32 bytes in base64.
- `int8`: **a per-vector scale**: q = rint(127 · x / max|x|), so each vector's largest
  component is ±127 and every value lies in [-127, 127] (a zero vector stays zero). The scale
  differs from vector to vector and is not sent: rank int8 vectors by **cosine** (which the
  scale does not change), not by raw dot products between them.
- `uint8`: the same q + 128, in [1, 255] (subtract 128 before a cosine).
- `ubinary`: one sign bit per component (1 where the component is > 0, else 0), packed 8 to
  a byte, first component in the highest bit (`numpy.packbits`, big-endian bit order), as
  uint8 values; d dimensions give ceil(d / 8) values, the last one zero-padded. Rank by
  Hamming distance.
- `binary`: those bytes minus 128, as int8 values (the convention of sentence-transformers,
  Cohere and vLLM: the top bit flipped, so Hamming distances are the same as `ubinary`'s).
"""

from __future__ import annotations

import base64

import numpy as np

FORMATS = ("float", "base64", "int8", "uint8", "binary", "ubinary")


def truncate(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` components of each row, rescaled to unit L2 norm (a zero row
    stays zero): what a Matryoshka-trained model's shorter vector is."""
    # float64: squares of tiny float32 components would underflow to a zero norm.
    head = np.asarray(vectors, dtype=np.float64)[:, :dimensions]
    norms = np.linalg.norm(head, axis=1, keepdims=True)
    return (head / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def to_int8(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled by its own largest magnitude to [-127, 127] and rounded (module doc)."""
    x = np.asarray(vectors, dtype=np.float64)  # no float32 rounding near the ±127.5 edges
    peak = np.abs(x).max(axis=1, keepdims=True)
    scaled = 127.0 * x / np.where(peak > 0, peak, 1.0)
    # The clip only guards float rounding at the peak; |scaled| <= 127 by construction.
    return np.clip(np.rint(scaled), -127, 127).astype(np.int8)


def to_uint8(vectors: np.ndarray) -> np.ndarray:
    return (to_int8(vectors).astype(np.int16) + 128).astype(np.uint8)


def to_ubinary(vectors: np.ndarray) -> np.ndarray:
    """Sign bits (component > 0), packed 8 per uint8, first component in the highest bit."""
    return np.packbits(np.asarray(vectors) > 0, axis=1)


def to_binary(vectors: np.ndarray) -> np.ndarray:
    return (to_ubinary(vectors).astype(np.int16) - 128).astype(np.int8)


def _base64_rows(vectors: np.ndarray) -> list[str]:
    little = np.ascontiguousarray(vectors, dtype="<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]


_ENCODERS = {"int8": to_int8, "uint8": to_uint8, "binary": to_binary, "ubinary": to_ubinary}


def encode(vectors: np.ndarray, fmt: str) -> list[np.ndarray] | list[str]:
    """One value per row in `fmt` (one of `FORMATS`): numpy rows, which orjson writes as JSON
    numbers without a Python list in between, or base64 strings."""
    if fmt == "base64":
        return _base64_rows(vectors)
    if fmt == "float":
        return list(vectors)
    return list(_ENCODERS[fmt](vectors))
