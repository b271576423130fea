"""Admission: how much work a model's queue may hold, and what a refused client is told.

Pure: no Redis, no clock. The numbers come in (items queued, the workers' recent items/s,
the job's deadline); a limit or a refusal goes out. The Redis side (`scripts.SUBMIT`) applies
the limit atomically per shard; this object decides what the limit is and words the 429.

Invariants:

* `limit` never admits fewer than the job's own items when workers are live (rate > 0): a
  job alone in an empty queue is never refused for being slow; it never exceeds
  `max_queue`.
* With a rate, the limit is what the workers finish before the deadline
  (rate × timeout), so an admitted job can finish in time.
* Every refusal carries `retry_after_s >= 1` and a `reason` from a fixed set
  (`REASONS`): metrics label it, clients read it.
* `retry_after_s` is the time for enough of the queue ahead to drain that this job fits;
  without a rate it is an estimate at 100 items/s, and for bytes the job's own run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferq.shared.errors import Overloaded

#: Why a submit was refused (the label of `inferq_jobs_rejected_total{reason}`).
REASONS = (
    "queue_full",
    "queue_bytes",
    "deadline",
    "tenant_queue_full",
    "tenant_queue_bytes",
    "tenant_webhooks",
)
#: Drain rate assumed for Retry-After while no worker has reported one yet (items/s).
UNKNOWN_RATE = 100
#: Retry-After of a refusal for the tenant's webhook backlog: deliveries drain at the pace of
#: a target coming back, not of the queue.
WEBHOOK_RETRY_S = 30


@dataclass(frozen=True, slots=True)
class Admission:
    max_queue: int  # items queued per model (INFERQ_MAX_QUEUE)
    max_queue_bytes: int  # input bytes queued per model (INFERQ_MAX_QUEUE_BYTES)
    tenant_share: float = 1.0  # of both, per tenant (INFERQ_TENANT_QUEUE_SHARE); 1: uncapped
    max_webhooks: int = 0  # unsettled deliveries per tenant (INFERQ_TENANT_MAX_WEBHOOKS)

    def tenant_caps(self) -> tuple[int, int]:
        """(items, bytes) one tenant may hold per model; (0, 0) when tenants are not capped."""
        if self.tenant_share >= 1:
            return 0, 0
        share = self.tenant_share
        return max(1, int(self.max_queue * share)), max(1, int(self.max_queue_bytes * share))

    def tenant_refusal(
        self, outcome: str, tenant: str, model: str, held: int, items: int, rate: float
    ) -> Overloaded:
        """The refusal when `tenant` already holds `held` items (`tenant_full`) or bytes
        (`tenant_bytes`) of `model`'s queue, its share of it."""
        cap_items, cap_bytes = self.tenant_caps()
        retry = max(1, math.ceil(items / rate)) if rate > 0 else 1
        share = f"INFERQ_TENANT_QUEUE_SHARE={self.tenant_share:g}"
        if outcome == "tenant_bytes":
            return Overloaded(
                f"tenant {tenant!r} holds {held} input bytes of model {model!r}'s queue "
                f"(its cap: {cap_bytes}, {share} of INFERQ_MAX_QUEUE_BYTES)",
                retry,
                "tenant_queue_bytes",
            )
        return Overloaded(
            f"tenant {tenant!r} has {held} items queued for model {model!r} "
            f"(its cap: {cap_items}, {share} of INFERQ_MAX_QUEUE)",
            retry,
            "tenant_queue_full",
        )

    def webhook_refusal(self, tenant: str, backlog: int) -> Overloaded | None:
        """The refusal of a job with a webhook while `tenant` has `backlog` deliveries not
        yet settled, at or past its cap; None while under it."""
        if not self.max_webhooks or backlog < self.max_webhooks:
            return None
        return Overloaded(
            f"tenant {tenant!r} has {backlog} webhook deliveries not yet made "
            f"(INFERQ_TENANT_MAX_WEBHOOKS={self.max_webhooks}); is its target down?",
            WEBHOOK_RETRY_S,
            "tenant_webhooks",
        )

    def limit(self, items: int, rate: float, timeout_s: float) -> int:
        """Items the queue may hold, this job included, for the job to finish in time."""
        if rate <= 0:
            return self.max_queue
        return min(self.max_queue, max(items, int(rate * timeout_s)))

    def too_many_bytes(self, model: str, held: int, items: int, rate: float) -> Overloaded:
        """The refusal when the model's queue holds `held` input bytes, over its cap."""
        retry = max(1, math.ceil(items / rate)) if rate > 0 else 1
        return Overloaded(
            f"model {model!r} holds {held} input bytes in Redis "
            f"(INFERQ_MAX_QUEUE_BYTES={self.max_queue_bytes})",
            retry,
            "queue_bytes",
        )

    def too_many_items(
        self, model: str, depth: int, items: int, rate: float, timeout_s: float
    ) -> Overloaded:
        """The refusal when `depth` items are queued and this job's `items` do not fit under
        `limit`: the queue is full, or its wait would pass the job's deadline."""
        # Retry when enough of the queue ahead has drained for this job to fit.
        excess = depth + items - self.limit(items, rate, timeout_s)
        if rate > 0:
            retry = max(1, math.ceil(excess / rate))
        else:
            retry = max(1, math.ceil(depth / UNKNOWN_RATE))
        # Without a rate the only bound is the item cap (a pinned job meets its shard's share
        # of it, so the total may still be under `max_queue`).
        if rate <= 0 or depth + items > self.max_queue:
            return Overloaded(
                f"model {model!r} has {depth} items queued (INFERQ_MAX_QUEUE={self.max_queue})",
                retry,
                "queue_full",
            )
        return Overloaded(
            f"predicted wait {depth / rate:.1f}s ({depth} items at {rate:.0f}/s) exceeds the "
            f"job's deadline of {timeout_s:g}s",
            retry,
            "deadline",
        )
