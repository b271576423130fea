"""Recall@10 of the compact encodings against float on the bench corpus (`short`, 1000
texts), with the real minilm model on CPU: the floors under the figures docs/api.md reports
(`python -m inferq.bench.recall` prints them: int8 0.994, binary 0.566 when written)."""

from __future__ import annotations

import numpy as np
import pytest

from inferq.bench import corpus, recall
from inferq.bench.model import build

# Measured minus a margin for another torch build's last bits: int8 keeps almost every
# neighbour; one sign bit per dimension of a 384-wide model keeps about half of them.
FLOORS = {"int8": 0.97, "uint8": 0.97, "binary": 0.50, "ubinary": 0.50}


@pytest.fixture(scope="module")
def floats() -> np.ndarray:
    return recall.embed(build("cpu", "torch", "minilm"), corpus.load("short"))


def test_compact_encodings_keep_the_float_neighbours(floats: np.ndarray) -> None:
    assert floats.shape == (1000, 384)
    got = recall.measure(floats)
    assert got["int8"] == got["uint8"] and got["binary"] == got["ubinary"]  # same ranking
    for name, floor in FLOORS.items():
        assert got[name] >= floor, f"{name} recall@10 {got[name]:.3f} under {floor}: {got}"


def test_recall_is_one_against_itself_and_counts_shares() -> None:
    truth = np.array([[1, 2], [0, 2]])
    assert recall.recall_at_k(truth, truth) == 1.0
    assert recall.recall_at_k(truth, np.array([[2, 3], [3, 4]])) == 0.25
    scores = np.array([[9.0, 1.0, 1.0], [0.0, 9.0, 2.0], [5.0, 5.0, 9.0]])
    assert recall.top_k(scores, 1).tolist() == [[1], [2], [0]]  # self excluded; ties in order
