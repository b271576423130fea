"""Every Redis key and channel inferq uses, built here and nowhere else.

| builder                | type    | lifetime                                   |
|------------------------|---------|--------------------------------------------|
| `stream(model, lane)`  | stream  | forever; entries deleted once acked         |
| `queued_items(model)`  | string  | counter: items accepted and not yet final    |
| `idempotency(t, h)`    | string  | job id for (tenant, key hash), `idempotency_ttl_s` |
| `GROUP`                | group   | consumer group on each stream               |
| `job(job_id)`          | hash    | `result_ttl_s` once final, else until final |
| `done_channel(job_id)` | pub/sub | message = "final" when the job is final      |
| `DONE_PATTERN`         | pattern | what each API process subscribes to         |
| `workers(model)`       | zset    | member = worker id, score = beat expiry ms  |
| `worker(worker_id)`    | hash    | heartbeat record, TTL `heartbeat_ttl_s`     |
| `dead(model)`          | stream  | dead-lettered entries                       |
| `model_info(model)`    | hash    | what the model takes and gives (its workers write it at start; no TTL) |
| `queued_bytes(model)`  | string  | counter: input bytes accepted and not yet final |
| `webhooks()`           | stream  | one entry `{job: id}` per final job with a webhook; acked once delivered |
| `webhook_retry()`      | zset    | deliveries waiting for their next attempt, score = due ms |
| `webhook_dead()`       | stream  | deliveries given up after `webhook_max_age_s` |
| `cache(digest)`        | string  | cached outputs (packed), TTL `cache_ttl_s` |
| `cache_index()`        | zset    | member = cache key, score = its expiry ms: eviction order |
| `cache_sizes()`        | hash    | cache key → bytes it holds |
| `cache_bytes()`        | string  | counter: bytes held by the cache, bounded by `cache_max_bytes` |
| `file(file_id)`        | hash    | an uploaded file's metadata, TTL `batch_file_ttl_s` |
| `file_content(file_id)`| string  | the file's bytes, same TTL |
| `files(tenant)`        | zset    | a tenant's file ids by creation second |
| `batch(batch_id)`      | hash    | a batch's record (status, counts, file ids), TTL `batch_file_ttl_s` |
| `batch_results(batch_id)` | hash | line number → its output or error line, as lines finish |
| `batches(tenant)`      | zset    | a tenant's batch ids by creation second |
| `BATCHES_ACTIVE`       | set     | batches not yet final: what the API processes' batch runners work on |
| `batch_lease(batch_id)`| string  | which API process runs the batch now (SET NX PX) |

The result cache lives beside the job records under its own prefix and does its own
bounded eviction (`cache_index` + `cache_sizes`, in the FINISH script): Redis runs with
`noeviction`, so a full cache can never push out a job record.
"""

from __future__ import annotations

PREFIX = "inferq"
GROUP = "workers"
WEBHOOK_GROUP = "deliverers"
BATCHES_ACTIVE = f"{PREFIX}:batches:active"
DONE_PATTERN = f"{PREFIX}:done:*"
#: Priority lanes, highest first; each is its own stream with its own consumer group.
LANES = ("high", "normal", "low")


def stream(model: str, lane: str = "normal") -> str:
    """The job stream of one model and priority lane: entries `{job: <id>}`."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}; lanes are {LANES}")
    return f"{PREFIX}:{model}:jobs" if lane == "normal" else f"{PREFIX}:{model}:jobs:{lane}"


def streams(model: str) -> list[str]:
    """All lanes of one model, highest priority first."""
    return [stream(model, lane) for lane in LANES]


def queued_items(model: str) -> str:
    """Items accepted for `model` and not yet final: the admission counter."""
    return f"{PREFIX}:{model}:queued_items"


def queued_bytes(model: str) -> str:
    """Input bytes accepted for `model` and not yet final: the byte admission counter."""
    return f"{PREFIX}:{model}:queued_bytes"


def model_info(model: str) -> str:
    """What `model` accepts and returns, as its workers declare it (`registry.ModelInfo`)."""
    return f"{PREFIX}:{model}:info"


def idempotency(tenant: str, key_hash: str) -> str:
    """Maps a client's Idempotency-Key (hashed) to the job it created."""
    return f"{PREFIX}:idem:{tenant or '-'}:{key_hash}"


def dead(model: str) -> str:
    """Dead-letter stream of one model."""
    return f"{PREFIX}:{model}:dead"


def job(job_id: str) -> str:
    """The job record hash."""
    return f"{PREFIX}:job:{job_id}"


def done_channel(job_id: str) -> str:
    """Channel a worker publishes on when `job_id` becomes final."""
    return f"{PREFIX}:done:{job_id}"


def job_id_from_channel(channel: str) -> str:
    return channel.rsplit(":", 1)[-1]


def workers(model: str) -> str:
    """Live workers of one model (zset scored by heartbeat expiry, ms)."""
    return f"{PREFIX}:{model}:workers"


def worker(worker_id: str) -> str:
    """One worker's heartbeat hash."""
    return f"{PREFIX}:worker:{worker_id}"


def webhooks() -> str:
    """Deliveries to make: one entry per final job that asked for a webhook."""
    return f"{PREFIX}:webhooks"


def webhook_retry() -> str:
    """Deliveries waiting for their next attempt (zset, score = due ms)."""
    return f"{PREFIX}:webhooks:retry"


def webhook_dead() -> str:
    """Deliveries given up after `webhook_max_age_s`."""
    return f"{PREFIX}:webhooks:dead"


def cache(digest: str) -> str:
    """One cached result: the packed outputs of a succeeded job."""
    return f"{PREFIX}:cache:{digest}"


def cache_index() -> str:
    return f"{PREFIX}:cache-index"


def cache_sizes() -> str:
    return f"{PREFIX}:cache-sizes"


def cache_bytes() -> str:
    return f"{PREFIX}:cache-bytes"


def file(file_id: str) -> str:
    return f"{PREFIX}:file:{file_id}"


def file_content(file_id: str) -> str:
    return f"{PREFIX}:file:{file_id}:content"


def files(tenant: str) -> str:
    return f"{PREFIX}:files:{tenant or '-'}"


def batch(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}"


def batch_results(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:results"


def batches(tenant: str) -> str:
    return f"{PREFIX}:batches:{tenant or '-'}"


def batch_lease(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:lease"
