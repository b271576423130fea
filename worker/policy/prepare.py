"""Where a claim's jobs are prepared (tokenised, decoded): on the event loop when the model's
measured cost says the work is small, else in the intake's prepare thread.

Handing a claim to that thread and back costs more than tokenising a few short texts does:
a queue put that wakes the thread, then the result posted back to the loop, ~100 µs of CPU
a hop on the 2-core box of docs/benchmarks.md ("Prepared on the loop when it is small"),
against ~2.5 µs for the same call made on the loop. What keeps the loop responsive is the
bound: a claim whose expected cost is over `limit_s` still goes to the thread. The
expectation is the measured CPU of earlier claims of about the same size (a moving average
per power of two of their input bytes: a small claim's cost is mostly the call's own, not
its bytes', so one rate a byte would misjudge both ends). Its bytes may be up to twice
those of the claims that made the average, so while the average holds, the loop is held
about 1 ms at most. A size never measured goes to the thread, and every call is measured
wherever it ran, so a model whose inputs grow costly moves back to the thread by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INLINE_MAX_S = 0.0005  # the longest a prepare may hold the event loop, expected
SMOOTHING = 0.25  # weight of the newest call in its size's average


def size_class(size: int) -> int:
    """Claims of 2**(k-1) to 2**k - 1 bytes share class k (0 bytes: class 0)."""
    return max(size, 0).bit_length()


@dataclass(slots=True)
class PrepareCost:
    """The model's prepare CPU a claim, by size class (a moving average of the calls
    measured so far), and the rule that reads it."""

    limit_s: float = INLINE_MAX_S
    seconds: dict[int, float] = field(default_factory=dict)  # size class → its average

    def inline(self, size: int) -> bool:
        """Whether a claim of `size` bytes of inputs is prepared on the event loop."""
        expected = self.seconds.get(size_class(size))
        return expected is not None and expected <= self.limit_s

    def observe(self, size: int, seconds: float) -> None:
        """A prepare of `size` bytes took `seconds` of CPU."""
        k, took = size_class(size), max(seconds, 0.0)
        last = self.seconds.get(k)
        self.seconds[k] = took if last is None else last + SMOOTHING * (took - last)
