"""Every Redis key and channel inferq uses, built here and nowhere else.

| builder                | type    | lifetime                                   |
|------------------------|---------|--------------------------------------------|
| `stream(model)`        | stream  | forever; entries deleted once acked         |
| `GROUP`                | group   | consumer group on each stream               |
| `job(job_id)`          | hash    | `result_ttl_s` once final, else until final |
| `done_channel(job_id)` | pub/sub | message = "final" when the job is final      |
| `DONE_PATTERN`         | pattern | what each API process subscribes to         |
| `workers(model)`       | zset    | member = worker id, score = beat expiry ms  |
| `worker(worker_id)`    | hash    | heartbeat record, TTL `heartbeat_ttl_s`     |
| `dead(model)`          | stream  | dead-lettered entries                       |
"""

from __future__ import annotations

PREFIX = "inferq"
GROUP = "workers"
DONE_PATTERN = f"{PREFIX}:done:*"


def stream(model: str) -> str:
    """The job stream of one model: entries `{job: <id>}`."""
    return f"{PREFIX}:{model}:jobs"


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
