"""The Redis side of webhook delivery, for `webhooks.dispatcher.Dispatcher` and `/v1/health`:
the three scripts that each move a delivery in one step (`Scripts`: PROMOTE, retry zset
back to the stream; SETTLE, done, retry or dead letter, then XACK+XDEL; FORGET, drop an
idle consumer; their Lua is `inferq.shared.lua.webhooks`), and the plain stream calls
around them (the consumer group, XREADGROUP replies, take-over with delivery counts, health
counts).

Keys, one set per (model, queue shard), all under the shard's hash tag (`Shard`):
`keys.webhooks(model, shard)` (the stream, group `keys.WEBHOOK_GROUP`),
`keys.webhook_retry(model, shard)` (the retry zset, scored by due time in ms on Redis' clock),
`keys.webhook_dead(model, shard)` (the dead-letter stream) and, per tenant,
`keys.tenant_webhooks(model, shard, tenant)` (its deliveries not yet settled: FINISH and
CACHED count one up, SETTLE one down when it settles a delivery for good). A delivery stays
on the shard of its job from first read to settling: each script names one shard's keys only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from inferq.shared import keys, lua
from inferq.shared.lua import webhooks as scripts
from inferq.shared.redis_conn import as_str, unavailable

BLOCK_MS = 1000  # XREADGROUP BLOCK: on its own connection (no socket timeout), see the app
POLL_IDLE_S = 0.05  # on a cluster: the pause after a read pass found every stream empty

Entry = tuple[str, dict[bytes, bytes]]


@dataclass(frozen=True)
class Shard:
    """The delivery keys of one (model, queue shard): all carry the shard's hash tag, so one
    script may name them together, on a cluster too."""

    stream: str
    retry: str
    dead: str
    model: str
    index: int  # this shard's number, of `shards`
    shards: int

    @classmethod
    def of(cls, model: str, shard: int, shards: int) -> Shard:
        return cls(
            keys.webhooks(model, shard, shards),
            keys.webhook_retry(model, shard, shards),
            keys.webhook_dead(model, shard, shards),
            model,
            shard,
            shards,
        )

    def tenant_webhooks(self, tenant: str) -> str:
        """`tenant`'s counter of unsettled deliveries on this shard (same hash tag)."""
        return keys.tenant_webhooks(self.model, self.index, self.shards, tenant)


def shards_of(models: Iterable[str], shards: int) -> list[Shard]:
    """Every (model, shard) a FINISH or CACHED script may queue a delivery on."""
    return [Shard.of(m, s, shards) for m in models for s in range(shards)]


def parse_entries(reply: Any) -> list[tuple[str, Entry]]:
    """XREADGROUP's reply, RESP2 or RESP3, as (stream, (entry id, fields))."""
    if isinstance(reply, dict):
        reply = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [
        (as_str(stream), (as_str(eid), fields or {}))
        for stream, items in reply or []
        for eid, fields in items
    ]


@unavailable
async def ensure_group(redis: Redis, shards: Sequence[Shard]) -> None:
    """Create the delivery group (and the stream) of every shard, unless it exists."""
    for shard in shards:
        try:
            await redis.xgroup_create(shard.stream, keys.WEBHOOK_GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise


@unavailable
async def read_each(
    redis: Redis, shards: Sequence[Shard], consumer: str, n: int
) -> list[tuple[Shard, Entry]]:
    """Up to `n` new entries, reading the shards' streams one at a time in the given order
    without blocking: exactly as many as asked for, and one call per slot on a cluster."""
    got: list[tuple[Shard, Entry]] = []
    for shard in shards:
        reply = await redis.xreadgroup(
            keys.WEBHOOK_GROUP, consumer, {shard.stream: ">"}, count=n - len(got)
        )
        got += [(shard, entry) for _, entry in parse_entries(reply)]
        if len(got) >= n:
            break
    return got


class Reader:
    """New entries from every shard's stream, for one consumer.

    How, and why so: one stream (the default) is one blocking read, as ever. With several,
    a pass first reads each in turn without blocking, which takes exactly `n` and lets no
    shard starve the others (each pass starts one shard further on). Only when all are empty
    do we wait: on one Redis with one blocking read naming every stream (any keys go together
    there, and the first entry anywhere wakes it at once). On a cluster a command must stay
    in one slot, and a blocking read per stream would each need a connection and a slot of
    their own, so there we pause `POLL_IDLE_S` and poll again: that much added latency, and
    one cheap read per stream a tick.
    """

    def __init__(self, blocking: Redis, shards: Sequence[Shard], consumer: str) -> None:
        self.blocking, self.shards, self.consumer = blocking, list(shards), consumer
        self.cluster = isinstance(blocking, RedisCluster)
        self._by_stream = {s.stream: s for s in self.shards}
        self._turn = 0

    @unavailable
    async def read(self, n: int) -> list[tuple[Shard, Entry]]:
        """At most `n` entries, but for one race: COUNT is per stream, and n // streams keeps
        the blocking read within n unless entries reach several streams between the pass and
        that read (up to one each then, so at most streams - 1 more)."""
        if len(self.shards) > 1:
            start, self._turn = self._turn, (self._turn + 1) % len(self.shards)
            order = self.shards[start:] + self.shards[:start]
            got = await read_each(self.blocking, order, self.consumer, n)
            if got:
                return got
            if self.cluster:
                await asyncio.sleep(POLL_IDLE_S)
                return []
        reply = await self.blocking.xreadgroup(
            keys.WEBHOOK_GROUP,
            self.consumer,
            {s.stream: ">" for s in self.shards},
            count=max(1, n // len(self.shards)),
            block=BLOCK_MS,
        )
        return [(self._by_stream[stream], entry) for stream, entry in parse_entries(reply)]


@unavailable
async def autoclaim(
    redis: Redis, shards: Sequence[Shard], consumer: str, idle_ms: int, n: int
) -> list[tuple[Shard, Entry, int]]:
    """Up to `n` entries idle past `idle_ms` over all shards, now `consumer`'s, with their
    delivery counts."""
    claimed: list[tuple[Shard, Entry]] = []
    for shard in shards:
        cursor = "0-0"
        for _ in range(10):  # one XAUTOCLAIM scans at most count×10 entries; bounded per pass
            reply = await redis.xautoclaim(
                shard.stream,
                keys.WEBHOOK_GROUP,
                consumer,
                idle_ms,
                start_id=cursor,
                count=n - len(claimed),
            )
            cursor = as_str(reply[0])
            # An entry deleted while pending comes back empty (Redis 6.2) or is dropped (7).
            claimed += [(shard, (as_str(eid), f or {})) for eid, f in reply[1] if eid is not None]
            if cursor == "0-0" or len(claimed) >= n:
                break
        if len(claimed) >= n:
            break
    if not claimed:
        return []
    async with redis.pipeline(transaction=False) as p:  # plain commands: fine on a cluster
        for shard, (eid, _) in claimed:
            p.xpending_range(shard.stream, keys.WEBHOOK_GROUP, eid, eid, 1)
        pending = await p.execute()
    times = [int(p[0]["times_delivered"]) if p else 1 for p in pending]
    return [(shard, entry, t) for (shard, entry), t in zip(claimed, times, strict=True)]


@unavailable
async def counts(redis: Redis, models: Iterable[str], shards: int) -> dict[str, int]:
    """`/v1/health`'s `webhooks`, summed over every model's shards: in the streams (new or in
    flight), waiting to retry, dead."""
    every = shards_of(models, shards)
    async with redis.pipeline(transaction=False) as p:
        for shard in every:
            p.xlen(shard.stream)
            p.zcard(shard.retry)
            p.xlen(shard.dead)
        replies = [int(n) for n in await p.execute()]
    queued, retrying, dead = (sum(replies[i::3]) for i in range(3))
    return {"queued": queued, "retrying": retrying, "dead": dead}


class Scripts:
    """The three delivery scripts, registered once on one client; each call names one
    shard's keys only. Redis failures leave every method as QueueUnavailable."""

    def __init__(self, redis: Redis) -> None:
        self._settle = redis.register_script(lua.source(scripts.SETTLE))
        self._promote = redis.register_script(lua.source(scripts.PROMOTE))
        self._forget = redis.register_script(lua.source(scripts.FORGET))

    @unavailable
    async def settle(
        self,
        shard: Shard,
        consumer: str,
        entry_id: str,
        mode: str,
        *args: bytes | str | int,
        tenant: str | None = None,
    ) -> bool:
        """done | retry (delay ms, record) | dead (maxlen, job id, record, reason), then
        XACK+XDEL, only while `consumer` still holds the entry; False if it does not.
        Settled for good (done, dead) and with a `tenant`, that tenant's counter of unsettled
        deliveries goes one down (never below 0); None: the entry was never counted."""
        script_keys = [shard.stream, shard.retry, shard.dead]
        if tenant is not None and mode != "retry":
            script_keys.append(shard.tenant_webhooks(tenant))
        done = await self._settle(
            keys=script_keys, args=[keys.WEBHOOK_GROUP, consumer, entry_id, mode, *args]
        )
        return bool(done)

    @unavailable
    async def promote(self, shard: Shard, most: int) -> tuple[int, int]:
        """(retries moved back to the stream, ms until the next is due or -1)."""
        moved, next_ms = await self._promote(keys=[shard.retry, shard.stream], args=[most])
        return int(moved), int(next_ms)

    @unavailable
    async def forget(self, shard: Shard, consumer: str) -> bool:
        """Drop `consumer` from the group if it holds nothing."""
        return bool(await self._forget(keys=[shard.stream], args=[keys.WEBHOOK_GROUP, consumer]))
