"""`scripts/expire_cost.py`: the book it times holds the jobs asked for, none of them due."""

from __future__ import annotations

from pathlib import Path

from tests.tools.scripts import load_script

expire_cost = load_script("expire_cost")
REPO = Path(__file__).resolve().parents[2]


def test_the_timed_book_holds_every_job_and_ends_none() -> None:
    book = expire_cost.held_book(expire_cost.load(REPO, "book_here"), 50)
    assert len(book.jobs) == 50 and book.held_items() == 50
    assert expire_cost.per_pass(book, 10) > 0  # an ending job would fail in _Outbox.post
    assert len(book.jobs) == 50
