"""MiniLM against the bundled all-MiniLM-L6-v2 weights, on CPU."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from inferq.worker.models.base import Model
from inferq.worker.models.minilm import MiniLM

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 words
MIXED = [
    "Hello.",
    "A man is playing a guitar.",
    "The committee will meet again next week to discuss the budget for the new library.",
    " ".join(["Sentences of moderate length keep the batch from being too uniform."] * 6),
    LONG,
]


@pytest.fixture(scope="module")
def model() -> MiniLM:
    m = MiniLM()
    m.load("cpu")
    return m


def embed(model: MiniLM, texts: Sequence[str]) -> np.ndarray:
    return model.run([p.payload for p in model.prepare_texts(list(texts))])


def test_protocol_and_shape(model: MiniLM) -> None:
    assert isinstance(model, Model)
    assert model.dim == 384
    assert model.max_cost == 256
    out = embed(model, ["one", "two", "three"])
    assert out.shape == (3, 384)
    assert out.dtype == np.float32


def test_unit_norm(model: MiniLM) -> None:
    out = embed(model, MIXED)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_paraphrase_closer_than_unrelated(model: MiniLM) -> None:
    a, b, c = embed(
        model,
        [
            "A man is playing a guitar.",
            "Someone plays the guitar.",
            "The stock market fell sharply today.",
        ],
    )
    assert float(a @ b) > float(a @ c) + 0.2


def test_batch_equals_one_by_one(model: MiniLM) -> None:
    batched = embed(model, MIXED)
    single = np.stack([embed(model, [t])[0] for t in MIXED])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_truncation_and_costs(model: MiniLM) -> None:
    items = model.prepare_texts(["", "hi", LONG, "hi there"])
    assert [p.cost for p in items] == [2, 3, 256, 4]
    assert all(p.cost == len(p.payload) for p in items)
    # One item per input, in order: each payload matches preparing its input alone.
    for text, item in zip(["", "hi", LONG, "hi there"], items, strict=True):
        assert list(model.prepare_texts([text])[0].payload) == list(item.payload)


def test_empty_batch(model: MiniLM) -> None:
    assert model.run([]).shape == (0, 384)


def test_missing_files_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        MiniLM(str(tmp_path))


def test_float16_refused_on_cpu() -> None:
    with pytest.raises(ValueError, match="cuda"):
        MiniLM(dtype="float16").load("cpu")


def test_matches_transformers_pipeline(model: MiniLM) -> None:
    from transformers import AutoModel, AutoTokenizer

    texts = [MIXED[1], MIXED[2], LONG]
    tok = AutoTokenizer.from_pretrained(str(model.path), local_files_only=True)
    ref = AutoModel.from_pretrained(str(model.path), local_files_only=True).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = ref(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.normalize(pooled, dim=1).numpy()
    np.testing.assert_allclose(embed(model, texts), expected, atol=1e-5)


def test_traced_by_default_and_equal_to_eager(model: MiniLM) -> None:
    assert model.traced
    eager = MiniLM(torchscript=False)
    eager.load("cpu")
    assert not eager.traced
    # New shapes after the trace: one item (no padding), and a padded batch up to 256 tokens.
    for texts in ([MIXED[0]], MIXED):
        np.testing.assert_allclose(embed(model, texts), embed(eager, texts), atol=1e-5)


def test_trace_failure_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot trace this")

    monkeypatch.setattr(torch.jit, "trace", broken)
    m = MiniLM()
    m.load("cpu")
    assert not m.traced
    assert embed(m, MIXED[:2]).shape == (2, 384)


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "DefaultCPUAllocator: can't allocate memory",
    ],
)
def test_out_of_memory_from_a_traced_graph_is_an_oom(
    model: MiniLM, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    """A TorchScript graph may re-raise an allocator failure as a plain RuntimeError: the
    worker must still see an OOM (lower the ceiling, split), not a model error."""
    from inferq.worker.models.base import DeviceOutOfMemory

    def failing(text: str) -> object:
        def run(*args: object) -> None:
            raise RuntimeError(text)

        return run

    monkeypatch.setattr(model, "_model", failing(message))
    with pytest.raises(DeviceOutOfMemory):
        embed(model, ["hello"])
    monkeypatch.setattr(model, "_model", failing("shape mismatch"))  # any other error stays one
    with pytest.raises(RuntimeError, match="shape mismatch"):
        embed(model, ["hello"])


def test_float16_weights_give_float32s_vectors_on_the_bench_corpora(model: MiniLM) -> None:
    """Why `INFERQ_DTYPE=auto` is float16 on CUDA: the same weights in float16 give vectors at
    cosine ≥ 0.9999 against float32 on both bench corpora. Run on the CPU here (CI has no
    GPU; the CPU's half kernels accumulate in float32 as cuBLAS's do), through the loader the
    worker uses, since MiniLM.load keeps float16 to CUDA."""
    from inferq.bench import corpus
    from inferq.worker.models.minilm import _embedder, _load_on_device

    texts = corpus.load("short")[:24] + corpus.load("mixed")[:8] + MIXED
    items = [p.payload for p in model.prepare_texts(texts)]
    ref = np.concatenate([model.run(items[i : i + 8]) for i in range(0, len(items), 8)])
    encoder = _load_on_device(model.path, torch.float16, torch.device("cpu"))
    assert encoder is not None
    half = MiniLM(torchscript=False)
    half._tokenizer, half._pad_id, half._device = model._tokenizer, model._pad_id, model._device
    half._model = _embedder(encoder).eval()
    assert next(half._model.parameters()).dtype == torch.float16
    out = np.concatenate([half.run(items[i : i + 8]) for i in range(0, len(items), 8)])
    cosine = (out * ref).sum(axis=1) / np.linalg.norm(out, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() >= 0.9999, f"float16 drifts: min cosine {cosine.min():.6f}"
    assert not np.array_equal(out, ref)  # it did run in float16
