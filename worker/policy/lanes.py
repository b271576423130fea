"""Which priority lane a worker reads first, read by read.

The rule: reads try `high`, then `normal`, then `low`; but of every 8 reads, one starts
with `normal` and one with `low`. A lane that always has work therefore goes first at least
once in 8 reads, so a flood of high-priority jobs delays lower lanes but never starves them.
"""

from __future__ import annotations

from collections.abc import Sequence


def lane_order(read_no: int, lanes: Sequence[str]) -> tuple[str, ...]:
    """The lanes to try, in order, for read number `read_no`; `lanes` highest first (the
    worker passes `inferq.shared.schema.LANES`: the names are defined there, once)."""
    high, normal, low = lanes
    if read_no % 8 == 7:
        return (low, high, normal)
    if read_no % 4 == 3:
        return (normal, high, low)
    return (high, normal, low)
