"""Load a model the way the worker would, for the ceiling and the baselines."""

from __future__ import annotations

import os

from inferq.worker.models.base import Model

DEFAULT_MODEL = "minilm"


def build(device: str, backend: str, model: str = DEFAULT_MODEL) -> Model:
    """The loaded `model` (minilm, efficientnet-lite0) for `device` and `backend` (torch |
    onnx); onnx may raise ImportError."""
    from inferq.shared.settings import ModelSpec, Settings
    from inferq.worker.models.registry import build_model

    settings = Settings(backend=backend, device=device)  # type: ignore[arg-type]
    loaded = build_model(ModelSpec(model), settings)
    loaded.load(device)
    return loaded


def from_env() -> Model:
    """The model BENCH_MODEL names (default minilm) on BENCH_DEVICE with BENCH_BACKEND."""
    return build(
        os.environ.get("BENCH_DEVICE", "cpu"),
        os.environ.get("BENCH_BACKEND", "torch"),
        os.environ.get("BENCH_MODEL", DEFAULT_MODEL),
    )
