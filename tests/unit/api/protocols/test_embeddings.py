"""`protocols.embeddings`: `dimensions` against the model's Matryoshka declaration (`bind`, then
`answer`), and every `encoding_format` in the answer (a fake catalog; no Redis)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from inferq.api.batches import lines
from inferq.api.protocols import embeddings, vectors
from inferq.api.protocols.embeddings import Answer, EmbeddingsRequest
from inferq.shared.errors import ModelNotServed
from inferq.shared.jobs import Job, Status
from inferq.shared.registry import ModelInfo

NESTED = ModelInfo(inputs=("text",), output="vector", parameters={}, matryoshka_dims=(4, 2))
FLAT = ModelInfo(inputs=("text",), output="vector", parameters={})
OUT = np.array([[3.0, 4.0, 0.0, 12.0], [-1.0, 0.5, 0.25, 0.0]], dtype=np.float32)


class Catalog:
    """What `bind` reads of `ModelCatalog`: names and declarations."""

    def __init__(self, infos: dict[str, ModelInfo | None]) -> None:
        self.infos = infos
        self.reads = 0

    def resolve(self, requested: str | None) -> str:
        name = requested or "flat"
        if name not in self.infos:
            raise ModelNotServed(f"model {name!r} is not served here")
        return name

    async def info(self, model: str) -> ModelInfo | None:
        self.reads += 1
        return self.infos[model]


CATALOG = {"nested": NESTED, "flat": FLAT, "cold": None}


def _request(body: dict[str, object]) -> EmbeddingsRequest:
    req = embeddings.parse_request(orjson.dumps({"input": ["a b", "c"]} | body))
    assert isinstance(req, EmbeddingsRequest), req
    return req


async def _bind(body: dict[str, object], catalog: Catalog | None = None) -> Answer:
    req = await embeddings.bind(_request(body), catalog or Catalog(CATALOG))  # type: ignore[arg-type]
    if isinstance(req, Answer):
        return req
    model = req.model or "flat"
    job = Job(id="j", model=model, inputs=["a b", "c"], status=Status.SUCCEEDED)
    job.outputs = OUT
    return embeddings.answer(req, job)


def _rows(a: Answer) -> list[object]:
    # What the client gets: the body through the routes' own serialiser.
    body = orjson.loads(orjson.dumps(a.body, option=orjson.OPT_SERIALIZE_NUMPY))
    return [d["embedding"] for d in body["data"]]


async def test_dimensions_truncates_and_renormalises_for_a_matryoshka_model() -> None:
    a = await _bind({"model": "nested", "dimensions": 2})
    assert a.status == 200
    np.testing.assert_allclose(_rows(a), [[0.6, 0.8], [-1 / np.sqrt(1.25), 0.5 / np.sqrt(1.25)]])
    full = await _bind({"model": "nested", "dimensions": 4})  # its width: the vectors as they are
    np.testing.assert_array_equal(_rows(full), OUT)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "nested", "dimensions": 3}, "takes one of 2, 4"),  # not a declared size
        ({"model": "flat", "dimensions": 2}, "declares no Matryoshka sizes"),
        ({"model": "flat", "dimensions": 5}, "returns 4"),
        ({"model": "cold", "dimensions": 2}, "declares no Matryoshka sizes"),  # none declared yet
    ],
)
async def test_dimensions_the_model_cannot_give_are_refused(
    body: dict[str, object], says: str
) -> None:
    a = await _bind(body)
    assert a.status == 400, a
    err = a.body["error"]
    assert err["param"] == "dimensions" and err["code"] == "invalid_request"
    assert says in err["message"] and f"dimensions={body['dimensions']}" in err["message"]


async def test_a_width_equal_to_the_models_passes_for_any_model() -> None:
    assert _rows(await _bind({"model": "flat", "dimensions": 4})) == OUT.tolist()


async def test_bind_reads_the_declaration_only_when_dimensions_is_set() -> None:
    catalog = Catalog(CATALOG)
    await _bind({"model": "nested"}, catalog)
    assert catalog.reads == 0
    await _bind({"model": "nested", "dimensions": 2}, catalog)
    assert catalog.reads == 1
    # An unknown model is left to the submission's refusal (the same 404 as without it).
    req = await embeddings.bind(_request({"model": "nope", "dimensions": 2}), catalog)  # type: ignore[arg-type]
    assert isinstance(req, EmbeddingsRequest) and req.matryoshka_dims == ()


@pytest.mark.parametrize("fmt", vectors.FORMATS)
async def test_each_encoding_format_after_dimensions(fmt: str) -> None:
    a = await _bind({"model": "nested", "dimensions": 2, "encoding_format": fmt})
    assert a.status == 200
    short = vectors.truncate(OUT, 2)
    rows = _rows(a)
    if fmt == "base64":
        assert rows == vectors.encode(short, "base64")
    elif fmt == "float":
        np.testing.assert_allclose(rows, short)
    else:
        assert rows == [r.tolist() for r in vectors.encode(short, fmt)]  # type: ignore[union-attr]
        assert all(isinstance(v, int) for row in rows for v in row)  # type: ignore[attr-defined]


def test_an_unknown_format_is_refused_naming_the_ones_taken() -> None:
    a = embeddings.parse_request(b'{"input": "x", "encoding_format": "fp16"}')
    assert isinstance(a, Answer) and a.status == 400
    assert a.body["error"]["param"] == "encoding_format"
    assert "'int8'" in a.body["error"]["message"] and "'ubinary'" in a.body["error"]["message"]
    # The pydantic model (docs, batch lines) takes exactly the same names.
    literal = EmbeddingsRequest.model_json_schema()["properties"]["encoding_format"]["enum"]
    assert tuple(literal) == vectors.FORMATS


async def test_batch_lines_bind_as_the_route_does() -> None:
    catalog = Catalog(CATALOG)
    ep = lines.ENDPOINTS["/v1/embeddings"]
    refused = await ep.bind(_request({"model": "nested", "dimensions": 3}), catalog)  # type: ignore[arg-type]
    assert isinstance(refused, Answer) and refused.body["error"]["param"] == "dimensions"
    bound = await ep.bind(_request({"model": "nested", "dimensions": 2}), catalog)  # type: ignore[arg-type]
    assert bound.matryoshka_dims == (2, 4)
    infer = lines.ENDPOINTS["/v1/infer"]
    req = infer.parse(b'{"inputs": ["a"]}')
    assert await infer.bind(req, catalog) is req  # type: ignore[arg-type]
