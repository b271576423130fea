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
"""

from __future__ import annotations

PREFIX = "inferq"
GROUP = "workers"
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
