"""Idempotency-Key: what a key is bound to (a digest of the request that first used it) and
the refusal of a key sent again with a different request."""

from __future__ import annotations

import hashlib

import msgpack
import orjson

from inferq.shared.errors import InputInvalid
from inferq.shared.jobs import Job


class KeyReused(InputInvalid):
    """An Idempotency-Key sent again with a different request (422): answering with the
    first request's job would hand one request another's outputs."""


def key_reused(key: str | None, job_id: str) -> KeyReused:
    shown = f" {key[:64]!r}" if key is not None else ""
    return KeyReused(
        f"Idempotency-Key{shown} was first used for a different request (job {job_id}): its "
        "model, inputs, parameters or webhook differ; use a new key for a new request"
    )


def request_fingerprint(job: Job) -> str:
    """A digest of what decides a job's outputs and where they go (model, inputs, parameters,
    webhook), bound to its Idempotency-Key: the same request sent to another route, or again
    with another deadline or lane, matches; different inputs do not."""
    h = hashlib.sha256()
    h.update(msgpack.packb([job.model, job.webhook], use_bin_type=True))
    h.update(orjson.dumps(job.parameters, option=orjson.OPT_SORT_KEYS))
    for value in job.inputs:  # one input at a time: no second copy of a large job
        h.update(msgpack.packb(value, use_bin_type=True))
    return h.hexdigest()
