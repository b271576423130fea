"""`generate`: a local Hugging Face causal-LM or seq2seq directory (`INFERQ_MODEL_PATH`),
prompts in, generated text out, with static batching and greedy decoding.

For small models (a summariser, a T5, a GPT-2-sized LM) behind the same memory-bounded
queue as everything else. It is not an LLM server: a batch runs until its longest request
is done, with no continuous batching, paged KV cache or streaming; serve LLMs with a tool
built for that (vLLM, TGI).

- `parameters.max_new_tokens` (default 32, at most `INFERQ_MAX_NEW_TOKENS`).
- Cost of an item: prompt tokens + max_new_tokens, what the KV cache grows with; a batch's
  padded cost is items × the largest, the unit of its bound and its calibration.
- Prompts are padded on the side the architecture needs: left for a causal LM (generation
  continues at the right end of every row), right for an encoder-decoder's encoder. With
  the attention mask (and the position ids generate derives from it) a prompt's greedy
  continuation does not depend on its batch-mates.
- Each item stops at its own budget or its end-of-sequence token, so a request that asked
  for 8 tokens gets the same 8 whether it ran alone or beside one that asked for 64.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inferq.worker.models.base import (
    DeviceOutOfMemory,
    Input,
    InputKind,
    InvalidInput,
    OutputKind,
    Prepared,
    TextModel,
    int_parameter,
    is_oom,
    unknown_parameters,
)

log = logging.getLogger("inferq.worker")

DEFAULT_NEW_TOKENS = 32


class Generator(TextModel):
    output = OutputKind.TEXT
    parameters: Mapping[str, str] = {
        "max_new_tokens": f"tokens to generate at most (default {DEFAULT_NEW_TOKENS}, capped by "
        "INFERQ_MAX_NEW_TOKENS)"
    }

    def __init__(self, path: str | Path, *, max_new_tokens: int = 256) -> None:
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"{self.path} is not a Hugging Face model directory")
        self.cap = max_new_tokens
        self.max_cost: int | None = None
        self.default_batch_cost: int | None = None
        self.seq2seq = False
        self._model: Any = None
        self._tok: Any = None
        self._device: Any = None

    def load(self, device: str) -> None:
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()  # no tqdm bars in a worker's log
        config = transformers.AutoConfig.from_pretrained(str(self.path), local_files_only=True)
        self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        auto = (
            transformers.AutoModelForSeq2SeqLM
            if self.seq2seq
            else transformers.AutoModelForCausalLM
        )
        tok = transformers.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        tok.padding_side = "right" if self.seq2seq else "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        self._device = torch.device(device)
        self._model = (
            auto.from_pretrained(str(self.path), local_files_only=True).eval().to(self._device)
        )
        self._tok = tok
        positions = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        self.max_cost = int(positions) if positions else None
        if self.max_cost:  # a batch must fit the longest possible item
            self.default_batch_cost = 8 * self.max_cost

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        if self._tok is None:
            raise RuntimeError("Generator.prepare called before load()")
        if unknown := unknown_parameters(parameters, self.parameters):
            raise InvalidInput(None, f"unknown parameters {unknown}")
        new = int_parameter(
            parameters, "max_new_tokens", min(DEFAULT_NEW_TOKENS, self.cap), 1, self.cap
        )
        out = []
        for i, item in enumerate(inputs):
            if item.kind is not InputKind.TEXT:
                raise InvalidInput(i, f"{item.kind} input: this model takes text")
            ids = self._tok(item.text, add_special_tokens=True)["input_ids"]
            if not ids:
                raise InvalidInput(i, "the prompt has no tokens")
            budget = self.max_cost - new if self.max_cost and not self.seq2seq else None
            if budget is not None and budget < 1:
                raise InvalidInput(i, f"max_new_tokens={new} leaves no room for a prompt")
            ids = ids[-budget:] if budget is not None else ids  # keep the end of a long prompt
            out.append(Prepared(len(ids) + new, (ids, new)))
        return out

    def probe_inputs(self, cost: int) -> tuple[list[Input], dict[str, Any]]:
        new = max(1, min(self.cap, cost // 2))
        words = max(1, cost - new)
        return [Input(InputKind.TEXT, " ".join(["hello"] * words))], {"max_new_tokens": new}

    def run(self, batch: list[Any]) -> list[str]:
        import torch

        tok, model = self._tok, self._model
        prompts = [ids for ids, _ in batch]
        budgets = [new for _, new in batch]
        padded = tok.pad({"input_ids": prompts}, return_tensors="pt")
        ids = padded["input_ids"].to(self._device)
        mask = padded["attention_mask"].to(self._device)
        try:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max(budgets),
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=tok.pad_token_id,
                )
        except Exception as e:
            if is_oom(e):
                raise DeviceOutOfMemory(str(e)) from e
            raise
        new_tokens = out if self.seq2seq else out[:, ids.shape[1] :]
        texts = []
        for row, budget in zip(new_tokens.tolist(), budgets, strict=True):
            if self.seq2seq and row and row[0] == model.config.decoder_start_token_id:
                row = row[1:]
            row = row[:budget]
            if tok.eos_token_id is not None and tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            texts.append(tok.decode(row, skip_special_tokens=True))
        return texts
