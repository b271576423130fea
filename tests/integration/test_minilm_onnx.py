"""The ONNX Runtime backend agrees with the torch one, and exports only once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferq.worker.models.base import DeviceOutOfMemory, Model
from inferq.worker.models.minilm import MiniLM
from inferq.worker.models.minilm_onnx import MiniLMOnnx

TEXTS = [
    "Hello.",
    "A man is playing a guitar.",
    "Someone plays the guitar.",
    "The stock market fell sharply today.",
    "The committee will meet again next week to discuss the budget for the new library.",
    "¿Dónde está la biblioteca?",
    "x",
    " ".join(["Sentences of moderate length keep the batch from being too uniform."] * 6),
    " ".join(["the quick brown fox jumps over the lazy dog"] * 40),  # truncated at 256
    "Numbers like 3.14159 and 2,718 tokenize into several pieces.",
]


def embed(model: MiniLM | MiniLMOnnx, texts: list[str]) -> np.ndarray:
    return model.run([p.payload for p in model.prepare_texts(texts)])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    m = MiniLM()
    m.load("cpu")
    return embed(m, TEXTS)


@pytest.fixture(scope="module")
def fp32(cache: Path) -> MiniLMOnnx:
    m = MiniLMOnnx(None, "fp32", cache_dir=cache)
    m.load("cpu")
    return m


def test_protocol_and_provider(fp32: MiniLMOnnx) -> None:
    assert isinstance(fp32, Model)
    assert (fp32.dim, fp32.max_cost) == (384, 256)
    assert fp32.provider == "CPUExecutionProvider"
    assert fp32.exported and fp32.onnx_path is not None
    assert fp32.onnx_path.parent == Path(fp32.cache_dir)
    assert fp32.onnx_path.name.endswith("-fp32.onnx")
    assert not list(Path(fp32.cache_dir).glob("*.tmp"))  # nothing half-written left behind
    assert fp32.run([]).shape == (0, 384)


def test_fp32_matches_torch(fp32: MiniLMOnnx, reference: np.ndarray) -> None:
    out = embed(fp32, TEXTS)
    assert out.shape == (len(TEXTS), 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    cosine = (out * reference).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine


def test_fp32_batch_equals_one_by_one(fp32: MiniLMOnnx) -> None:
    batched = embed(fp32, TEXTS)
    single = np.stack([embed(fp32, [t])[0] for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_cache_is_reused(fp32: MiniLMOnnx, cache: Path) -> None:
    assert fp32.onnx_path is not None
    mtime = fp32.onnx_path.stat().st_mtime_ns
    again = MiniLMOnnx(None, "fp32", cache_dir=cache)
    again.load("cpu")
    assert not again.exported and again.onnx_path == fp32.onnx_path
    assert fp32.onnx_path.stat().st_mtime_ns == mtime


def test_int8_close_to_torch(cache: Path, reference: np.ndarray, fp32: MiniLMOnnx) -> None:
    int8 = MiniLMOnnx(None, "int8", cache_dir=cache)
    int8.load("cpu")
    assert (
        int8.exported and int8.onnx_path is not None and int8.onnx_path.name.endswith("-int8.onnx")
    )
    assert int8.onnx_path.stat().st_size < fp32.onnx_path.stat().st_size  # type: ignore[union-attr]
    # Smaller, not a quarter: only MatMul weights are int8; the 47 MB word embeddings stay fp32.
    cosine = (embed(int8, TEXTS) * reference).sum(axis=1)
    print(f"int8 cosine vs torch fp32: min {cosine.min():.4f} mean {cosine.mean():.4f}")
    # Dynamic int8 costs most on very short inputs ("Hello.": ~0.985); see quantize_int8.
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.98, cosine


def test_ort_allocation_failure_is_device_oom(fp32: MiniLMOnnx) -> None:
    class Failing:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def run(self, *args: object) -> None:
            raise self.exc

    payload = fp32.prepare_texts(["hi"])[0].payload
    real = fp32._session
    try:
        for exc in (
            RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory"),
            RuntimeError("CUDA failure 2: out of memory ; GPU=0"),
            MemoryError(),
        ):
            fp32._session = Failing(exc)  # type: ignore[assignment]
            with pytest.raises(DeviceOutOfMemory):
                fp32.run([payload])
        fp32._session = Failing(RuntimeError("shape mismatch"))  # type: ignore[assignment]
        with pytest.raises(RuntimeError, match="shape mismatch"):
            fp32.run([payload])
    finally:
        fp32._session = real


def test_bad_variant() -> None:
    with pytest.raises(ValueError, match="variant"):
        MiniLMOnnx(None, "int4", cache_dir="/nonexistent")
