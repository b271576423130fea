"""`minilm-null`: minilm's real tokenizer and output shape, no compute; and `Tokenized`'s
batched prepare, which the worker uses for minilm on torch and ONNX Runtime alike."""

from __future__ import annotations

import numpy as np
import pytest

from inferq.shared.settings import Settings
from inferq.worker.models.base import Input, InputKind, InvalidInput, PreparesMany
from inferq.worker.models.minilm_null import MiniLMNull
from inferq.worker.models.registry import build_model

TEXTS = ["hello world", "", "a much longer sentence, with punctuation; and more words", "x"]


@pytest.fixture(scope="module")
def model() -> MiniLMNull:
    m = MiniLMNull()
    m.load("cpu")
    return m


def _inputs(*texts: str) -> list[Input]:
    return [Input(InputKind.TEXT, t) for t in texts]


def test_prepare_many_gives_what_one_prepare_per_job_gives(model: MiniLMNull) -> None:
    jobs = [(_inputs(*TEXTS[:2]), {}), (_inputs(TEXTS[2]), {}), (_inputs(*TEXTS[::-1]), {})]
    many = model.prepare_many(jobs)
    one_by_one = [model.prepare(inputs, params) for inputs, params in jobs]
    assert [[p.cost for p in job] for job in many] == [[p.cost for p in j] for j in one_by_one]
    for got, want in zip(many, one_by_one, strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.payload.dtype == np.int64 and np.array_equal(g.payload, w.payload)
    assert isinstance(model, PreparesMany)


def test_a_job_with_parameters_is_refused_by_name(model: MiniLMNull) -> None:
    with pytest.raises(InvalidInput, match="unknown parameters"):
        model.prepare_many([(_inputs("a"), {}), (_inputs("b"), {"top_k": 3})])


def test_it_answers_minilms_shape_with_a_vector_that_names_the_input(model: MiniLMNull) -> None:
    items = model.prepare(_inputs(*TEXTS), {})
    out = model.run([p.payload for p in items])
    assert out.shape == (len(TEXTS), 384) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert list(out.argmax(axis=1)) == [p.cost % 384 for p in items]


def test_the_registry_builds_it_by_name() -> None:
    settings = Settings(_env_file=None, model="minilm-null")  # type: ignore[call-arg]
    assert isinstance(build_model(settings.default_model, settings), MiniLMNull)


def test_the_ids_are_what_the_full_encoding_gives(model: MiniLMNull) -> None:
    """`encode` skips the offsets (`encode_batch_fast`) and makes plain ASCII from its
    pieces' remembered ids (`TextTokenizer`); the ids must be the full encoding's by the
    tokenizer as loaded, truncation and accents included."""
    from inferq.bench import corpus

    long = " ".join(["tokenization"] * 2 * model.max_cost)
    texts = [*TEXTS, "Crème brûlée, 東京, emoji 🙂", long, *corpus.load("short")[:200]]
    tokenizer = model._tokenizer
    assert tokenizer is not None
    want = [e.ids for e in tokenizer.tokenizer.encode_batch(texts)]
    got = model.encode_texts(texts)
    assert [list(p.payload) for p in got] == want
    assert [p.cost for p in got] == [len(w) for w in want]
    assert max(p.cost for p in got) == model.max_cost  # the long text was truncated
