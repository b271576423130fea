"""Every Redis key and channel inferq uses, built here and nowhere else.

**The hash-tag rule** (what makes Redis Cluster work): every key one Lua script touches
carries the same hash tag `{...}`, so it lands in one slot. A model's queue is split into
`INFERQ_STREAM_SHARDS` shards, and everything one shard's scripts touch is tagged
`{<model>.<shard>[~k]}` (`tag`): its lane streams, admission counters, dead letters, idempotency keys,
webhook deliveries, result cache, and the records of the jobs queued on it. A job id starts
with its shard's tag (`<tag>.<random>`), so `job(id)` finds the record without a
lookup. Batches and files are tagged by their own id; the worker registry and model info are
read and written outside scripts and need no tag. On one Redis the tags change nothing.

| builder                          | type    | lifetime                                   |
|----------------------------------|---------|--------------------------------------------|
| `stream(model, lane, shard)`     | stream  | forever; entries deleted once acked         |
| `queued_items(model, shard)`     | string  | counter: items accepted and not yet final    |
| `queued_bytes(model, shard)`     | string  | counter: input bytes accepted and not yet final |
| `tenant_items(model, shard, t)`  | string  | counter: the tenant's items accepted and not yet final (when capped) |
| `tenant_bytes(model, shard, t)`  | string  | counter: the tenant's input bytes accepted and not yet final |
| `tenant_webhooks(model, shard, t)` | string | counter: the tenant's webhook deliveries queued and not settled |
| `tenant_jobs(model, shard, t[, brief])` | zset | the tenant's jobs on one shard: member = the record's key (`job`), score = created ms: `GET /v1/jobs`'s index; `brief`: those kept INFERQ_SYNC_RESULT_TTL_S. SUBMIT and CACHED add (KEEP moves one to the other); they and the listing drop members whose record is gone |
| `idempotency(t, h, model, shard)`| string  | job id for (tenant, key hash), `idempotency_ttl_s` |
| `GROUP`                          | group   | consumer group on each stream               |
| `job(job_id)`                    | hash    | `result_ttl_s` once final, else until final |
| `done_channel(job_id[, listener])` | pub/sub | message = the fields FINISH wrote and the worker's progress fields (or "final"); with `listener`: to that API process only |
| `listener_pattern(listener)`     | pattern | what an API process subscribes to: its own jobs' completions |
| `DONE_PATTERN`                   | pattern | every completion (tools and tests)          |
| `workers(model)`                 | zset    | member = worker id, score = beat expiry ms  |
| `worker(worker_id)`              | hash    | heartbeat record, TTL `heartbeat_ttl_s`     |
| `dead(model, shard)`             | stream  | dead-lettered entries                       |
| `model_info(model)`              | hash    | what the model takes and gives (its workers write it at start; no TTL) |
| `webhooks(model, shard)`         | stream  | one entry `{job: id, record: final record}` per final job with a webhook (`{delivery}` when a retry comes back); acked once settled |
| `webhook_retry(model, shard)`    | zset    | deliveries waiting for their next attempt, score = due ms |
| `webhook_dead(model, shard)`     | stream  | deliveries given up after `webhook_max_age_s` |
| `cache(digest, model, shard)`    | string  | cached outputs (packed), TTL `cache_ttl_s` |
| `cache_index(model, shard)`      | zset    | member = cache key, score = its expiry ms: eviction order |
| `cache_sizes(model, shard)`      | hash    | cache key → bytes it holds |
| `cache_bytes(model, shard)`      | string  | counter: bytes held by the shard's cache, bounded by its share of `cache_max_bytes` |
| `file(file_id)`                  | hash    | an uploaded file's metadata, TTL `batch_file_ttl_s` |
| `file_content(file_id)`          | string  | the file's bytes, same TTL |
| `file_upload(file_id, writer)`   | string  | one writer's bytes of a file until whole, then RENAMEd to `file_content`; TTL renewed per chunk |
| `files(tenant)`                  | zset    | a tenant's file ids by creation second |
| `batch(batch_id)`                | hash    | a batch's record (status, counts, file ids), TTL `batch_file_ttl_s` |
| `batch_results(batch_id)`        | hash    | line number → its output or error line, as lines finish |
| `batches(tenant)`                | zset    | a tenant's batch ids by creation second |
| `BATCHES_ACTIVE`                 | set     | batches not yet final: what the API processes' batch runners work on |
| `batch_lease(batch_id)`          | string  | which API process runs the batch now (SET NX PX) |

The result cache lives beside the job records under its own prefix and does its own
bounded eviction (`cache_index` + `cache_sizes`, in the FINISH script): Redis runs with
`noeviction`, so a full cache can never push out a job record.
"""

from __future__ import annotations

import functools

from redis.crc import key_slot

from inferq.shared.schema import LANES as LANES  # highest first: a stream per lane and shard

PREFIX = "inferq"
GROUP = "workers"
WEBHOOK_GROUP = "deliverers"
BATCHES_ACTIVE = f"{PREFIX}:batches:active"
DONE_PATTERN = f"{PREFIX}:done:*"


SLOTS = 16384


#: Both key roots below are cached, bounded: a model name reaches them only once the catalog
#: has accepted it, and the bound keeps a long-lived process's cache small whatever it meets.
_CACHED = 4096


@functools.lru_cache(maxsize=_CACHED)
def tag(model: str, shard: int = 0, shards: int = 1) -> str:
    """Shard `shard` of `shards` of `model`'s queue: `{tag}` is the hash tag of its keys.

    `<model>.<shard>`, or `<model>.<shard>~<k>` with the least k that puts the tag's slot in
    the middle half of the shard's share of the slot space (shard s of n: the s-th n-th). A
    cluster whose masters hold equal slot ranges, as `redis-cli --cluster create` makes them,
    then serves n shards from n different masters (n ≤ masters), not wherever CRC16 falls.
    """
    base = f"{model}.{shard}"
    if shards <= 1:
        return base
    lo, hi = shard * SLOTS // shards, (shard + 1) * SLOTS // shards
    lo, hi = lo + (hi - lo) // 4, hi - (hi - lo) // 4
    k = 0
    while not lo <= key_slot((candidate := f"{base}~{k}" if k else base).encode()) < hi:
        k += 1
    return candidate


@functools.lru_cache(maxsize=_CACHED)
def _q(model: str, shard: int, shards: int) -> str:
    return f"{PREFIX}:{{{tag(model, shard, shards)}}}"


def job_shard(job_id: str) -> tuple[str, int] | None:
    """(model, shard) a job id was made for (`<tag>.<random>`), or None for an id of another
    shape (a client's guess, a test's literal): such a record is untagged."""
    where, dot, rest = job_id.rpartition(".")
    model, dot2, label = where.rpartition(".")
    shard = label.split("~", 1)[0]
    if not dot or not dot2 or not model or not rest or not shard.isdigit():
        return None
    return model, int(shard)


def stream(model: str, lane: str = "normal", shard: int = 0, shards: int = 1) -> str:
    """The job stream of one model, priority lane and shard: entries `{job: <id>}`."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}; lanes are {LANES}")
    return (
        f"{_q(model, shard, shards)}:jobs"
        if lane == "normal"
        else f"{_q(model, shard, shards)}:jobs:{lane}"
    )


def streams(model: str, shard: int = 0, shards: int = 1) -> list[str]:
    """All lanes of one model's shard, highest priority first."""
    return [stream(model, lane, shard, shards) for lane in LANES]


def queued_items(model: str, shard: int = 0, shards: int = 1) -> str:
    """Items accepted on one shard of `model` and not yet final: the admission counter."""
    return f"{_q(model, shard, shards)}:queued_items"


def queued_bytes(model: str, shard: int = 0, shards: int = 1) -> str:
    """Input bytes accepted on one shard of `model` and not yet final: the byte counter."""
    return f"{_q(model, shard, shards)}:queued_bytes"


# A tenant in a key is the operator's name for it (INFERQ_API_KEYS), never a client's string;
# "-" for the open API's "".
def tenant_items(model: str, shard: int, shards: int, tenant: str) -> str:
    """Items `tenant` has accepted on one shard of `model` and not yet final."""
    return f"{_q(model, shard, shards)}:tenant:{tenant or '-'}:items"


def tenant_bytes(model: str, shard: int, shards: int, tenant: str) -> str:
    """Input bytes `tenant` has accepted on one shard of `model` and not yet final."""
    return f"{_q(model, shard, shards)}:tenant:{tenant or '-'}:bytes"


def tenant_webhooks(model: str, shard: int, shards: int, tenant: str) -> str:
    """Webhook deliveries of `tenant`'s jobs on one shard, queued and not yet settled."""
    return f"{_q(model, shard, shards)}:tenant:{tenant or '-'}:webhooks"


def tenant_jobs(model: str, shard: int, shards: int, tenant: str, brief: bool = False) -> str:
    """`tenant`'s jobs on one shard of `model` (zset: member = the record's key, `job(id)`;
    score = created ms). In the shard's slot, so the scripts that make a job add it in the
    same step; members are keys so a script checks one with EXISTS, building nothing.
    `brief`: the jobs kept INFERQ_SYNC_RESULT_TTL_S, apart, so that each index holds records
    that expire in the order they were made and its oldest members can be trimmed."""
    return f"{_q(model, shard, shards)}:tenant:{tenant or '-'}:{'brief' if brief else 'jobs'}"


def model_info(model: str) -> str:
    """What `model` accepts and returns, as its workers declare it (`registry.ModelInfo`)."""
    return f"{PREFIX}:{model}:info"


def idempotency(tenant: str, key_hash: str, model: str, shard: int = 0, shards: int = 1) -> str:
    """Maps a client's Idempotency-Key (hashed) to the job it created on this shard."""
    return f"{_q(model, shard, shards)}:idem:{tenant or '-'}:{key_hash}"


def dead(model: str, shard: int = 0, shards: int = 1) -> str:
    """Dead-letter stream of one model's shard."""
    return f"{_q(model, shard, shards)}:dead"


def job(job_id: str) -> str:
    """The job record hash, in its shard's slot: `inferq:job:{<tag>}.<random>`."""
    if job_shard(job_id) is None:
        return f"{PREFIX}:job:{job_id}"
    where, _, rest = job_id.rpartition(".")
    return f"{PREFIX}:job:{{{where}}}.{rest}"


def job_id_of(record_key: str) -> str:
    """The job id whose record is `record_key` (the inverse of `job`)."""
    rest = record_key.removeprefix(f"{PREFIX}:job:")
    if rest.startswith("{") and "}." in rest:
        where, _, random = rest[1:].partition("}.")
        return f"{where}.{random}"
    return rest


def done_channel(job_id: str, listener: str = "") -> str:
    """Channel FINISH publishes on when `job_id` becomes final: to each API process the
    record names (`listener`: its Notifier's id), else unaddressed. PUBLISH reaches every
    node of a cluster, so one subscriber per API process hears all shards."""
    return f"{PREFIX}:done:{listener}:{job_id}" if listener else f"{PREFIX}:done:{job_id}"


def listener_pattern(listener: str) -> str:
    """What the API process `listener` subscribes to: only the completions sent to it."""
    return f"{PREFIX}:done:{listener}:*"


def job_id_from_channel(channel: str) -> str:
    return channel.rsplit(":", 1)[-1]


def workers(model: str) -> str:
    """Live workers of one model (zset scored by heartbeat expiry, ms)."""
    return f"{PREFIX}:{model}:workers"


def worker(worker_id: str) -> str:
    """One worker's heartbeat hash."""
    return f"{PREFIX}:worker:{worker_id}"


def webhooks(model: str, shard: int = 0, shards: int = 1) -> str:
    """Deliveries to make for the final jobs of one shard (one entry per job)."""
    return f"{_q(model, shard, shards)}:webhooks"


def webhook_retry(model: str, shard: int = 0, shards: int = 1) -> str:
    """Deliveries waiting for their next attempt (zset, score = due ms)."""
    return f"{_q(model, shard, shards)}:webhooks:retry"


def webhook_dead(model: str, shard: int = 0, shards: int = 1) -> str:
    """Deliveries given up after `webhook_max_age_s`."""
    return f"{_q(model, shard, shards)}:webhooks:dead"


def cache(digest: str, model: str, shard: int = 0, shards: int = 1) -> str:
    """One cached result: the packed outputs of a succeeded job of this shard."""
    return f"{_q(model, shard, shards)}:cache:{digest}"


def cache_index(model: str, shard: int = 0, shards: int = 1) -> str:
    return f"{_q(model, shard, shards)}:cache-index"


def cache_sizes(model: str, shard: int = 0, shards: int = 1) -> str:
    return f"{_q(model, shard, shards)}:cache-sizes"


def cache_bytes(model: str, shard: int = 0, shards: int = 1) -> str:
    return f"{_q(model, shard, shards)}:cache-bytes"


def file(file_id: str) -> str:
    return f"{PREFIX}:file:{{{file_id}}}"


def file_content(file_id: str) -> str:
    return f"{PREFIX}:file:{{{file_id}}}:content"


def file_upload(file_id: str, writer: str) -> str:
    """The content key's hash tag, so the RENAME into place stays in one cluster slot."""
    return f"{file_content(file_id)}:upload:{writer}"


def files(tenant: str) -> str:
    return f"{PREFIX}:files:{tenant or '-'}"


def batch(batch_id: str) -> str:
    return f"{PREFIX}:batch:{{{batch_id}}}"


def batch_results(batch_id: str) -> str:
    return f"{PREFIX}:batch:{{{batch_id}}}:results"


def batches(tenant: str) -> str:
    return f"{PREFIX}:batches:{tenant or '-'}"


def batch_lease(batch_id: str) -> str:
    return f"{PREFIX}:batch:{{{batch_id}}}:lease"
