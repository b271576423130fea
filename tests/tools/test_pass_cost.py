"""`scripts/pass_cost.py`: what it times is the steady state it says (one full batch a round,
the pending set held; a book whose jobs none end), and it only compares batchers that
choose the same batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.scripts import load_script

pass_cost = load_script("pass_cost")
REPO = Path(__file__).resolve().parents[2]


def test_each_round_takes_one_full_batch_and_serves_no_item_twice() -> None:
    us, chosen = pass_cost.batches(pass_cost.load(REPO, "batcher", "b_here"), 64, 20)
    assert us > 0
    assert len(chosen) == 20 and all(len(keys) == pass_cost.BATCH for keys in chosen)
    taken = [k for keys in chosen for k in keys]
    assert len(set(taken)) == len(taken)


def test_the_timed_book_holds_every_job_and_ends_none() -> None:
    book = pass_cost.held_book(pass_cost.load(REPO, "expiry", "e_here"), 50)
    assert len(book.jobs) == 50 and book.held_items() == 50
    assert pass_cost.per_pass(book, 10) > 0  # an ending job would fail in _Outbox.post
    assert len(book.jobs) == 50


def test_two_batchers_that_choose_differently_are_not_compared(tmp_path: Path) -> None:
    other = tmp_path / "worker" / "policy"
    other.mkdir(parents=True)
    source = (REPO / "worker/policy/scheduler.py").read_text()
    # A batcher that takes the newest anchor instead of the oldest.
    mutant = source.replace(
        "next(iter(self._items.items()))", "next(reversed(self._items.items()))"
    )
    assert mutant != source
    (other / "batcher.py").write_text(mutant)  # an older tree's layout: loaded all the same
    assert pass_cost.compare("batcher", {"a": REPO, "b": REPO}, 64, 10, 1)  # the same
    with pytest.raises(AssertionError, match="different batches"):
        pass_cost.compare("batcher", {"a": REPO, "b": tmp_path}, 64, 10, 1)


def test_every_held_job_leaves_in_each_timed_ending() -> None:
    book_module = pass_cost.load(REPO, "handback", "h_here")
    for ending in (pass_cost.handback, pass_cost.expire_all):
        us, _ = ending(book_module, 40, 2)  # `_leave` asserts the book is empty after
        assert us > 0
