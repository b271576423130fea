"""What the queue's calls take and give: an entry a worker read, a final outcome to write,
a claimed job, what a submit did. Plain values, no Redis (`inferq.shared.queue` moves them)."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.shared.jobs import Job


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A request's Idempotency-Key as the scripts take it: the key's hash, how long the key
    lives, and the digest of the request that first used it ('' for none): a repeat must
    match it."""

    key_hash: str
    ttl_s: int = 86_400
    fingerprint: str = ""


@dataclass(slots=True)
class Entry:
    """One stream entry as read by a worker."""

    stream: str
    entry_id: str
    job_id: str


@dataclass(slots=True)
class Final:
    """A final outcome to write for one job, with the stream entry to ack after it."""

    model: str
    stream: str
    entry_id: str
    job_id: str
    fields: dict[str, bytes]
    dead_letter: bool = False
    tenant: str = ""  # whose counters the job holds (SUBMIT marked it): FINISH frees them


@dataclass(slots=True)
class Claimed:
    """A job as `claim` read it, and whether the claim also counted its device start."""

    job: Job
    started: bool = False


@dataclass(slots=True)
class Submitted:
    """What `submit` did: `created`, or `duplicate` of `job_id`, or refused: `full` (items
    queued = `depth`), `full_bytes` (bytes queued), `tenant_full` (the tenant's items) or
    `tenant_bytes` (the tenant's bytes)."""

    outcome: str
    job_id: str = ""
    entry_id: str = ""
    depth: int = 0
    replicas: int | None = None  # replicas that acknowledged it (WAIT), when asked for
