"""A `tokenizers` tokenizer with a shortcut for plain ASCII text under BERT's normalizer.

BERT's normalizer (clean the text, space out CJK, strip accents through NFD, lowercase)
walks every character through Unicode tables with an alignment per character: 30-47 % of
minilm's tokenizing time on English text (docs/benchmarks.md, "Tokenizing plain ASCII
without BERT's normalizer"). On ASCII text free of control characters each of its steps but
lowercasing is the identity: nothing to clean, no CJK, NFD leaves ASCII as it is and leaves
no accent marks to strip. So such texts are lowercased here (Python's `str.lower` and Rust's
agree on ASCII) and tokenized by a twin of the tokenizer that has no normalizer: the same
pre-tokenizer, vocabulary, truncation and special tokens, so the same ids. Added tokens
matched before normalization (`[MASK]`, `[SEP]`: `normalized: false`) are matched case and
all in the text as given, which the twin would see lowercased, so a text that holds one in
any case goes the long way too, as does any other text.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# ASCII's control characters but the three BERT treats as whitespace (tab, newline, return):
# the normalizer deletes these, where a tokenizer without it would split at some of them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class TextTokenizer:
    """Token ids for texts: `tokenizer`'s, through its normalizer-free twin where that is
    exact (`encode`). Built after `tokenizer`'s truncation and padding are set: the twin
    copies them."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = tokenizer
        self.twin: Tokenizer | None = None
        self.lowercase = False
        spec = json.loads(tokenizer.to_str())
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") == "BertNormalizer":
            self.twin = Tokenizer.from_str(tokenizer.to_str())
            self.twin.normalizer = None
            self.lowercase = bool(normalizer.get("lowercase", True))
        raw = [t["content"] for t in spec.get("added_tokens", []) if not t.get("normalized")]
        self._raw_tokens = re.compile("|".join(map(re.escape, raw)), re.IGNORECASE) if raw else None

    def plain(self, text: str) -> bool:
        """Whether the twin gives `text` the loaded tokenizer's ids."""
        if not text.isascii() or _CONTROL.search(text):
            return False
        return self._raw_tokens is None or self._raw_tokens.search(text) is None

    def encode(self, texts: list[str]) -> list[Encoding]:
        """One encoding per text, in order, without character offsets (`encode_batch_fast`)."""
        if self.twin is None:
            return self.tokenizer.encode_batch_fast(texts)
        if self.plain("".join(texts)):  # the usual case, checked in one pass
            return self.twin.encode_batch_fast(self._fold(texts))
        flags = [self.plain(t) for t in texts]
        if not any(flags):
            return self.tokenizer.encode_batch_fast(texts)
        out: list[Encoding | None] = [None] * len(texts)
        for tokenizer, want in ((self.twin, True), (self.tokenizer, False)):
            at = [i for i, flag in enumerate(flags) if flag is want]
            if not at:
                continue
            picked = [texts[i] for i in at]
            encoded = tokenizer.encode_batch_fast(self._fold(picked) if want else picked)
            for i, e in zip(at, encoded, strict=True):
                out[i] = e
        return out  # type: ignore[return-value]  # every index was filled above

    def _fold(self, texts: list[str]) -> list[str]:
        return [t.lower() for t in texts] if self.lowercase else texts
