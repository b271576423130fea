"""The worker's heartbeat: every `heartbeat_s`, a snapshot of the worker goes to the registry.

The worker's composition root builds it; the worker hands `loop` a function that returns a
`Snapshot` (its beat record, the entries it holds, whether a batch is stuck) and one told of
entries another worker took over; the heartbeat only writes the snapshot (`WorkerRegistry.beat`), so it
reads no worker attributes and can be tested with any snapshot. Held entries are kept fresh
only while the device makes progress: a batch stuck past the visibility timeout stops the
refresh, and the entries become claimable by others: the heartbeat runs on the event loop,
not the model thread, so a beat alone would keep a wedged worker's jobs from everyone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from inferq.shared.registry import WorkerBeat, WorkerRegistry
from inferq.shared.retry import Backoff
from inferq.shared.supervise import STOP, Supervisor

log = logging.getLogger("inferq.worker")


@dataclass(frozen=True, slots=True)
class Snapshot:
    beat: WorkerBeat
    held: dict[str, list[str]] = field(default_factory=dict)  # stream → entry ids
    stuck: bool = False  # a batch has run longer than the visibility timeout


Lost = Callable[[dict[str, list[str]]], None]  # held entries another worker took over


def _ignore(lost: dict[str, list[str]]) -> None:
    pass


class Heartbeat:
    def __init__(
        self,
        registry: WorkerRegistry,
        *,
        period_s: float,
        ttl_s: float,
        stuck_after_s: float,
        errors: Counter | None = None,
    ) -> None:
        self.registry = registry
        self.period_s = period_s
        self.ttl_ms = int(ttl_s * 1000)
        self.stuck_after_s = stuck_after_s
        self._warned_stuck = False
        # A missed beat is retried every period, not on the growing backoff: a wait past the
        # TTL would let this worker look dead, and its jobs be taken, after Redis is back.
        period = Backoff(period_s, period_s)
        self._supervisor = Supervisor("heartbeat", STOP, errors, backoff=period)

    async def loop(self, snapshot: Callable[[], Snapshot], on_lost: Lost) -> None:
        """Beat every `period_s` until cancelled (`inferq.shared.supervise`, STOP). Redis
        down or refusing writes (NOREPLICAS, MISCONF, OOM: all `QueueUnavailable`) skips
        beats, never ends the loop: the next period is the retry, and one line says when
        beats stopped and one when they resumed. Anything else ends the worker."""

        async def beat_then_wait() -> None:
            await self.beat(snapshot, on_lost)
            await asyncio.sleep(self.period_s)

        await self._supervisor.run(beat_then_wait)

    async def beat(self, snapshot: Callable[[], Snapshot], on_lost: Lost = _ignore) -> None:
        snap = snapshot()
        lost = await self.registry.beat(snap.beat, self.ttl_ms, None if snap.stuck else snap.held)
        if lost:
            on_lost(lost)
        if snap.stuck and not self._warned_stuck:
            log.error(
                "batch running for over %.0fs: no longer refreshing held entries",
                self.stuck_after_s,
            )
        self._warned_stuck = snap.stuck

    async def unregister(self, worker_id: str, model: str) -> None:
        await self.registry.unregister(worker_id, model)
