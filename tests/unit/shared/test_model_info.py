"""`ModelInfo` in Redis: the Matryoshka sizes round-trip, and a record written before the
field existed still reads (as a model that declares none)."""

from __future__ import annotations

import pytest

from inferq.shared.registry import ModelInfo


def test_matryoshka_sizes_round_trip_sorted() -> None:
    info = ModelInfo(("text",), "vector", {}, 256, "v1", matryoshka_dims=(768, 64, 256, 64))
    assert info.matryoshka_dims == (64, 256, 768)
    stored = info.to_hash()
    assert stored["matryoshka_dims"] == "64,256,768"
    assert ModelInfo.from_hash({k.encode(): v.encode() for k, v in stored.items()}) == info


def test_an_older_record_reads_as_declaring_none() -> None:
    old = {b"version": b"v", b"inputs": b"text", b"output": b"vector", b"parameters": b"{}"}
    info = ModelInfo.from_hash(old)
    assert info is not None and info.matryoshka_dims == ()
    assert ModelInfo(("text",), "vector", {}).to_hash()["matryoshka_dims"] == ""
    junk = ModelInfo.from_hash(old | {b"matryoshka_dims": b"64,x,,0,-3,128"})
    assert junk is not None and junk.matryoshka_dims == (64, 128)  # what is readable of it


@pytest.mark.parametrize("bad", [(0,), (-8,), (1.5,), (True,), ("64",)])
def test_a_bad_declaration_is_refused_naming_it(bad: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="matryoshka_dims"):
        ModelInfo(("text",), "vector", {}, matryoshka_dims=bad)  # type: ignore[arg-type]
