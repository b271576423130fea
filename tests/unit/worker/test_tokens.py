"""`TextTokenizer`: minilm's ids for plain ASCII text from its pieces' remembered ids, the
same ids as the tokenizer as loaded, for any text and any mix of texts in one call, however
full its memory of pieces is."""

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

    def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
        self.texts += len(texts)
        return self.inner.encode_batch_fast(texts, **kwargs)


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
    assert tokens.ids(texts) == _ids(reference.encode_batch_fast(texts))


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
    assert tokens.ids(texts) == _ids(reference.encode_batch_fast(texts))
    for text in texts:  # one at a time too: a batch of one takes the one-pass check
        assert tokens.ids([text]) == _ids(reference.encode_batch_fast([text]))


def test_added_tokens_in_any_case_get_the_loaded_tokenizers_ids(
    reference: Tokenizer, tokens: TextTokenizer
) -> None:
    """`[MASK]` as given is one token; lowercased first and cut at its brackets, three."""
    texts = [f"a {t} b" for t in SPECIAL] + [t + t for t in SPECIAL] + ["[MA", "SK]"]
    assert tokens.ids(texts) == _ids(reference.encode_batch_fast(texts))
    for text in texts:
        assert tokens.ids([text]) == _ids(reference.encode_batch_fast([text]))
    assert tokens.ids(["a [MASK] b"])[0][2] == reference.token_to_id("[MASK]")
    assert not tokens.plain("a [mask] b") and tokens.plain("a [mas k] b")


def test_the_bench_corpus_gets_the_same_ids_from_its_pieces(
    reference: Tokenizer, tokens: TextTokenizer
) -> None:
    texts = corpus.load("short")
    assert all(t.isascii() for t in texts)  # else this would not test the pieces
    assert tokens.ids(texts) == _ids(reference.encode_batch_fast(texts))


def test_plain_ascii_is_made_of_pieces_and_the_rest_goes_to_the_loaded_tokenizer(
    reference: Tokenizer,
) -> None:
    """The learner sees each new piece once, in one call; the tokenizer as loaded sees the
    texts that are not plain; a text made of known pieces costs neither a call."""
    tokens = TextTokenizer(_loaded())
    assert tokens.learner is not None and tokens.lowercase
    tokens.learner, tokens.tokenizer = Spy(tokens.learner), Spy(tokens.tokenizer)  # type: ignore[assignment]
    texts = ["Hello World", "Café au lait", "tab\tand\nnewline, world", "bell\x07here", "ÉCOLE"]
    got = tokens.ids(texts)
    assert got == _ids(reference.encode_batch_fast(texts))
    # hello, world, tab, and, "newline," (cut at whitespace only); the other three texts whole
    assert (tokens.learner.texts, tokens.tokenizer.texts) == (5, 3)  # type: ignore[attr-defined]
    assert tokens.ids(["All plain", "ASCII text"]) == _ids(
        reference.encode_batch_fast(["All plain", "ASCII text"])
    )
    assert (tokens.learner.texts, tokens.tokenizer.texts) == (9, 3)  # type: ignore[attr-defined]
    tokens.ids(["HELLO\tplain  world", "text and all NEWLINE,"])
    assert (tokens.learner.texts, tokens.tokenizer.texts) == (9, 3)  # type: ignore[attr-defined]


def test_a_full_memory_starts_again_and_long_pieces_are_not_kept(reference: Tokenizer) -> None:
    tokens = TextTokenizer(_loaded(), words_max=8)
    words = [f"w{i}x{i * 7}" for i in range(40)] + ["supercalifragilisticexpialidocious"]
    for i in range(0, len(words), 3):
        texts = [" ".join(words[i : i + 3]), "the same words, again"]
        assert tokens.ids(texts) == _ids(reference.encode_batch_fast(texts))
        assert len(tokens.words) <= 8
    many = " ".join(words[:20])  # more pieces in one call than the memory holds: all taken
    assert tokens.ids([many]) == _ids(reference.encode_batch_fast([many]))
    long = "x" * 40 + " " + "y" * 150 + " " + "pneumonoultramicroscopicsilicovolcanoconiosis"
    assert tokens.ids([long]) == _ids(reference.encode_batch_fast([long]))
    assert all(len(p) <= 32 for p in tokens.words)


def test_truncation_keeps_the_start_and_the_special_tokens(reference: Tokenizer) -> None:
    tokens = TextTokenizer(_loaded())
    for n in (MAX_LENGTH - 3, MAX_LENGTH - 2, MAX_LENGTH - 1, MAX_LENGTH, MAX_LENGTH * 2):
        text = " ".join(f"w{i}" for i in range(n))  # two ids a word: w, ##N
        (got,) = tokens.ids([text])
        assert got == reference.encode_batch_fast([text])[0].ids
        assert len(got) == min(MAX_LENGTH, 2 * n + 2)
        assert got[0] == reference.token_to_id("[CLS]")
        assert got[-1] == reference.token_to_id("[SEP]")


def test_a_tokenizer_not_berts_in_every_part_gets_no_pieces() -> None:
    other = _loaded()
    other.normalizer = normalizers.NFKC()
    tokens = TextTokenizer(other)
    assert tokens.learner is None
    texts = ["Keeps Its Case", "ﬁne"]
    assert tokens.ids(texts) == _ids(other.encode_batch_fast(texts))
    spanning = _loaded()  # an added token matched after normalization may span two pieces
    spanning.add_tokens(["new york"])
    tokens = TextTokenizer(spanning)
    assert tokens.learner is None
    texts = ["I love New York", "new york, new york"]
    assert tokens.ids(texts) == _ids(spanning.encode_batch_fast(texts))
    assert spanning.token_to_id("new york") in tokens.ids(texts)[0]
    from_the_end = _loaded()  # truncation that keeps a text's end
    from_the_end.enable_truncation(MAX_LENGTH, direction="left")
    tokens = TextTokenizer(from_the_end)
    assert tokens.learner is None
    texts = [" ".join(f"w{i}" for i in range(MAX_LENGTH))]
    assert tokens.ids(texts) == _ids(from_the_end.encode_batch_fast(texts))
