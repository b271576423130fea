"""`core.vectors`: Matryoshka truncation and the compact encodings, bit for bit as
docs/api.md states them."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferq.api.protocols import vectors

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)
matrices = hnp.arrays(
    np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40), elements=finite
)


def test_truncate_keeps_the_head_and_renormalises() -> None:
    v = np.array([[3.0, 4.0, 12.0, 0.0], [0.0, 0.0, 1.0, 1.0]], dtype=np.float32)
    got = vectors.truncate(v, 2)
    np.testing.assert_allclose(got, [[0.6, 0.8], [0.0, 0.0]])  # a zero head stays zero
    assert got.dtype == np.float32 and got.shape == (2, 2)
    np.testing.assert_allclose(vectors.truncate(v, 4)[0], v[0] / 13.0, rtol=1e-6)


@settings(max_examples=200, deadline=None)
@given(matrices, st.integers(1, 40))
def test_truncated_rows_have_unit_norm_or_are_zero(v: np.ndarray, n: int) -> None:
    got = vectors.truncate(v, n)
    norms = np.linalg.norm(got, axis=1)
    head_zero = ~np.any(v[:, :n], axis=1)
    np.testing.assert_allclose(norms[~head_zero], 1.0, rtol=1e-4)
    assert not got[head_zero].any()


def test_int8_scale_rule() -> None:
    v = np.array([[0.5, -0.25, 0.1, 0.0], [-2.0, 1.0, 0.0, 0.5], [0, 0, 0, 0]], dtype=np.float32)
    got = vectors.to_int8(v)
    assert got.dtype == np.int8
    # q = rint(127 · x / max|x|), per row: the largest magnitude becomes ±127.
    assert got.tolist() == [[127, -64, 25, 0], [-127, 64, 0, 32], [0, 0, 0, 0]]
    assert vectors.to_uint8(v).tolist() == [[255, 64, 153, 128], [1, 192, 128, 160], [128] * 4]
    assert vectors.to_uint8(v).dtype == np.uint8


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_int8_stays_in_range_and_keeps_signs(v: np.ndarray) -> None:
    q = vectors.to_int8(v)
    assert q.min() >= -127 and q.max() <= 127
    nonzero = np.abs(v).max(axis=1) > 0
    assert (np.abs(q[nonzero]).max(axis=1) == 127).all()
    assert (np.sign(q) * np.sign(v) >= 0).all()  # rounding may reach 0, never flip a sign
    np.testing.assert_array_equal(vectors.to_uint8(v).astype(np.int16) - 128, q)


def test_bits_pack_big_endian_eight_to_a_value() -> None:
    # Components > 0 are 1 bits, first component in the highest bit of the first value.
    v = np.array([[1, -1, 0, 2, -3, 4, 0.1, -0.1, 5, 0, 0, 0, 0, 0, 0, -1]], dtype=np.float32)
    bits = "10010110" + "10000000"
    assert vectors.to_ubinary(v).tolist() == [[int(bits[:8], 2), int(bits[8:], 2)]]
    assert vectors.to_ubinary(v).tolist() == [[150, 128]]
    assert vectors.to_binary(v).tolist() == [[150 - 128, 0]]  # ubinary − 128, as int8
    assert vectors.to_binary(v).dtype == np.int8 and vectors.to_ubinary(v).dtype == np.uint8


def test_a_384_wide_vector_packs_to_48_values_and_a_short_tail_is_zero_padded() -> None:
    rng = np.random.default_rng(0)
    assert vectors.to_ubinary(rng.normal(size=(3, 384))).shape == (3, 48)
    assert vectors.to_binary(rng.normal(size=(3, 384))).shape == (3, 48)
    assert vectors.to_ubinary(np.ones((1, 10))).tolist() == [[255, 0b11000000]]


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_unpacking_gives_the_sign_bits_back(v: np.ndarray) -> None:
    width = v.shape[1]
    bits = np.unpackbits(vectors.to_ubinary(v), axis=1)[:, :width]
    np.testing.assert_array_equal(bits, (v > 0).astype(np.uint8))
    signed = vectors.to_binary(v).astype(np.int16) + 128
    np.testing.assert_array_equal(signed, vectors.to_ubinary(v))


@pytest.mark.parametrize("fmt", vectors.FORMATS)
def test_encode_gives_one_value_per_row(fmt: str) -> None:
    v = np.array([[0.5, -0.5, 0.25, 1.0], [1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    rows = vectors.encode(v, fmt)
    assert len(rows) == 2
    if fmt == "base64":
        assert all(isinstance(r, str) for r in rows)
        back = np.frombuffer(base64.b64decode(rows[1]), dtype="<f4")
        np.testing.assert_array_equal(back, v[1])
    else:
        assert all(isinstance(r, np.ndarray) for r in rows)
        expected = {"float": v, "int8": vectors.to_int8(v), "uint8": vectors.to_uint8(v)}
        expected |= {"binary": vectors.to_binary(v), "ubinary": vectors.to_ubinary(v)}
        np.testing.assert_array_equal(np.stack(rows), expected[fmt])  # type: ignore[arg-type]
