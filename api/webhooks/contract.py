"""Completion webhooks: the contract with the receiver (who signs with which key, what an
attempt carries, what its answer means, when to retry) and the submit-time check.

A job submitted with `"webhook": {"url": ...}` is POSTed its final view (the JSON that
`GET /v1/jobs/{id}` answers) once it ends, however it ends. Across modules:

    FINISH / CACHED script ─XADD {job}─▶ keys.webhooks(model, shard) ─XREADGROUP─▶ Dispatcher
    (`webhooks.dispatcher`, in every API process) ─▶ Poster.attempt (`webhooks.poster`) ─▶
    settle: delivered: XACK+XDEL │ retry: keys.webhook_retry(…) (zset, due ms) │ dead:
    keys.webhook_dead(…)

(one set of keys per model and queue shard, the job's: see `webhooks.store.Shard`)

Every attempt carries `X-Inferq-Delivery` (the same on every attempt of one delivery:
receivers de-duplicate on it), `X-Inferq-Timestamp` (unix seconds of this attempt) and
`X-Inferq-Signature: sha256=<hex HMAC-SHA256(key, timestamp + "." + delivery id + "." +
body)>`. The delivery id is signed so that a captured attempt replayed under a fresh id (to
get past the receiver's de-duplication) fails verification. The URL is not signed: behind a
proxy or a load balancer a receiver cannot reliably rebuild the URL we called, and a
per-tenant key already ties a signature to one receiver. The key is the tenant's
(`INFERQ_WEBHOOK_TENANT_SECRETS`), else `INFERQ_WEBHOOK_SECRET`; with neither, a submit with
a webhook is refused (422). Keys are never logged nor written to Redis.

| attempt result                                         | outcome                       |
|--------------------------------------------------------|-------------------------------|
| 2xx                                                    | delivered                     |
| 408, 429, 5xx, timeout, connection error, no DNS answer | retry (backoff with jitter)   |
| any other status: 3xx (redirects are not followed), 4xx | dead at once: the receiver said no |
| the URL now fails the SSRF guard (`webhooks.ssrf`), or its host is no DNS name | dead at once |

Only timeouts and connection errors count against the target's circuit breaker
(`webhooks.targets`): they are what holds delivery slots. Any HTTP answer, 408, 429 and 5xx
included, came back promptly and shows the target alive; a delivery answered 5xx waits out
its own backoff, so a receiver that fails a few attempts of each delivery still gets every
one within its schedule instead of behind an open circuit's cooldown.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import random
import uuid
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import msgpack
import orjson

from inferq.api.protocols.v1 import job_view
from inferq.api.webhooks import ssrf
from inferq.shared.errors import CodecError, InputInvalid
from inferq.shared.jobs import Job, now_ms
from inferq.shared.settings import Settings

SIGNATURE = "X-Inferq-Signature"
TIMESTAMP = "X-Inferq-Timestamp"
DELIVERY = "X-Inferq-Delivery"
RECORD_VERSION = 1
# Delivery ids are derived, not drawn, so a redelivery after a crash carries the same one.
_DELIVERY_NS = uuid.UUID("5b1e7f3c-6a43-4c8e-9c1d-2f0e8a7d4b11")

Kind = Literal["delivered", "retry", "dead"]


# --- configuration -------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _tenant_keys(raw: str) -> dict[str, bytes]:
    keys: dict[str, bytes] = {}
    for n, pair in enumerate(p.strip() for p in raw.split(",")):
        if not pair:
            continue
        tenant, sep, secret = pair.partition(":")
        if not sep or not tenant.strip() or not secret.strip():
            # The position only: the entry holds a secret.
            raise ValueError(f"INFERQ_WEBHOOK_TENANT_SECRETS entry {n} is not 'tenant:secret'")
        keys[tenant.strip()] = secret.strip().encode()
    return keys


def signing_key(settings: Settings, tenant: str) -> bytes | None:
    """The HMAC key for `tenant`'s deliveries: its own, else the global one, else None."""
    if settings.webhook_tenant_secrets is not None:
        own = _tenant_keys(settings.webhook_tenant_secrets.get_secret_value()).get(tenant)
        if own is not None:
            return own
    if settings.webhook_secret is not None and settings.webhook_secret.get_secret_value():
        return settings.webhook_secret.get_secret_value().encode()
    return None


@functools.lru_cache(maxsize=8)
def _allow(entries: tuple[str, ...]) -> ssrf.Allow:
    return ssrf.Allow.parse(entries)


def allow_list(settings: Settings) -> ssrf.Allow:
    return _allow(tuple(settings.webhook_allow))


def enabled(settings: Settings) -> bool:
    """Some key is configured, so jobs may carry webhooks (and someone must deliver them)."""
    return settings.webhook_secret is not None or settings.webhook_tenant_secrets is not None


def check_settings(settings: Settings) -> None:
    """Raise ValueError for a malformed tenant secret list or allow-list (at start)."""
    if settings.webhook_tenant_secrets is not None:
        _tenant_keys(settings.webhook_tenant_secrets.get_secret_value())
    allow_list(settings)


async def submit_target(
    settings: Settings,
    tenant: str,
    url: str | None,
    events: tuple[str, ...] | None = None,
    resolve: ssrf.Resolver = ssrf.system_resolve,
) -> dict[str, Any] | None:
    """The job's `webhook` field for `url` (None without one), and the final statuses it
    fires on (`events`; all without); `InputInvalid` (422) when no key would sign it, or the
    URL fails the SSRF guard or does not resolve."""
    if url is None:
        return None
    if signing_key(settings, tenant) is None:
        raise InputInvalid(
            "webhooks are signed, and no key is set: set INFERQ_WEBHOOK_SECRET "
            f"(or tenant {tenant!r}'s in INFERQ_WEBHOOK_TENANT_SECRETS)"
        )
    host = ssrf.parse_url(url).host
    try:
        async with asyncio.timeout(settings.webhook_timeout_s):
            await ssrf.check(url, allow_list(settings), resolve)
    except (OSError, TimeoutError) as e:
        raise InputInvalid(f"webhook host {host} does not resolve: {e or 'timed out'}") from e
    except ValueError as e:  # a resolver's own ValueError: a 422 naming it, never a 500
        raise InputInvalid(f"webhook host {host} is not a valid host name: {e}") from e
    return {"url": url} if events is None else {"url": url, "events": list(events)}


# --- the receiver's contract -----------------------------------------------------------------


def signed_bytes(timestamp: int, delivery_id: str, body: bytes) -> bytes:
    """What the signature covers: `<timestamp>.<delivery id>.<body>`."""
    return f"{timestamp}.{delivery_id}.".encode() + body


def sign(key: bytes, timestamp: int, delivery_id: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 over `<timestamp>.<delivery id>.<body>`."""
    message = signed_bytes(timestamp, delivery_id, body)
    return f"sha256={hmac.new(key, message, hashlib.sha256).hexdigest()}"


def headers(key: bytes, delivery_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        DELIVERY: delivery_id,
        TIMESTAMP: str(timestamp),
        SIGNATURE: sign(key, timestamp, delivery_id, body),
        "User-Agent": "inferq-webhooks/1",
    }


def delivery_id(job_id: str, entry_id: str) -> str:
    """Stable per (job, its webhook stream entry): the same on every retry and redelivery."""
    return str(uuid.uuid5(_DELIVERY_NS, f"{job_id}/{entry_id}"))


def body_of(job: Job) -> bytes:
    """What GET /v1/jobs/{id} answers for a final job, serialised as FastJSON does."""
    return orjson.dumps(job_view(job), option=orjson.OPT_SERIALIZE_NUMPY)


def backoff_s(
    failures: int, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Delay after the `failures`-th failed attempt: base·2^(failures-1), capped, then
    "equal jitter": uniform in [half, all] of it, so retries spread but still grow."""
    full = min(cap_s, base_s * 2.0 ** min(max(failures, 1) - 1, 64))
    return full * (rng or random).uniform(0.5, 1.0)


# --- one delivery ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery as it waits in Redis between attempts: self-contained, so a retry needs
    neither the job record (it may have expired) nor the request that created it."""

    id: str
    job: str
    url: str
    tenant: str
    body: bytes
    ended_ms: int  # when the job became final (kept for the dead letter's reader)
    # When a deliverer first took it up (its first attempt, or its first deferral when the
    # target could not take it then): the retry window of INFERQ_WEBHOOK_MAX_AGE_S starts
    # here, so a backlog before the first attempt does not eat into it.
    first_ms: int
    attempts: int = 0  # failed attempts so far
    error: str = ""  # why the last attempt failed

    def pack(self) -> bytes:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return msgpack.packb({"v": RECORD_VERSION, **values}, use_bin_type=True)

    @classmethod
    def unpack(cls, raw: bytes) -> Delivery:
        try:
            values = msgpack.unpackb(raw, raw=False)
            if values.pop("v", None) != RECORD_VERSION:
                raise CodecError("unsupported webhook delivery record version")
            return cls(**values)
        except CodecError:
            raise
        except (TypeError, ValueError, msgpack.UnpackException) as e:
            raise CodecError(f"undecodable webhook delivery: {e!r}") from e

    @classmethod
    def of(cls, job: Job, entry_id: str, url: str) -> Delivery:
        now = now_ms()
        return cls(
            delivery_id(job.id, entry_id),
            job.id,
            url,
            job.tenant,
            body_of(job),
            job.finished_ms or now,
            now,
        )

    def failed(self, error: str) -> Delivery:
        return replace(self, attempts=self.attempts + 1, error=error)

    def deadline_ms(self, max_age_s: float) -> int:
        """When retrying stops: `max_age_s` after the first attempt."""
        return self.first_ms + int(max_age_s * 1000)


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Kind
    reason: str = ""
    retry_after_s: float | None = None  # what a 429/503 asked for
    # What the attempt says about the target, for its circuit breaker: True it answered
    # (any status: 5xx too), False it did not (timeout, connection error: what holds a
    # slot), None no request was made.
    target_ok: bool | None = None


def outcome_of(status: int, retry_after: str | None) -> Outcome:
    """What an HTTP answer means. Every answer, 5xx included, shows the target reachable
    (`target_ok=True`): a failing answer is the delivery's to retry, not the breaker's."""
    if 200 <= status < 300:
        return Outcome("delivered", f"HTTP {status}", target_ok=True)
    if status in (408, 429) or status >= 500:
        wait = float(retry_after) if retry_after and retry_after.strip().isdigit() else None
        return Outcome("retry", f"HTTP {status}", wait, target_ok=True)
    # 3xx: redirects are not followed (each hop would need the SSRF guard, and a moved
    # endpoint is a configuration to fix); other 4xx: the receiver refuses this delivery.
    return Outcome("dead", f"HTTP {status}", target_ok=True)


def attempt_budget_s(settings: Settings) -> float:
    """The most one attempt takes, name resolution and POST together."""
    return 2 * settings.webhook_timeout_s
