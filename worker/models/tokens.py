"""A `tokenizers` tokenizer with a shortcut for plain ASCII text under BERT's tokenizer.

BERT's normalizer (clean the text, space out CJK, strip accents through NFD, lowercase)
walks every character through Unicode tables with an alignment per character, and its
pre-tokenizer looks each character up again: most of minilm's tokenizing time on English
text (docs/benchmarks.md, "Tokenizing plain ASCII without BERT's normalizer" and "Plain
ASCII text from remembered words"). On ASCII text free of control characters each of the
normalizer's steps but lowercasing is the identity: nothing to clean, no CJK, NFD leaves
ASCII as it is and leaves no accent marks to strip. On such text the pre-tokenizer cuts at
whitespace and around each punctuation mark, and WordPiece maps each piece without looking
at its neighbours, so a text's ids are the special tokens around the ids of what lies
between its whitespace, cut to the truncation length. Such texts are lowercased here
(Python's `str.lower` and Rust's agree on ASCII) and cut at whitespace, and each piece's ids
are remembered from the first text that had it (one batched call of the tokenizer without
its normalizer, its truncation or its special tokens, which cuts around punctuation). Added
tokens matched before normalization (`[MASK]`, `[SEP]`: `normalized: false`) are matched
case and all in the text as given, so a text that holds one in any case goes the long way,
as does any other text, and any tokenizer whose parts are not BERT's.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# ASCII's control characters but the three BERT treats as whitespace (tab, newline, return):
# the normalizer deletes these, where a tokenizer without it would split at some of them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Pieces remembered at most; past it the memory starts again. English text's distinct
# words fit many times over (docs/benchmarks.md, "Plain ASCII text from remembered words").
WORDS_MAX = 1 << 16
# Longer pieces are not remembered (one is rarely a word seen twice): the memory's size stays
# bounded by WORDS_MAX such pieces, each with at most one id a character.
PIECE_MAX = 32


class TextTokenizer:
    """Token ids for texts, as `tokenizer` gives them (`ids`); plain ASCII text from its
    pieces' remembered ids where `tokenizer` is BERT's. Built after `tokenizer`'s truncation
    and padding are set (padding off). Not for two threads at once (the worker calls it
    under its prepare lock)."""

    def __init__(self, tokenizer: Tokenizer, words_max: int = WORDS_MAX) -> None:
        self.tokenizer = tokenizer
        self.words_max = words_max
        self.words: dict[str, list[int]] = {}
        self.learner: Tokenizer | None = None  # the pieces' tokenizer: no normalizer, no ends
        self.lowercase = False
        spec = json.loads(tokenizer.to_str())
        raw = [t["content"] for t in spec.get("added_tokens", []) if not t.get("normalized")]
        self._raw_tokens = re.compile("|".join(map(re.escape, raw)), re.IGNORECASE) if raw else None
        if _berts(spec):
            self._learn_from(spec)

    def _learn_from(self, spec: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        learner = Tokenizer.from_str(self.tokenizer.to_str())
        learner.normalizer = None
        learner.no_truncation()
        # The special tokens around a text: where its pieces sit among them.
        body = learner.encode("a", add_special_tokens=False).ids
        whole = learner.encode("a").ids
        at = next((i for i in range(len(whole)) if whole[i : i + len(body)] == body), None)
        truncation = spec.get("truncation")
        room = None
        if truncation is not None:
            room = int(truncation["max_length"]) - (len(whole) - len(body))
        if at is None or (room is not None and room < 1):
            return
        self.learner = learner
        self.lowercase = bool((spec.get("normalizer") or {}).get("lowercase", True))
        self._head, self._tail = whole[:at], whole[at + len(body) :]
        self._room = room

    def plain(self, text: str) -> bool:
        """Whether `text`'s ids can come from its pieces' (see the module's docstring)."""
        if not text.isascii() or _CONTROL.search(text):
            return False
        return self._raw_tokens is None or self._raw_tokens.search(text) is None

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, in order, as the tokenizer gives them. Its own calls skip
        the character offsets, which nothing here reads (`encode_batch_fast`: the same ids
        for 13-33 % less CPU, docs/benchmarks.md, "The tokenizer without offsets")."""
        if self.learner is None:
            return [e.ids for e in self.tokenizer.encode_batch_fast(texts)]
        if self.plain("".join(texts)):  # the usual case, checked in one pass
            return self._from_pieces(texts)
        flags = [self.plain(t) for t in texts]
        out: list[list[int]] = [[] for _ in texts]
        for want in (True, False):
            at = [i for i, flag in enumerate(flags) if flag is want]
            if not at:
                continue
            picked = [texts[i] for i in at]
            if want:
                got = self._from_pieces(picked)
            else:
                got = [e.ids for e in self.tokenizer.encode_batch_fast(picked)]
            for i, ids in zip(at, got, strict=True):
                out[i] = ids
        return out

    def _from_pieces(self, texts: list[str]) -> list[list[int]]:
        """Plain texts' ids from their pieces': what lies between whitespace (`str.split`
        splits plain ASCII where BERT does: tab, newline, return, space). BERT's
        pre-tokenizer also cuts around punctuation inside a piece, which the learner does
        when it learns the piece, so cutting only at whitespace is exact."""
        if self.lowercase:
            texts = [t.lower() for t in texts]
        pieces = [t.split() for t in texts]
        try:
            return self._assemble(pieces)
        except KeyError:  # a piece not yet learned
            pass
        words = self.words
        new = {p for ps in pieces for p in ps if p not in words}
        if len(words) + len(new) > self.words_max:
            words.clear()
            new = {p for ps in pieces for p in ps}
        self._learn(sorted(new))
        out = self._assemble(pieces)
        for p in new:
            if len(p) > PIECE_MAX:
                del words[p]
        return out

    def _assemble(self, pieces: list[list[str]]) -> list[list[int]]:
        head, tail, room, get = self._head, self._tail, self._room, self.words.__getitem__
        end = None if room is None else len(head) + room
        out = []
        for ps in pieces:
            ids = head.copy()
            ids.extend(chain.from_iterable(map(get, ps)))
            if end is not None and len(ids) > end:
                del ids[end:]
            ids += tail
            out.append(ids)
        return out

    def _learn(self, pieces: list[str]) -> None:
        assert self.learner is not None
        encoded = self.learner.encode_batch_fast(pieces, add_special_tokens=False)
        for piece, e in zip(pieces, encoded, strict=True):
            self.words[piece] = e.ids


def _berts(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer (its JSON) is BERT's in every part the pieces' ids rely on: its
    normalizer, pre-tokenizer and model, no padding, truncation that keeps a text's start, and
    no added token matched after normalization (it could span pieces)."""
    truncation = spec.get("truncation") or {"stride": 0, "direction": "Right"}
    return (
        (spec.get("normalizer") or {}).get("type") == "BertNormalizer"
        and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
        and (spec.get("model") or {}).get("type") == "WordPiece"
        and spec.get("padding") is None
        and truncation.get("stride", 0) == 0
        and truncation.get("direction", "Right") == "Right"
        and all(not t.get("normalized") for t in spec.get("added_tokens", []))
    )
