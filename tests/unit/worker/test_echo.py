from __future__ import annotations

import numpy as np

from inferq.worker.models.base import Model
from inferq.worker.models.echo import EchoModel, expected_vector


def test_echo_is_deterministic_and_implements_the_protocol() -> None:
    m = EchoModel()
    assert isinstance(m, Model)
    m.load("cpu")
    items = m.prepare_texts(["one two three", "x"])
    assert [i.cost for i in items] == [3, 1]
    out = m.run([i.payload for i in items])
    assert out.dtype == np.float32 and out.shape == (2, 4)
    assert out.tolist() == [expected_vector("one two three"), expected_vector("x")]
