"""The model protocol: the one seam between the worker and whatever it serves.

A model is loaded once per worker process (`load(device)`), turns a job's inputs into
items that carry a token cost (`prepare`), and runs a batch of prepared items
(`run`), returning exactly one float32 vector per item, in order.

`prepare` runs on the event loop thread when a job is read (tokenising there means a
bad input fails its job before it can reach a batch); `run` runs in the worker's single
inference thread. Neither may touch Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class Prepared:
    """One input, ready to batch: `cost` is what it adds to a batch's padded length."""

    cost: int
    payload: Any


class ModelError(Exception):
    """The model refused or failed on specific input; fails only the jobs involved."""


class DeviceOutOfMemory(Exception):
    """The device ran out of memory running a batch (normalised from torch/ORT/MemoryError)."""


# What allocation failures say when a runtime re-raises them as a plain error (CPU c10,
# CUDA, ONNX Runtime's arena); a model that does not map its own still gets the OOM path.
_OOM_TYPES = ("OutOfMemoryError",)  # torch.cuda.OutOfMemoryError, by name: no torch import
_OOM_TEXT = ("out of memory", "can't allocate memory", "failed to allocate", "bad_alloc")


def is_oom(e: BaseException) -> bool:
    """Whether `e` is the device running out of memory, whoever raised it."""
    if isinstance(e, DeviceOutOfMemory | MemoryError) or type(e).__name__ in _OOM_TYPES:
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(t in text for t in _OOM_TEXT)


@runtime_checkable
class Model(Protocol):
    """What the worker needs from a model. See `inferq.worker.models.echo.EchoModel` for the smallest one."""

    #: Width of each output vector.
    dim: int
    #: Longest cost a single item can have (inputs past it are truncated), or None if unbounded.
    max_cost: int | None

    def load(self, device: str) -> None:
        """Load weights onto `device` ("cpu", "cuda", "cuda:1"). Called once, before anything else."""

    def prepare(self, inputs: list[str]) -> list[Prepared]:
        """Turn one job's inputs into items, one per input, in order. May raise ModelError."""

    def run(self, batch: list[Any]) -> np.ndarray:
        """Run a batch of `Prepared.payload`s; return float32 of shape (len(batch), dim)."""
