"""The compiled decoder and the documented models agree: on generated bodies, valid and not,
`core.decode` accepts exactly what the strict pydantic models accept (and what the OpenAPI
document therefore says), with the same values."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from inferq.api.core.decode import ImageItem, InvalidBody, TensorItem
from inferq.api.core.schemas import InferRequest, SubmitRequest
from inferq.api.protocols.embeddings import EmbeddingsRequest, embeddings_body
from inferq.api.protocols.v1 import job_body
from inferq.api.protocols.vectors import FORMATS

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 100_000),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=100_000),
    st.sampled_from(["", "a", "high", "low", "normal", "HIGH", "1.5", "float", "base64", "aGk="]),
)
tensors = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.one_of(st.sampled_from(["float32", "int8"]), scalars),
        "shape": st.one_of(st.lists(st.one_of(st.integers(0, 4), scalars), max_size=3), scalars),
        "data": st.one_of(st.just("AAAA"), st.lists(st.integers(0, 3), max_size=3), scalars),
        "extra": scalars,
    },
)
items = st.one_of(
    st.text(max_size=5),
    st.fixed_dictionaries({"image": st.one_of(st.just("aGk="), scalars)}),
    st.fixed_dictionaries({"tensor": st.one_of(tensors, scalars)}),
    st.fixed_dictionaries({"image": st.just("aGk="), "x": scalars}),
    scalars,
)
webhooks = st.one_of(
    st.none(),
    st.fixed_dictionaries({"url": st.one_of(st.just("http://x.example/h"), scalars)}),
    st.fixed_dictionaries({"url": st.just("http://x.example"), "y": scalars}),
    st.fixed_dictionaries({"url": st.just("h" * 2049)}),
    scalars,
)
valid_items = st.one_of(
    st.text(max_size=5),
    st.just({"image": "aGk="}),
    st.just({"tensor": {"dtype": "float32", "shape": [1], "data": "AAAA"}}),
    st.just({"tensor": {"dtype": "int8", "shape": [2, 1], "data": [[1], [2]]}}),
)
valid_fields = {
    "model": st.one_of(st.none(), st.text(max_size=3)),
    "priority": st.sampled_from(["high", "normal", "low"]),
    "timeout_s": st.one_of(
        st.none(), st.floats(min_value=0.001, max_value=86_400), st.integers(1, 86_400)
    ),
    "parameters": st.dictionaries(st.text(max_size=3), scalars, max_size=2),
    "webhook": st.one_of(st.none(), st.just({"url": "http://x.example/h"})),
    "wait": st.one_of(st.none(), st.floats(min_value=0, max_value=100), st.integers(0, 100)),
    "metadata": st.one_of(
        st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3)
    ),
    "result_ttl_s": st.one_of(st.none(), st.integers(1, 10**7)),
}
wild = st.one_of(
    scalars,
    items,
    webhooks,
    st.just(0),
    st.just(-0.0),
    st.just(86_400),
    st.just(86_400.5),
    st.lists(items, max_size=2),
    st.dictionaries(st.text(max_size=2), scalars, max_size=2),
)


# Per field, the values at its boundary: where a decoder and a model would disagree.
edges: dict[str, st.SearchStrategy[Any]] = {
    "timeout_s": st.sampled_from([0, 0.0, -1, 1e-9, 86_400, 86_400.0, 86_400.001, "1", True, None]),
    "wait": st.sampled_from([0, -0.0, -0.5, 1e9, "2", False, None]),
    "priority": st.sampled_from(["HIGH", "", 1, None, "low"]),
    "model": st.sampled_from([1, None, "", ["m"]]),
    "parameters": st.sampled_from([None, [], "x", {}, {"a": None}]),
    "webhook": st.sampled_from([None, {}, {"url": None}, {"url": 1}, {"url": "h" * 2048}]),
    "input": st.sampled_from([None, [], "", {"image": 1}, {"tensor": None}, {"tensor": {}}]),
    "inputs": st.sampled_from([None, [], "a", [None], [""], ["a", {"image": "x"}]]),
    "unknown": st.sampled_from([None, 1]),
    "metadata": st.sampled_from(
        [
            None,
            {},
            [],
            "x",
            {"a": 1},
            {"a": None},
            {"k" * 64: "v"},
            {"k" * 65: "v"},
            {"a": "v" * 512},
            {"a": "v" * 513},
            {f"k{i}": "v" for i in range(16)},
            {f"k{i}": "v" for i in range(17)},
        ]
    ),
    "result_ttl_s": st.sampled_from([0, -1, 1, 1.0, True, "5", None, 2**40]),
}


@st.composite
def job_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid bodies with one or two fields made wild: the boundary is where a
    decoder and a model would disagree, and a fully random body is almost never valid."""
    body: dict[str, Any] = (
        {"input": draw(valid_items)}
        if draw(st.booleans())
        else {"inputs": draw(st.lists(valid_items, min_size=1, max_size=3))}
    )
    for name, values in valid_fields.items():
        if draw(st.booleans()):
            body[name] = draw(values)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(edges)))
        if draw(st.integers(0, 4)) == 0:
            body.pop(name, None)
        else:
            body[name] = draw(st.one_of(edges[name], wild))
    return body


def _plain(item: Any) -> Any:
    if isinstance(item, ImageItem):
        return {"image": item.image}
    if isinstance(item, TensorItem):
        t = item.tensor
        return {"tensor": {"dtype": t.dtype, "shape": t.shape, "data": t.data}}
    return item


@settings(max_examples=1000, deadline=None)
@given(job_bodies(), st.booleans())
def test_the_job_decoder_accepts_what_the_models_accept(body: dict[str, Any], infer: bool) -> None:
    raw = orjson.dumps(body)
    model = InferRequest if infer else SubmitRequest
    try:
        expected: SubmitRequest | None = model.model_validate_json(raw)
    except ValidationError:
        expected = None
    try:
        got = job_body(raw, infer=infer)
    except InvalidBody:
        assert expected is None, f"refused what the model accepts: {body}"
        return
    assert expected is not None, f"accepted what the model refuses: {body}"
    assert [_plain(i) for i in got.items] == [_plain(i) for i in expected.items()]
    assert (got.model, got.priority, got.timeout_s, got.parameters) == (
        expected.model,
        expected.priority,
        expected.timeout_s,
        expected.parameters,
    )
    assert got.webhook == (expected.webhook.url if expected.webhook else None)
    assert got.wait == getattr(expected, "wait", None)
    assert (got.metadata, got.result_ttl_s) == (expected.metadata or {}, expected.result_ttl_s)


embedding_bodies = st.fixed_dictionaries(
    {},
    optional={
        "input": st.one_of(
            st.text(max_size=3),
            st.lists(st.one_of(st.text(max_size=3), scalars), max_size=3),
            scalars,
        ),
        "model": scalars,
        "encoding_format": st.one_of(scalars, st.sampled_from((*FORMATS, "INT8", "fp16"))),
        "dimensions": st.one_of(scalars, st.integers(-2, 5)),
        "user": scalars,
        "wait": scalars,
        "other": scalars,
    },
)


@settings(max_examples=400, deadline=None)
@given(embedding_bodies)
def test_the_embeddings_decoder_accepts_what_the_model_accepts(body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    try:
        expected: EmbeddingsRequest | None = EmbeddingsRequest.model_validate_json(raw)
    except ValidationError:
        expected = None
    try:
        got = embeddings_body(raw)
    except InvalidBody:
        assert expected is None, f"refused what the model accepts: {body}"
        return
    assert expected is not None, f"accepted what the model refuses: {body}"
    fields = ("input", "model", "encoding_format", "dimensions", "user", "wait")
    assert {f: getattr(got, f) for f in fields} == {f: getattr(expected, f) for f in fields}


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b"not json", "body"),
        (b"[]", "body"),
        (b'{"input": "a", "extra": 1}', "extra"),
        (b'{"input": "a", "timeout_s": "1.5"}', "timeout_s"),
        (b'{"input": "a", "timeout_s": true}', "timeout_s"),
        (
            b'{"input": {"tensor": {"dtype": "int8", "shape": [1.0], "data": "AA=="}}}',
            "input.tensor.shape",
        ),
        (b'{"inputs": []}', "body"),
        (b'{"input": "a", "inputs": ["b"]}', "body"),
    ],
)
def test_refusals_name_where(raw: bytes, loc: str) -> None:
    with pytest.raises(InvalidBody) as e:
        job_body(raw, infer=True)
    assert e.value.detail[0]["loc"] == loc
