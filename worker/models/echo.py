"""`echo`: a tiny deterministic model for tests and for measuring the queue itself.

No torch. Each text's vector is `[tokens, chars, crc32(text) & 0xFFFFFF, 1.0]`, so a client
can check that every output belongs to its input. Optional delays (per batch, per padded
token) make it behave like a device-bound model without one.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferq.worker.models.base import Input, InvalidInput, Prepared, TextModel, unknown_parameters


def expected_vector(text: str) -> list[float]:
    """What echo returns for `text`; tests use it to check results end to end."""
    return [
        float(max(1, len(text.split()))),
        float(len(text)),
        float(zlib.crc32(text.encode()) & 0xFFFFFF),
        1.0,
    ]


class EchoModel(TextModel):
    dim = 4

    def __init__(self, batch_delay_ms: float = 0.0, token_delay_ms: float = 0.0) -> None:
        self.batch_delay_s = batch_delay_ms / 1000
        self.token_delay_s = token_delay_ms / 1000

    def load(self, device: str) -> None:
        self.device = device

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        if unknown := unknown_parameters(parameters, self.parameters):
            raise InvalidInput(None, f"unknown parameters {unknown}")
        return [Prepared(cost=max(1, len(t.split())), payload=t) for t in self.texts(inputs)]

    def run(self, batch: list[Any]) -> np.ndarray:
        padded = len(batch) * max(max(1, len(t.split())) for t in batch)
        delay = self.batch_delay_s + self.token_delay_s * padded
        if delay:
            time.sleep(delay)
        return np.array([expected_vector(t) for t in batch], dtype=np.float32)
