"""What the result cache keys on: everything that decides the outputs, nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from inferq.api.core.cache import cache_key
from inferq.shared.jobs import Job
from inferq.worker.models.base import model_version
from inferq.worker.models.echo import EchoModel


def _job(**kw: object) -> Job:
    base: dict[str, object] = {"id": "x", "model": "m", "inputs": ["a", {"image": b"\x00"}]}
    return Job(**(base | kw))  # type: ignore[arg-type]


def test_equal_requests_share_a_key_whatever_the_parameter_order() -> None:
    a = _job(parameters={"top_k": 3, "nested": {"b": 1, "a": [1, {"y": 2, "x": 1}]}})
    b = _job(id="y", parameters={"nested": {"a": [1, {"x": 1, "y": 2}], "b": 1}, "top_k": 3})
    assert cache_key(a, "v1", shared=False) == cache_key(b, "v1", shared=False)


def test_anything_that_changes_the_outputs_changes_the_key() -> None:
    base = cache_key(_job(), "v1", shared=False)
    others = [
        cache_key(_job(), "v2", shared=False),
        cache_key(_job(model="n"), "v1", shared=False),
        cache_key(_job(inputs=["a"]), "v1", shared=False),
        cache_key(_job(inputs=[{"image": b"\x00"}, "a"]), "v1", shared=False),
        cache_key(_job(parameters={"top_k": 3}), "v1", shared=False),
        cache_key(_job(tenant="other"), "v1", shared=False),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_tenants_share_keys_only_when_shared() -> None:
    a, b = _job(tenant="a"), _job(tenant="b")
    assert cache_key(a, "v", shared=False) != cache_key(b, "v", shared=False)
    assert cache_key(a, "v", shared=True) == cache_key(b, "v", shared=True)


class _Declared(EchoModel):
    version = "weights-2026-12"


class _OnDisk(EchoModel):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


def test_model_version_follows_declared_versions_and_files_on_disk(tmp_path: Path) -> None:
    assert model_version(_Declared(), "m") == model_version(_Declared(), "m")
    assert model_version(_Declared(), "m") != model_version(_Declared(), "m", "onnx")
    (tmp_path / "w.bin").write_bytes(b"one")
    before = model_version(_OnDisk(tmp_path), "m")
    assert model_version(_OnDisk(tmp_path), "m") == before
    (tmp_path / "w.bin").write_bytes(b"two!")  # new weights: other size
    assert model_version(_OnDisk(tmp_path), "m") != before
    st = (tmp_path / "w.bin").stat()
    again = model_version(_OnDisk(tmp_path), "m")
    os.utime(tmp_path / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, touched
    assert model_version(_OnDisk(tmp_path), "m") != again
