"""The `generate` model on tiny random (seeded) GPT-2 and T5 models built by the test:
batched greedy equals one-by-one, each request keeps its own budget, cost grows with it."""

from __future__ import annotations

import pytest

from inferq.worker.models.base import Input, InputKind, InvalidInput
from inferq.worker.models.generate import Generator
from tests.fixtures.tiny_lm import build

PROMPTS = ["the cat sat on the mat", "a dog", "one two three four five six seven", "big red log"]
BUDGETS = [8, 16, 4, 12]


@pytest.fixture(scope="module", params=["gpt2", "t5"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Generator:
    g = Generator(build(request.param, tmp_path_factory.mktemp(request.param)), max_new_tokens=32)
    g.load("cpu")
    return g


def _items(g: Generator, prompts: list[str], budgets: list[int]) -> list:
    return [
        g.prepare([Input(InputKind.TEXT, p)], {"max_new_tokens": b})[0]
        for p, b in zip(prompts, budgets, strict=True)
    ]


def test_batched_greedy_equals_one_by_one(model: Generator) -> None:
    items = _items(model, PROMPTS, BUDGETS)
    batched = model.run([i.payload for i in items])
    alone = [model.run([i.payload])[0] for i in items]
    assert batched == alone
    assert all(isinstance(t, str) for t in batched)
    assert model.seq2seq == (model.path.name.startswith("t5"))


def test_each_request_keeps_its_own_budget(model: Generator) -> None:
    (short,) = _items(model, ["the cat sat"], [3])
    (long,) = _items(model, ["the cat sat"], [20])
    together = model.run([short.payload, long.payload])
    assert len(together[0].split()) <= 3  # one word per token in this vocabulary
    assert together[1].startswith(together[0])  # greedy: the shorter run is a prefix


def test_cost_grows_with_max_new_tokens_and_the_cap_holds(model: Generator) -> None:
    (a,) = _items(model, ["the cat sat on the mat"], [4])
    (b,) = _items(model, ["the cat sat on the mat"], [24])
    assert b.cost - a.cost == 20  # prompt tokens + new tokens
    with pytest.raises(InvalidInput, match="max_new_tokens"):
        _items(model, ["x"], [33])  # over INFERQ_MAX_NEW_TOKENS (32 here)
    with pytest.raises(InvalidInput, match="unknown parameters"):
        model.prepare([Input(InputKind.TEXT, "x")], {"temperature": 0.7})
