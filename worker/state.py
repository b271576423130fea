"""What a worker holds per job while it runs: its record, its entry, its items' outcomes.

A job is split into items (one per input); items may run in different batches. The job's
state collects their outputs and becomes final when the last one has an outcome, or at once
when one fails (its other items are then dropped before they run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferq.shared.jobs import Job, JobError, Status
from inferq.shared.queue import Entry
from inferq.worker.policy.batcher import Item


@dataclass(eq=False, slots=True)
class JobState:
    job: Job
    entry: Entry
    remaining: int  # items without an outcome yet
    outputs: list[Any] = field(default_factory=list)  # one per input, in input order
    error: JobError | None = None
    final_status: Status | None = None  # set once, when the job is handed to the outbox
    batch_size: int = 0  # the largest batch any of its items ran in
    batch_tokens: int = 0  # the largest padded cost of those batches
    counted: bool = False  # its first device start is counted in `attempts`
    # Its claim also counted that start (Intake.admit, idle): its first batch skips START.
    start_checked: bool = False
    dead_letter: bool = False
    lost: bool = False  # another worker took its entry over: it is theirs now

    @property
    def done(self) -> bool:
        return self.final_status is not None or self.lost

    @property
    def items_done(self) -> int:
        """Inputs with an output (a job that failed at admission has none)."""
        return len(self.outputs) - self.remaining if self.outputs else 0

    @property
    def attempts(self) -> int:
        return self.job.attempts

    @property
    def suspect(self) -> bool:
        """It was on a device when a worker died (`attempts` counts device starts): it runs
        alone, so it can only take itself down, not the healthy jobs batched with it."""
        return self.job.attempts >= 1


@dataclass(frozen=True, slots=True)
class Work:
    """One item's identity inside a batch (the batcher's `Item.key`)."""

    state: JobState
    index: int  # which input of the job
    payload: Any  # what the model's `prepare` made of it


def work(item: Item) -> Work:
    """The identity an item carries through the batch policy (`Item.key`)."""
    return item.key  # type: ignore[no-any-return]
