"""`TextTokenizer`: minilm's ids through the normalizer-free twin for plain ASCII text, the
same ids as the tokenizer as loaded, for any text and any mix of texts in one call."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from inferq.bench import corpus
from inferq.worker.models.minilm import MiniLM, load_tokenizer
from inferq.worker.models.tokens import TextTokenizer

MAX_LENGTH = 256
# Every ASCII character, controls included, and non-ASCII text the normalizer changes:
# accents (NFD strips them), CJK (spaced out), Unicode spaces and controls, a ligature and
# a capital whose lowercase is longer than itself.
ALPHABET = st.one_of(
    st.characters(max_codepoint=0x7F),
    st.sampled_from(list("éÉçñÅ中文字\u00a0\u3000\u200b\u0085\ufffdﬁİß")),
)
# minilm's added tokens, matched in the text as given (`normalized: false`), in three cases.
SPECIAL = ["[MASK]", "[mask]", "[Sep]", "[CLS]", "[unk]", "[PAD]"]
# Words with any of those between them: a character the normalizer deletes joins two words,
# one it reads as a space splits them, so what sits between words is what differs.
TEXT = st.lists(
    st.one_of(
        st.sampled_from(["hello", "World", "tokenization", "ab", "x", "42", *SPECIAL]), ALPHABET
    ),
    max_size=12,
).map("".join)


def _loaded() -> Tokenizer:
    tokenizer, _ = load_tokenizer(MiniLM().path, MAX_LENGTH)
    return tokenizer.tokenizer


class Spy:
    """Counts the texts a tokenizer was given."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.texts = inner, 0

    def encode_batch_fast(self, texts: list[str]) -> Any:
        self.texts += len(texts)
        return self.inner.encode_batch_fast(texts)


@pytest.fixture(scope="module")
def reference() -> Tokenizer:
    return _loaded()


@pytest.fixture(scope="module")
def tokens() -> TextTokenizer:
    return TextTokenizer(_loaded())


def _ids(encodings: list[Any]) -> list[list[int]]:
    return [e.ids for e in encodings]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXT, max_size=6))
def test_any_texts_get_the_loaded_tokenizers_ids(
    reference: Tokenizer, tokens: TextTokenizer, texts: list[str]
) -> None:
    assert _ids(tokens.encode(texts)) == _ids(reference.encode_batch_fast(texts))


def test_every_ascii_character_between_words_and_at_the_ends(
    reference: Tokenizer, tokens: TextTokenizer
) -> None:
    """What the normalizer does to one character shows in what it does to its neighbours:
    deleted, it joins two words; read as a space, it splits them."""
    texts = [
        form.format(c)
        for c in map(chr, range(0x80))
        for form in ("Ab{}Cd", "{}x", "x{}", "{}", "tokeni{}zation")
    ]
    assert _ids(tokens.encode(texts)) == _ids(reference.encode_batch_fast(texts))
    for text in texts:  # one at a time too: a batch of one takes the one-pass check
        assert _ids(tokens.encode([text])) == _ids(reference.encode_batch_fast([text]))


def test_added_tokens_in_any_case_get_the_loaded_tokenizers_ids(
    reference: Tokenizer, tokens: TextTokenizer
) -> None:
    """`[MASK]` as given is one token; lowercased first, as the twin would see it, it is three."""
    texts = [f"a {t} b" for t in SPECIAL] + [t + t for t in SPECIAL] + ["[MA", "SK]"]
    assert _ids(tokens.encode(texts)) == _ids(reference.encode_batch_fast(texts))
    for text in texts:
        assert _ids(tokens.encode([text])) == _ids(reference.encode_batch_fast([text]))
    assert tokens.encode(["a [MASK] b"])[0].ids[2] == reference.token_to_id("[MASK]")
    assert not tokens.plain("a [mask] b") and tokens.plain("a [mas k] b")


def test_the_bench_corpus_gets_the_same_ids_through_the_twin(
    reference: Tokenizer, tokens: TextTokenizer
) -> None:
    texts = corpus.load("short")
    assert all(t.isascii() for t in texts)  # else this would not test the twin
    assert _ids(tokens.encode(texts)) == _ids(reference.encode_batch_fast(texts))


def test_plain_ascii_goes_to_the_twin_and_the_rest_to_the_loaded_tokenizer(
    reference: Tokenizer,
) -> None:
    tokens = TextTokenizer(_loaded())
    assert tokens.twin is not None and tokens.lowercase
    tokens.twin, tokens.tokenizer = Spy(tokens.twin), Spy(tokens.tokenizer)  # type: ignore[assignment]
    texts = ["Hello World", "Café au lait", "tab\tand\nnewline", "bell\x07here", "ÉCOLE"]
    got = _ids(tokens.encode(texts))
    assert got == _ids(reference.encode_batch_fast(texts))
    assert (tokens.twin.texts, tokens.tokenizer.texts) == (2, 3)  # type: ignore[attr-defined]
    tokens.encode(["All plain", "ASCII text"])
    assert (tokens.twin.texts, tokens.tokenizer.texts) == (4, 3)  # type: ignore[attr-defined]


def test_the_twin_keeps_truncation_and_special_tokens(reference: Tokenizer) -> None:
    long = " ".join(["word"] * (MAX_LENGTH * 2))
    tokens = TextTokenizer(_loaded())
    (got,) = tokens.encode([long])
    assert len(got.ids) == MAX_LENGTH
    assert got.ids == reference.encode_batch_fast([long])[0].ids
    assert got.ids[0] == reference.token_to_id("[CLS]")


def test_a_tokenizer_without_berts_normalizer_gets_no_twin() -> None:
    other = _loaded()
    other.normalizer = normalizers.NFKC()
    tokens = TextTokenizer(other)
    assert tokens.twin is None
    texts = ["Keeps Its Case", "ﬁne"]
    assert _ids(tokens.encode(texts)) == _ids(other.encode_batch_fast(texts))
