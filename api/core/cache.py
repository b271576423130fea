"""The result cache: an identical request (same model weights, inputs and parameters, same
tenant unless `INFERQ_CACHE_SHARED`) is answered from Redis without queueing.

The API looks up; the worker never does. A miss records in the job where its outputs go
(`JobField.CACHE`), and the FINISH script stores them when the job succeeds, in the same
atomic step that makes it final, bounded by `INFERQ_CACHE_MAX_BYTES` (see `keys`). A hit is
recorded as a job that is final at birth (`JobProducer.record_cached`), so `GET /v1/jobs/{id}`,
idempotency keys and webhooks work for it as for any job, and its timings say `cached`.

The key covers the model's `version` as its workers declared it (`registry.ModelInfo`): new
weights make new keys, and entries of the old ones age out by TTL. Until a worker of the
model has declared itself, nothing is cached.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
from redis.asyncio import Redis

from inferq.shared.jobs import Job
from inferq.shared.queue import per_shard
from inferq.shared.redis_conn import unavailable
from inferq.shared.schema import SCHEMA_VERSION
from inferq.shared.settings import Settings


def _canonical(value: Any) -> Any:
    """`value` with every map as key-sorted pairs, so equal parameters hash equally."""
    if isinstance(value, dict):
        return [[k, _canonical(v)] for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def cache_key(job: Job, version: str, *, shared: bool) -> str:
    """The digest naming `job`'s result: a hash of everything that decides the outputs. The
    Redis key is `keys.cache(digest, model, shard)`: each queue shard caches what it ran."""
    scope = "*" if shared else f"tenant:{job.tenant}"
    payload = msgpack.packb(
        [SCHEMA_VERSION, job.model, version, scope, job.inputs, _canonical(job.parameters)],
        use_bin_type=True,
    )
    return hashlib.sha256(payload).hexdigest()


class ResultCache:
    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.ttl_s = settings.cache_ttl_s
        self.models = frozenset(settings.cache_models)
        self.shared = settings.cache_shared
        # Each shard bounds its own cache (one script sees one slot): an even share each.
        self.max_bytes = per_shard(settings.cache_max_bytes, settings.stream_shards)
        self.redis = redis

    def enabled(self, model: str) -> bool:
        return self.ttl_s > 0 and (not self.models or model in self.models)

    def digest(self, job: Job, version: str) -> str:
        return cache_key(job, version, shared=self.shared)

    def spec(self, key: str) -> dict[str, Any]:
        """What the FINISH script needs to fill the cache (`JobField.CACHE`)."""
        return {"key": key, "ttl_s": self.ttl_s, "max_bytes": self.max_bytes}

    @unavailable
    async def get(self, key: str) -> bytes | None:
        """The packed outputs cached under `key`, or None."""
        value = await self.redis.get(key)
        return value.encode() if isinstance(value, str) else value
