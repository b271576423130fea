"""Which priority lane a worker reads first, read by read.

The rule: reads try `high`, then `normal`, then `low`; but of every 8 reads, one starts
with `normal` and one with `low`. A lane that always has work therefore goes first at least
once in 8 reads, so a flood of high-priority jobs delays lower lanes but never starves them.
"""

from __future__ import annotations

HIGH_FIRST = ("high", "normal", "low")
NORMAL_FIRST = ("normal", "high", "low")
LOW_FIRST = ("low", "high", "normal")


def lane_order(read_no: int) -> tuple[str, str, str]:
    if read_no % 8 == 7:
        return LOW_FIRST
    if read_no % 4 == 3:
        return NORMAL_FIRST
    return HIGH_FIRST
