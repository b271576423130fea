"""Freezing what a process built at start: those objects leave the collector's reach (a full
collection no longer walks them) and stay alive."""

from __future__ import annotations

import gc

from inferq.shared.heap import freeze_startup


def test_objects_alive_at_start_leave_the_collectors_reach() -> None:
    kept = [[i] for i in range(2000)]  # lists are tracked by the collector
    assert gc.is_tracked(kept[0])
    try:
        frozen = freeze_startup()
        assert frozen >= len(kept)
        walked = {id(o) for o in gc.get_objects()}
        assert id(kept[0]) not in walked and id(kept[-1]) not in walked
        later = [0]
        assert id(later) in {id(o) for o in gc.get_objects()}  # what comes after is walked
    finally:
        gc.unfreeze()
    assert id(kept[0]) in {id(o) for o in gc.get_objects()}
    assert kept[1999] == [1999]
