"""The live token ceiling: lowered below a size that ran out of memory, raised back slowly.

Pure policy, no I/O. Invariants: `floor <= value <= ceiling` always; after an OOM at
`failed_tokens` the value is below `failed_tokens` (unless already at the floor); it
rises one step per `recover_after` consecutive successful batches, never above `ceiling`
(the calibrated or configured bound).
"""

from __future__ import annotations


class LiveCeiling:
    def __init__(
        self, ceiling: int, floor: int, recover_after: int, step_fraction: float = 0.125
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.ceiling = ceiling
        self.floor = floor
        self.recover_after = recover_after
        self.step = max(1, int(ceiling * step_fraction))
        self.value = ceiling
        self.lowered = 0
        self.raised = 0
        self._successes = 0

    def on_oom(self, failed_tokens: int) -> int:
        """A batch of `failed_tokens` padded tokens ran out of memory: go below it."""
        self._successes = 0
        target = max(self.floor, min(self.value, failed_tokens * 3 // 4))
        if target < self.value:
            self.value = target
            self.lowered += 1
        return self.value

    def on_success(self) -> int:
        if self.value >= self.ceiling:
            return self.value
        self._successes += 1
        if self._successes >= self.recover_after:
            self._successes = 0
            self.value = min(self.ceiling, self.value + self.step)
            self.raised += 1
        return self.value
