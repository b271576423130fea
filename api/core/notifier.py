"""One pub/sub subscriber per API process, fanning completions out to local waiters.

Pub/sub is at-most-once: a message published while we reconnect is gone. So a waiter
registers first, then reads the job record, re-reads on a timer, and every waiter is
woken to re-read after each (re)subscribe. A missed message can delay, never lose, a result.

A completion message usually carries the final record (see the FINISH script): the
waiter's future resolves with it, so the answer needs no read back. The last `RECENT`
completions are remembered, so a watch registered just after its job's
message arrived resolves at once: a caller that has just submitted a job can skip the
first read (the job is queued, or done and remembered) without risking a re-read delay.

The subscription is a supervised loop (`inferq.shared.supervise`, SURVIVE, loop `notifier`):
a drop is counted, logged once per outage, and resubscribed with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

from prometheus_client import Counter
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.jobs import Job, decode_published
from inferq.shared.redis_conn import unavailable
from inferq.shared.supervise import SURVIVE, Supervisor

RECENT = 4096  # completions remembered (every API process hears every model's completions)


class Notifier:
    def __init__(self, redis: Redis, errors: Counter | None = None) -> None:
        """`errors`: the API's `inferq_background_errors` counter (None: not counted)."""
        self._redis = redis
        self._supervisor = Supervisor("notifier", SURVIVE, errors)
        self._waiters: dict[str, set[asyncio.Future[bytes | None]]] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._supervisor.run(self._listen), name="notifier")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.wake_all()
        await self._redis.aclose()

    def watch(self, job_id: str) -> asyncio.Future[bytes | None]:
        """A future resolved when `job_id` may have changed, with the completion message's
        payload when there is one (`decode_published`); register before reading the job."""
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        if job_id in self._recent:
            fut.set_result(None)
        self._waiters.setdefault(job_id, set()).add(fut)
        return fut

    def unwatch(self, job_id: str, fut: asyncio.Future[bytes | None]) -> None:
        waiters = self._waiters.get(job_id)
        if waiters is not None:
            waiters.discard(fut)
            if not waiters:
                del self._waiters[job_id]

    def _done(self, job_id: str, payload: bytes | None = None) -> None:
        self._recent[job_id] = None  # ids only: payloads can be large
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        self._wake(job_id, payload)

    def _wake(self, job_id: str, payload: bytes | None = None) -> None:
        for fut in self._waiters.pop(job_id, ()):
            if not fut.done():
                fut.set_result(payload)

    def wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    @unavailable  # a dropped connection is an outage (one line), not a bug (a traceback)
    async def _listen(self) -> None:
        """Subscribe and hand out completions until the subscription drops (it raises: the
        supervisor backs off and calls again, and every waiter re-reads meanwhile)."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            # A cluster client learns the slot map on its first command, and its pubsub
            # picks a node from that map: ask something first (after a failover too).
            await self._redis.ping()
            await pubsub.psubscribe(keys.DONE_PATTERN)
            self.connected.set()
            self.wake_all()  # anything published while we were away: re-read
            self._supervisor.succeeded()  # subscribed: an outage ends here, not at a drop
            async for msg in pubsub.listen():
                if msg and msg.get("type") == "pmessage":
                    channel = msg["channel"]
                    if isinstance(channel, bytes):
                        channel = channel.decode()
                    data = msg.get("data")
                    payload = data if isinstance(data, bytes) and data != b"final" else None
                    self._done(keys.job_id_from_channel(channel), payload)
        except Exception:  # any drop: waiters re-read now rather than at their next timer
            self.connected.clear()
            self.wake_all()
            raise
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()


def published_job(payload: bytes | None, job_id: str, tenant: str) -> Job | None:
    """The final job a completion message carried (`watch`'s result), if it is `tenant`'s
    `job_id`; None: read it back instead (the read applies the tenant check)."""
    job = decode_published(payload) if payload else None
    if job is None or job.id != job_id or job.tenant != tenant or not job.status.is_final:
        return None
    return job
