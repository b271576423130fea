"""`minilm-null`: minilm's tokenizer and output shape with no compute behind them.

It measures the path, not the model: every item is tokenized as minilm tokenizes it (the
worker's real prepare cost) and answered with a 384-wide float32 unit vector (the real
answer's size on the wire), in no device time. `scripts/stack_cpu.py --corpus null` runs it,
so the whole path's CPU per item (API, worker, Redis) shows on any machine. The vector is
the basis vector at (token count mod dim), so a test can tell which input an output is for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferq.worker.models.minilm import MiniLM, Tokenized, load_tokenizer


class MiniLMNull(Tokenized):
    version = "null-1"

    def __init__(self, path: str | None = None) -> None:
        spec = MiniLM(path)  # validates the dir, reads dim and max_cost; loads nothing
        self.path, self.dim, self.max_cost = spec.path, spec.dim, spec.max_cost

    def load(self, device: str) -> None:
        self._tokenizer, _ = load_tokenizer(self.path, self.max_cost)

    def run(self, batch: list[Any]) -> np.ndarray:
        out = np.zeros((len(batch), self.dim), dtype=np.float32)
        out[np.arange(len(batch)), [len(ids) % self.dim for ids in batch]] = 1.0
        return out
