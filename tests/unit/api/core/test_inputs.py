"""`wire_inputs` answers a body of texts alone in C; it must answer exactly as checking each
text in turn does: the same values, or the same refusal naming the same input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.api.core.decode import check_text, wire_inputs
from inferq.shared.errors import InputInvalid, InputTooLarge
from inferq.shared.schema import InputKind
from inferq.shared.settings import Settings

SETTINGS = Settings(_env_file=None, max_input_chars=5)


def one_by_one(texts: list[str]) -> list[str] | tuple[type[Exception], str]:
    try:
        return [check_text(t, i, SETTINGS) for i, t in enumerate(texts)]
    except (InputInvalid, InputTooLarge) as e:
        return type(e), str(e)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet=" \t\nab\u00e9\u3000", max_size=7), min_size=1, max_size=6))
def test_texts_alone_answer_as_each_text_checked_in_turn(texts: list[str]) -> None:
    expected = one_by_one(texts)
    try:
        values, kinds = wire_inputs(list(texts), SETTINGS)
    except (InputInvalid, InputTooLarge) as e:
        assert (type(e), str(e)) == expected
        return
    assert values == expected
    assert kinds == [InputKind.TEXT] * len(texts)


def test_a_bad_text_among_good_ones_is_named_by_its_index() -> None:
    with pytest.raises(InputInvalid, match="input 2 is empty"):
        wire_inputs(["a", "b", "  ", "toolong"], SETTINGS)
    with pytest.raises(InputTooLarge, match="input 1 has 7 characters"):
        wire_inputs(["a", "toolong", " "], SETTINGS)
