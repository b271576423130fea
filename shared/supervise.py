"""Every background loop's one supervisor: a step called over and over under a named policy.

A loop is a `step` (one pass: a scan, a read, a beat, one post) that `Supervisor.run` calls
while `running()` holds, until the step returns `DONE`. What a failed step means is the
policy, and there are two:

- `SURVIVE` (the API's loops: batch leases and runs, webhook read and upkeep, the completion
  subscriber): nothing a step raises ends the loop. An API process keeps serving HTTP
  either way, so a loop that died on one bad reply would leave its duty undone unnoticed;
  the next pass may work.
- `STOP` (the worker's tasks: consume, schedule, publish, heartbeat): Redis away or refusing
  writes (`QueueUnavailable`) is ridden out as above, since a restart would not bring it
  back; anything else is raised, which ends the worker's run and so the process. Its own
  supervisor (compose, Kubernetes) starts a fresh one, and the jobs it held are taken over
  by other workers: a worker limping on with a dead task would hold jobs it never finishes.

Every failure is counted the same way, `inferq_background_errors_total{loop=<name>}` (on the
API's or the worker's registry, `inferq.shared.metrics`). The first failure of a streak is
logged (one line when Redis is away, a traceback for anything else), the rest of the streak
at debug only, so an outage is one line and not one per retry; the first success after a
streak logs the recovery. Between failures the loop waits on `inferq.shared.retry`'s
schedule. `asyncio.CancelledError` is never caught (it is not an `Exception`): cancelling
the task is how every loop is stopped.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from inferq.shared.errors import QueueUnavailable
from inferq.shared.retry import Backoff

__all__ = ["DONE", "STOP", "SURVIVE", "Done", "Policy", "Step", "Supervisor"]

log = logging.getLogger("inferq.supervise")


class Policy(enum.Enum):
    """What a failed step does to its loop (see the module docstring)."""

    SURVIVE = "survive"  # count, log once per streak, back off, go on
    STOP = "stop"  # as SURVIVE while Redis is away; anything else is raised


SURVIVE = Policy.SURVIVE
STOP = Policy.STOP


class Done(enum.Enum):
    """What a step returns when its loop has finished its work (a batch run to its end)."""

    DONE = "done"


DONE = Done.DONE

#: One pass of a loop: None to be called again, `DONE` to end the loop.
Step = Callable[[], Awaitable[Done | None]]


def _always() -> bool:
    return True


class Supervisor:
    """One named loop's failures: counted, logged once per streak, backed off; raised when
    the policy does not survive them. `run` drives a loop; a loop that paces itself (a lease
    renewal) calls `failed` and `succeeded` around its own calls instead."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        errors: Counter | None = None,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """`errors`: the `inferq_background_errors` counter (labelled here by `name`); None
        counts nothing (tests). `backoff`: the wait schedule between failures (default
        0.1 s doubling to 5 s). `sleep`: how to wait it out (default `asyncio.sleep`, looked
        up when `run` starts, so a test's patch applies)."""
        self.name = name
        self.policy = policy
        self._errors = errors.labels(loop=name) if errors is not None else None
        self._backoff = backoff if backoff is not None else Backoff()
        self._sleep = sleep
        self.failures = 0  # in the current streak
        self._streak_since = 0.0  # time.monotonic() at the streak's first failure

    def survives(self, e: Exception) -> bool:
        """Whether the loop goes on after `e` (always under SURVIVE; under STOP only while
        Redis is away)."""
        return self.policy is Policy.SURVIVE or isinstance(e, QueueUnavailable)

    async def run(self, step: Step, running: Callable[[], bool] = _always) -> None:
        """Call `step` while `running()` holds, until it returns `DONE`; after a failure the
        policy survives, wait `failed`'s delay and call it again.

        Raises what the policy does not survive (counted and logged first);
        `asyncio.CancelledError` always propagates."""
        sleep = self._sleep or asyncio.sleep
        while running():
            try:
                outcome = await step()
            except Exception as e:  # the loop's boundary; CancelledError passes (BaseException)
                if not self.survives(e):
                    self._stopping(e)
                    raise
                await sleep(self.failed(e))
                continue
            self.succeeded()
            if outcome is DONE:
                return

    def failed(self, e: Exception) -> float:
        """Count `e`, log it if it opens a streak; the delay before the next try (seconds)."""
        if self._errors is not None:
            self._errors.inc()
        delay = self._backoff.next()
        self.failures += 1
        if self.failures > 1:
            log.debug("%s failed again (%d in a row): %s", self.name, self.failures, e)
            return delay
        self._streak_since = time.monotonic()
        if isinstance(e, QueueUnavailable):  # an outage, not a bug: no traceback
            log.warning("%s failing (%s); retrying in %.1fs", self.name, e, delay)
        else:
            log.error("%s failed; backing off %.1fs", self.name, delay, exc_info=e)
        return delay

    def succeeded(self) -> None:
        """The loop works (again): a streak ends with one line, and the backoff restarts."""
        if not self.failures:
            return
        log.info(
            "%s recovered after %d failures in %.1fs",
            self.name,
            self.failures,
            time.monotonic() - self._streak_since,
        )
        self.failures = 0
        self._backoff.reset()

    def _stopping(self, e: Exception) -> None:
        """STOP's end: counted, and named here; the traceback goes up with the exception to
        the process's boundary, which reports it once."""
        if self._errors is not None:
            self._errors.inc()
        log.error("%s failed (%s: %s); stopping the process", self.name, type(e).__name__, e)
