"""Load `minilm` the way the worker would, for the ceiling and the baselines."""

from __future__ import annotations

import os

from inferq.worker.models.base import Model


def build(device: str, backend: str) -> Model:
    """The loaded model for `device` and `backend` (torch | onnx); onnx may raise ImportError."""
    from inferq.shared.settings import ModelSpec, Settings
    from inferq.worker.models.registry import build_model

    settings = Settings(backend=backend, device=device)  # type: ignore[arg-type]
    model = build_model(ModelSpec("minilm"), settings)
    model.load(device)
    return model


def from_env() -> Model:
    return build(os.environ.get("BENCH_DEVICE", "cpu"), os.environ.get("BENCH_BACKEND", "torch"))
