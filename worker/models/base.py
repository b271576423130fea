"""The model protocol (v2): the one seam between the worker and whatever it serves.

A model declares what it takes and gives:

- `inputs`: the input kinds it accepts (`text`, `image`, `tensor`);
- `output`: the kind of each output (`vector`, `labels`, `boxes`, `text`, `any`);
- `parameters`: the per-request parameters it understands, name → one-line description
  (the API refuses any other name with 422; the model validates the values);
- `max_cost`: the largest cost one item can have (inputs past it are truncated), or None;
- `default_batch_cost`: the batch bound in its cost units when neither a calibration nor
  `INFERQ_MAX_BATCH_TOKENS` sets one (None: that setting's default).
- optionally `matryoshka_dims`: the sizes its vectors may be truncated to, for a model
  trained with a Matryoshka loss at those sizes (e.g. nomic-embed-text-v1.5: 64 ... 768).
  `/v1/embeddings` then takes `dimensions` among them and renormalises the truncated vector;
  without it (the default, `()`), `dimensions` must equal the full width. Declare it only for
  such training: truncating any other model's vectors loses much more than it seems to.

It is loaded once per worker (`load(device)`), turns one job's typed inputs and parameters
into items that each carry a **cost** (`prepare`): the unit device memory grows with, e.g.
tokens for text, pixels after the model's resize for images, prompt + new tokens for
generation. A batch's padded cost is items × the largest cost; the batch bound, the
calibration and the out-of-memory ceiling all work in it. `run` takes the payloads of one
batch and returns one output per item, in order: a float32 array of shape (n, dim) for
vectors (sent as raw bytes), or a list of any msgpack-able values (lists of
`{label, index, score}`, of boxes, strings...).

`prepare` runs in the worker's prepare thread, `run` in its model threads; neither may touch
Redis, and either may raise `InvalidInput(index, why)` to fail only its own job with
`invalid_input`. A model may also declare `prepare_many(jobs)` (`PreparesMany`): every job the
intake claimed together, prepared in one call (for a tokenizer, one call over all their
texts, which its Rust side runs in parallel without the GIL); if it raises, the intake
prepares those jobs one by one, so a bad input still fails only its own job. A model may declare `version` (a string that changes with its weights):
the result cache keys on it (`model_version`). Version 1 models (`dim`, `prepare(texts)`, vectors out) still work: the
registry wraps them in `LegacyModel`.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from inferq.shared.schema import InputKind, OutputKind  # model authors import them from here


@dataclass(frozen=True, slots=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def array(self) -> np.ndarray:
        """The tensor as a read-only numpy array (little-endian, as the wire carries it)."""
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(
            self.shape
        )


@dataclass(frozen=True, slots=True)
class Input:
    """One input of a job, typed: `value` is a str (text), bytes (image) or a Tensor."""

    kind: InputKind
    value: str | bytes | Tensor

    @property
    def text(self) -> str:
        assert isinstance(self.value, str)
        return self.value


@dataclass(frozen=True, slots=True)
class Prepared:
    """One input, ready to batch: `cost` is what it adds to a batch's padded cost."""

    cost: int
    payload: Any


class ModelError(Exception):
    """The model refused or failed on specific input; fails only the jobs involved."""


class InvalidInput(ModelError):
    """Input `index` of a job cannot be used (undecodable, too many pixels, a bad parameter
    value, ...): that job alone fails with `invalid_input`, naming the index."""

    def __init__(self, index: int | None, message: str) -> None:
        super().__init__(message if index is None else f"input {index}: {message}")
        self.index = index


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


def unknown_parameters(parameters: Mapping[str, Any], known: Mapping[str, str]) -> list[str]:
    return sorted(set(parameters) - set(known))


def int_parameter(
    parameters: Mapping[str, Any], name: str, default: int, low: int, high: int
) -> int:
    """`parameters[name]` as an int in [low, high], or InvalidInput naming the problem."""
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(None, f"parameter {name}={value!r}: want an integer in [{low}, {high}]")
    return value


@runtime_checkable
class Model(Protocol):
    """What the worker needs from a model. `inferq.worker.models.echo.EchoModel` is the
    smallest one; `tests/fixtures/models.py` has a detector-shaped one."""

    inputs: frozenset[InputKind]
    output: OutputKind
    parameters: Mapping[str, str]
    max_cost: int | None
    default_batch_cost: int | None

    def load(self, device: str) -> None:
        """Load weights onto `device` ("cpu", "cuda", "cuda:1"). Called once, before anything else."""

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        """One job's inputs as items, one per input, in order. May raise InvalidInput."""

    def run(self, batch: list[Any]) -> Sequence[Any] | np.ndarray:
        """Run a batch of `Prepared.payload`s; one output per payload, in order."""


@runtime_checkable
class PreparesMany(Protocol):
    """The optional batched `prepare`: one list of items per job, in order."""

    def prepare_many(
        self, jobs: Sequence[tuple[list[Input], Mapping[str, Any]]]
    ) -> list[list[Prepared]]: ...


def model_version(model: Any, *context: str) -> str:
    """What the result cache keys on besides the request: `context` (target, backend...)
    and the model's declared `version`; a model that declares none is fingerprinted by the
    name, size and mtime of its class's source file and of the files under its `path`, so
    new code or new weights change it (a content hash would read every weight at start)."""
    h = hashlib.sha256("\0".join(context).encode())
    declared = getattr(model, "version", None)
    if isinstance(declared, str) and declared:
        h.update(b"\0version\0" + declared.encode())
        return h.hexdigest()[:32]
    files: list[Path] = []
    with contextlib.suppress(TypeError, OSError):  # a class defined in a REPL has no file
        files.append(Path(inspect.getfile(type(model))))
    path = getattr(model, "path", None)
    if isinstance(path, str | Path):
        root = Path(path)
        files += sorted(root.iterdir()) if root.is_dir() else [root]
    for f in files:
        if f.is_file():
            st = f.stat()
            h.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    h.update(f"\0{type(model).__module__}.{type(model).__qualname__}".encode())
    return h.hexdigest()[:32]


def probe_inputs(model: Any, cost: int) -> tuple[list[Input], dict[str, Any]] | None:
    """An input of about `cost` units and its parameters, for warm-up and calibration: the
    model's own `probe_inputs`, or words for a text model; None if neither applies."""
    own = getattr(model, "probe_inputs", None)
    if own is not None:
        return own(cost)  # type: ignore[no-any-return]
    if InputKind.TEXT in getattr(model, "inputs", ()):
        return TextModel.probe_inputs(model, cost)
    return None


class TextModel:
    """Defaults for a model that takes text and gives vectors (override what differs)."""

    inputs: frozenset[InputKind] = frozenset({InputKind.TEXT})
    output: OutputKind = OutputKind.VECTOR
    parameters: Mapping[str, str] = {}
    max_cost: int | None = None
    default_batch_cost: int | None = None
    matryoshka_dims: tuple[int, ...] = ()  # not Matryoshka-trained unless a model says so

    @staticmethod
    def texts(inputs: list[Input]) -> list[str]:
        return [i.text for i in inputs]

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        raise NotImplementedError

    def prepare_texts(self, texts: list[str]) -> list[Prepared]:
        """`prepare` for plain strings and no parameters (benchmarks, warm-up, calibration)."""
        return self.prepare([Input(InputKind.TEXT, t) for t in texts], {})

    def probe_inputs(self, cost: int) -> tuple[list[Input], dict[str, Any]]:
        """An input of about `cost` units, for `inferq calibrate` (text: that many words)."""
        words = [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "a",
            "lazy",
            "dog",
            "while",
            "seven",
            "tired",
            "cats",
            "watch",
        ]
        text = " ".join(words[i % len(words)] for i in range(max(1, cost)))
        return [Input(InputKind.TEXT, text)], {}
