"""The OIP tensor codec (pure): every datatype round-trips through JSON and binary data;
flat and nested JSON agree; malformed data is refused naming the tensor; binary tensors are
views of the body, not copies."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferq.api.protocols.oip.tensors import (
    BINARY_ONLY,
    BYTES,
    DATATYPES,
    NUMERIC,
    byte_size,
    check_datatype,
    check_shape,
    from_binary,
    from_json,
    pack_bytes,
    to_binary,
    to_json,
    unpack_bytes,
)
from inferq.shared.errors import InputInvalid

SAMPLES = {
    "BOOL": [True, False, True, True, False, False],
    "UINT8": [0, 1, 2, 127, 128, 255],
    "UINT16": [0, 1, 2, 3, 4, 65_535],
    "UINT32": [0, 1, 2, 3, 4, 2**32 - 1],
    "UINT64": [0, 1, 2, 3, 4, 2**64 - 1],
    "INT8": [-128, -1, 0, 1, 2, 127],
    "INT16": [-32_768, -1, 0, 1, 2, 32_767],
    "INT32": [-(2**31), -1, 0, 1, 2, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 1, 2, 2**63 - 1],
    "FP16": [-1.5, 0.0, 0.25, 1.0, 2.0, 65_504.0],
    "FP32": [-1.5, 0.0, 0.1, 1.0, 3.25, 1e30],
    "FP64": [-1.5, 0.0, 0.1, 1.0, 3.25, 1e300],
}
SHAPE = (2, 3)


def test_every_datatype_is_covered() -> None:
    assert set(SAMPLES) | {BYTES} == DATATYPES == set(NUMERIC) | {BYTES}


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_numeric_binary_round_trip(datatype: str) -> None:
    array = np.array(SAMPLES[datatype], dtype=NUMERIC[datatype]).reshape(SHAPE)
    raw = bytes(to_binary(array, datatype))
    assert raw == array.astype(NUMERIC[datatype].newbyteorder("<")).tobytes()  # little-endian
    assert len(raw) == byte_size(datatype, SHAPE)
    back = from_binary("x", datatype, SHAPE, memoryview(raw))
    assert back.values.dtype == NUMERIC[datatype] and back.shape == SHAPE
    np.testing.assert_array_equal(back.values, array)


@pytest.mark.parametrize("datatype", sorted(set(NUMERIC) - BINARY_ONLY))
def test_numeric_json_round_trip_flat_and_nested(datatype: str) -> None:
    array = np.array(SAMPLES[datatype], dtype=NUMERIC[datatype]).reshape(SHAPE)
    flat = to_json(array)
    assert isinstance(flat, np.ndarray) and flat.shape == (6,)
    for data in (flat.tolist(), array.tolist()):  # flat, row-major / nested as the shape
        back = from_json("x", datatype, SHAPE, data)
        assert back.values.dtype == NUMERIC[datatype]
        np.testing.assert_array_equal(back.values, array)


def test_fp16_travels_as_binary_only() -> None:
    with pytest.raises(InputInvalid, match="input 'h': FP16 travels as binary data only"):
        from_json("h", "FP16", (1,), [1.0])


def test_bytes_round_trip_binary_and_json() -> None:
    elements = [b"hello", b"", b"\xff\x00 not utf-8", "ünïcode".encode()]
    raw = pack_bytes(elements)
    assert raw[:9] == struct.pack("<I", 5) + b"hello"
    back = from_binary("t", BYTES, (2, 2), memoryview(raw))
    assert [bytes(v) for v in back.values] == elements
    assert bytes(to_binary(back.values, BYTES)) == raw
    texts = ["hello", "", "ünïcode"]
    assert from_json("t", BYTES, (3,), texts).values == texts
    assert from_json("t", BYTES, (3, 1), [[t] for t in texts]).values == texts
    assert to_json(texts) == texts
    assert pack_bytes(texts) == pack_bytes([t.encode() for t in texts])


def test_binary_tensors_are_views_of_the_body() -> None:
    body = bytearray(np.arange(6, dtype="<f4").tobytes() + pack_bytes([b"abc", b"de"]))
    view = memoryview(body)
    numbers = from_binary("n", "FP32", (2, 3), view[:24])
    strings = from_binary("s", BYTES, (2,), view[24:])
    body[0:4] = np.float32(7).tobytes()  # write through the body: the tensor sees it
    body[28:29] = b"X"
    assert numbers.values[0, 0] == 7
    assert bytes(strings.values[0]) == b"Xbc" and isinstance(strings.values[0], memoryview)


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "why"),
    [
        ("FP32", (2, 2), [1.0, 2.0, 3.0], r"data flat \(3 values\) does not match shape \[2, 2\]"),
        ("FP32", (4,), [[1.0, 2.0], [3.0, 4.0]], r"nested as \[2, 2\] \(4 values\) does not match"),
        ("FP32", (2, 2), [[1.0, 2.0], [3.0]], "not fit FP32"),  # ragged
        ("FP32", (1,), "1.0", "data must be a list, not str"),
        ("FP32", (1,), ["1.0"], "non-numeric values, not FP32"),
        ("FP32", (1,), [None], "non-numeric values"),
        ("FP32", (1,), [1e300], "out of range for FP32"),
        ("BOOL", (2,), [1, 0], "integer values, not BOOL"),
        ("INT8", (1,), [1.5], "floating-point values, not INT8"),
        ("INT8", (1,), [True], "boolean values, not INT8"),
        ("INT8", (2,), [1, 128], "out of range for INT8 .*128"),
        ("UINT8", (2,), [-1, 1], "out of range for UINT8 .*-1"),
        ("INT64", (1,), [2**64], "out of range for INT64"),
        ("UINT64", (1,), [2**70], "out of range for UINT64"),
        ("INT8", (1,), ["1"], "non-numeric values, not INT8"),
        ("FP32", (1,), ["abc"], "does not fit FP32"),
        ("INT32", (1,), [None], "does not fit INT32"),
        ("BYTES", (2,), ["a", 1], "BYTES element 1 is int; JSON BYTES are strings"),
        ("BYTES", (2,), [["a"], ["b", "c"]], "element 0 is list"),
        ("BYTES", (3,), ["a", "b"], r"data flat \(2 values\) does not match shape \[3\]"),
    ],
)
def test_bad_json_data_is_refused_naming_the_input(
    datatype: str, shape: tuple[int, ...], data: object, why: str
) -> None:
    with pytest.raises(InputInvalid, match=f"^input 'in0': .*{why}"):
        from_json("in0", datatype, shape, data)


def test_json_accepts_integers_for_floats_and_empty_tensors() -> None:
    assert from_json("x", "FP32", (2,), [1, 2]).values.tolist() == [1.0, 2.0]
    empty = from_json("x", "INT32", (0, 3), [])
    assert empty.values.shape == (0, 3) and empty.values.dtype == np.dtype("<i4")
    assert from_json("x", BYTES, (0,), []).values == []


@pytest.mark.parametrize(
    ("raw", "count", "why"),
    [
        (b"\x05\x00", 1, r"element 0 of 1 is truncated: its 4-byte length starts at byte 0 of 2"),
        (struct.pack("<I", 9) + b"abc", 1, "element 0 of 1 is truncated: it declares 9 bytes, 3"),
        (pack_bytes([b"a"]), 2, "element 1 of 2 is truncated"),
        (pack_bytes([b"a", b"b"]), 1, "5 bytes are left over after its 1 BYTES elements"),
    ],
)
def test_malformed_binary_bytes_are_refused_naming_the_input(
    raw: bytes, count: int, why: str
) -> None:
    with pytest.raises(InputInvalid, match=f"^input 'txt': BYTES {why}|^input 'txt': {why}"):
        unpack_bytes("txt", memoryview(raw), count)


def test_a_binary_size_that_does_not_fit_the_shape_is_refused() -> None:
    with pytest.raises(InputInvalid, match=r"input 'v': binary_data_size is 8 bytes; FP32 × \[3\]"):
        from_binary("v", "FP32", (3,), memoryview(bytes(8)))


@pytest.mark.parametrize(
    "shape",
    [None, "3", [3, -1], [1.0], [True], [1] * 9, [[1]]],
)
def test_shapes_must_be_lists_of_non_negative_ints(shape: object) -> None:
    with pytest.raises(InputInvalid, match=r"^input 's': shape .* non-negative integers"):
        check_shape("s", shape, 1 << 20)


def test_datatypes_are_the_protocols() -> None:
    assert check_shape("s", [0, 2], 8) == (0, 2) and check_shape("s", [], 8) == ()
    assert check_datatype("d", "FP32") == "FP32"
    for bad in ("fp32", "BF16", "STRING", None, 3):
        with pytest.raises(InputInvalid, match=r"^input 'd': datatype"):
            check_datatype("d", bad)


_numeric = st.sampled_from(sorted(NUMERIC))


@given(st.data())
def test_any_numeric_array_round_trips_through_binary(data: st.DataObject) -> None:
    datatype = data.draw(_numeric)
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    array = data.draw(hnp.arrays(NUMERIC[datatype], shape))
    back = from_binary("x", datatype, shape, memoryview(bytes(to_binary(array, datatype))))
    np.testing.assert_array_equal(back.values, array)  # NaN equals NaN here


@given(st.lists(st.binary(max_size=12), max_size=8))
def test_any_bytes_elements_round_trip(elements: list[bytes]) -> None:
    back = unpack_bytes("b", memoryview(pack_bytes(elements)), len(elements))
    assert [bytes(v) for v in back] == elements
