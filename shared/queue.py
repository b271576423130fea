"""The queue's Redis client, the part both sides share: its connection, its shards, and the
FINISH script (a worker ends the jobs it ran with it; the API ends a job that never ran, a
cancel or an expiry in the queue, with the same guard). The API's side is
`inferq.shared.producer` (`JobProducer`), the worker's `inferq.shared.consumer`
(`JobConsumer`): no class serves both processes.

Writes that matter are the Lua scripts of `inferq.shared.lua.queue` (atomic, retry-safe);
what the calls take and give (`Entry`, `Final`, `Claimed`, `Submitted`) is `queue_types`.
Every public method turns a Redis failure into `QueueUnavailable`
(`inferq.shared.redis_conn.unavailable`).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from inferq.shared import keys, lua
from inferq.shared.jobs import now_ms
from inferq.shared.lua import queue as scripts
from inferq.shared.queue_types import Claimed as Claimed
from inferq.shared.queue_types import Entry as Entry
from inferq.shared.queue_types import Final as Final
from inferq.shared.queue_types import Idempotency as Idempotency
from inferq.shared.queue_types import Submitted as Submitted
from inferq.shared.redis_conn import register

# FINISH's first KEYS, in its order: one shard's counters, dead letters, webhooks and cache.
# Per job, after its record: its tenant's counters (FINISH frees what SUBMIT counted).
_TENANT_KEYS = (keys.tenant_items, keys.tenant_bytes, keys.tenant_webhooks)
_FINISH_SHARD_KEYS = (
    keys.queued_items,
    keys.queued_bytes,
    keys.dead,
    keys.webhooks,
    keys.cache_index,
    keys.cache_sizes,
    keys.cache_bytes,
)


def shard_of(job_id: str) -> int:
    """The queue shard a job id was made for (0 for an id without one)."""
    where = keys.job_shard(job_id)
    return where[1] if where else 0


def per_shard(total: int, shards: int) -> int:
    """One shard's share of a queue-wide bound (admission caps are kept per shard: a script
    sees one slot's counters only)."""
    return -(-total // shards)


class QueueClient:
    """One Redis client and the queue's layout over it.

    `shards`: how many streams each model's queue is spread over (`INFERQ_STREAM_SHARDS`).
    Scripts run per shard (their keys share the shard's hash tag); reads that describe a
    model (depth, position, lanes) add up its shards.
    """

    def __init__(
        self, redis: Redis, *, result_ttl_s: int, shards: int = 1, keep_inputs: bool = False
    ) -> None:
        self.redis = redis
        self.result_ttl_s = result_ttl_s
        self.shards = shards
        self.keep_inputs = keep_inputs  # off: a final record drops its inputs (FINISH)
        # A cluster client refuses scripts inside a pipeline: calls go out side by side.
        self.cluster = isinstance(redis, RedisCluster)
        self._finish = register(redis, lua.source(scripts.FINISH))

    def _finish_args(
        self, model: str, shard: int, finals: Sequence[Final], only_if_queued: bool = False
    ) -> tuple[list[str], list[bytes | str | int]]:
        by_stream: dict[str, list[str]] = {}
        for f in finals:
            if f.stream:  # outcomes written from outside a worker have no entry to ack
                by_stream.setdefault(f.stream, []).append(f.entry_id)
        script_keys = [k(model, shard, self.shards) for k in _FINISH_SHARD_KEYS] + list(by_stream)
        argv: list[bytes | str | int] = [self.result_ttl_s, "1" if only_if_queued else "0"]
        argv += [now_ms(), keys.GROUP, "1" if self.keep_inputs else "0", len(by_stream)]
        for ids in by_stream.values():
            argv += [len(ids), *ids]
        for f in finals:
            script_keys.append(keys.job(f.job_id))
            script_keys += [k(model, shard, self.shards, f.tenant) for k in _TENANT_KEYS]
            argv += [keys.done_channel(f.job_id), "1" if f.dead_letter else "0", 2 * len(f.fields)]
            for k, v in f.fields.items():
                argv += [k, v]
        return script_keys, argv

    def streams(self, model: str) -> list[str]:
        """Every stream of `model`: each shard's lanes."""
        return [s for shard in range(self.shards) for s in keys.streams(model, shard, self.shards)]
