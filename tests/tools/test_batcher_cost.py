"""`scripts/batcher_cost.py`: it times the batch policy at a steady pending count, and only
compares batchers that choose the same batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.scripts import load_script

batcher_cost = load_script("batcher_cost")
REPO = Path(__file__).resolve().parents[2]


def test_each_round_takes_one_full_batch_and_the_pending_count_holds() -> None:
    module = batcher_cost.load(REPO, "batcher_here")
    us, chosen = batcher_cost.run(module, pending=64, rounds=20)
    assert us > 0
    assert len(chosen) == 20 and all(len(keys) == batcher_cost.BATCH for keys in chosen)
    taken = [k for keys in chosen for k in keys]
    assert len(set(taken)) == len(taken)  # no item served twice


def test_two_batchers_that_choose_differently_are_not_compared(tmp_path: Path) -> None:
    other = tmp_path / "worker" / "policy"
    other.mkdir(parents=True)
    source = (REPO / "worker/policy/batcher.py").read_text()
    # A batcher that takes the newest anchor instead of the oldest.
    mutant = source.replace(
        "next(iter(self._items.items()))", "next(reversed(self._items.items()))"
    )
    assert mutant != source
    (other / "batcher.py").write_text(mutant)
    assert batcher_cost.compare({"a": REPO, "b": REPO}, 64, 10, 1)  # the same: compared
    with pytest.raises(AssertionError, match="different batches"):
        batcher_cost.compare({"a": REPO, "b": tmp_path}, 64, 10, 1)
