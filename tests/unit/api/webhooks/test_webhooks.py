"""Webhooks without sockets: signature, SSRF classification and allow-list, backoff, outcome
table, the delivery record, and one attempt through a fake transport and a fake resolver."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import itertools
import json
import random
import re
import socket
from typing import Any

import fakeredis
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from redis.crc import key_slot

from inferq.api.app import create_app
from inferq.api.protocols.v1 import job_view
from inferq.api.responses import FastJSON
from inferq.api.webhooks import contract as webhooks
from inferq.api.webhooks import ssrf
from inferq.api.webhooks import store as webhook_scripts
from inferq.api.webhooks.contract import Delivery
from inferq.api.webhooks.dispatcher import Dispatcher
from inferq.api.webhooks.poster import Poster
from inferq.shared.errors import CodecError, InputInvalid
from inferq.shared.jobs import ErrorCode, Job, JobError, Status
from inferq.shared.metrics import api_metrics
from inferq.shared.settings import Settings
from tests.queues import JobQueue
from tests.unit.api.conftest import MakeApp

SECRET = "s3cret-for-tests"


def _settings(**kw: object) -> Settings:
    return Settings(model="echo", **kw)  # type: ignore[arg-type]


def _resolver(table: dict[str, list[str]]) -> ssrf.Resolver:
    """A resolver that answers from `table`; a name not in it does not resolve."""

    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


async def _no_lookup(host: str, port: int) -> list[str]:
    raise AssertionError(f"an IP literal must not be looked up (asked for {host})")


# --- signature ----------------------------------------------------------------------------------


def test_signature_is_hmac_sha256_of_timestamp_delivery_and_body() -> None:
    body, ts, key = b'{"id":"j1","status":"succeeded"}', 1_700_000_000, SECRET.encode()
    sig = webhooks.sign(key, ts, "d-1", body)
    expected = hmac.new(key, b"1700000000.d-1." + body, hashlib.sha256).hexdigest()
    assert sig == f"sha256={expected}" and len(expected) == 64
    assert webhooks.sign(key, ts + 1, "d-1", body) != sig  # the timestamp is signed
    assert webhooks.sign(key, ts, "d-1", body + b" ") != sig  # and every body byte
    assert webhooks.sign(b"other", ts, "d-1", body) != sig
    h = webhooks.headers(key, "d-1", body, ts)
    assert h["X-Inferq-Signature"] == sig and h["X-Inferq-Timestamp"] == "1700000000"
    assert h["X-Inferq-Delivery"] == "d-1" and h["Content-Type"] == "application/json"


def test_a_captured_attempt_replayed_under_a_fresh_delivery_id_fails_verification() -> None:
    """The delivery id is signed: a replay with a new X-Inferq-Delivery (to get past the
    receiver's de-duplication) inside its timestamp window does not verify."""
    body, ts, key = b'{"id":"j1"}', 1_700_000_000, SECRET.encode()
    captured = webhooks.headers(key, "d-1", body, ts)
    replayed = captured | {"X-Inferq-Delivery": "d-2"}

    def verifies(h: dict[str, str]) -> bool:  # the recipe of docs/api.md
        message = f"{h['X-Inferq-Timestamp']}.{h['X-Inferq-Delivery']}.".encode() + body
        mac = hmac.new(key, message, hashlib.sha256).hexdigest()
        return hmac.compare_digest(h["X-Inferq-Signature"], f"sha256={mac}")

    assert verifies(captured) and not verifies(replayed)


def test_signing_key_tenant_first_then_global() -> None:
    both = _settings(webhook_secret="global", webhook_tenant_secrets="acme:a-key, beta:b:key")
    assert webhooks.signing_key(both, "acme") == b"a-key"
    assert webhooks.signing_key(both, "beta") == b"b:key"  # a secret may hold ':'
    assert webhooks.signing_key(both, "other") == b"global"
    tenants_only = _settings(webhook_tenant_secrets="acme:a-key")
    assert webhooks.signing_key(tenants_only, "other") is None
    assert webhooks.signing_key(_settings(), "") is None and not webhooks.enabled(_settings())
    bad = _settings(webhook_tenant_secrets="acme:ok,no-secret-here-TOPSECRET")
    with pytest.raises(ValueError, match="entry 1") as e:
        webhooks.check_settings(bad)
    assert "TOPSECRET" not in str(e.value)


def test_delivery_ids_are_stable_and_distinct() -> None:
    assert webhooks.delivery_id("j1", "1-0") == webhooks.delivery_id("j1", "1-0")
    assert webhooks.delivery_id("j1", "1-0") != webhooks.delivery_id("j2", "1-0")
    assert webhooks.delivery_id("j1", "1-0") != webhooks.delivery_id("j1", "2-0")


# --- SSRF ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.254", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fdff:ffff::1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("febf::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not a public"),
        ("::ffff:10.0.0.1", "private"),  # IPv4-mapped: judged by the IPv4 address
        ("::ffff:127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("2002:a00:1::1", "6to4 address carrying a private"),  # 6to4 of 10.0.0.1
        ("2002:7f00:1::", "6to4 address carrying a loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "6to4 address carrying the cloud metadata"),
        # Teredo: server 65.54.227.120 (public), client 10.0.0.1 (stored inverted)
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo address carrying a private"),
        ("2001:0:a00:1::", "Teredo address carrying a private"),  # server 10.0.0.1
        ("fec0::1", "site-local"),
        ("fefe:1::5", "site-local"),
    ],
)
def test_non_public_addresses_are_refused_and_named(address: str, rule: str) -> None:
    reason = ssrf.classify(ipaddress.ip_address(address))
    assert reason is not None and rule in reason, (address, reason)


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "172.32.0.1",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",  # 6to4 of 8.8.8.8: a route to a public host
    ],
)
def test_public_addresses_pass(address: str) -> None:
    assert ssrf.classify(ipaddress.ip_address(address)) is None


def test_allow_list_by_host_and_by_cidr() -> None:
    allow = ssrf.Allow.parse(["Hooks.Internal.", "10.1.0.0/16", "127.0.0.1", "fd00::/8", " "])
    assert allow.admits("hooks.internal", ipaddress.ip_address("10.9.9.9"))  # by name: any address
    assert allow.admits("HOOKS.INTERNAL.", ipaddress.ip_address("192.168.0.1"))
    assert allow.admits("x.example", ipaddress.ip_address("10.1.200.3"))  # by network
    assert not allow.admits("x.example", ipaddress.ip_address("10.2.0.1"))
    assert allow.admits("127.0.0.1", ipaddress.ip_address("127.0.0.1"))
    assert not allow.admits("127.0.0.2", ipaddress.ip_address("127.0.0.2"))
    assert allow.admits("v6.example", ipaddress.ip_address("fd12::1"))
    assert not allow.admits("v6.example", ipaddress.ip_address("::1"))
    for bad in ("10.0.0.0/33", "not a host", "host/path"):
        with pytest.raises(ValueError, match="INFERQ_WEBHOOK_ALLOW"):
            ssrf.Allow.parse([bad])


async def test_check_ip_literals_without_lookup() -> None:
    none = ssrf.Allow()
    for url, rule in [
        ("http://10.0.0.1/x", "webhook host 10.0.0.1 is a private address"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[::1]:8080/", "webhook host ::1 is a loopback address"),
        ("http://0.0.0.0/", "unspecified"),
    ]:
        with pytest.raises(ssrf.WebhookRefused, match=rule) as e:
            await ssrf.check(url, none, _no_lookup)
        assert "INFERQ_WEBHOOK_ALLOW" in str(e.value)
    target = await ssrf.check("https://8.8.8.8/hook", none, _no_lookup)
    assert target.address == "8.8.8.8"
    allowed = await ssrf.check("http://127.0.0.1:9/x", ssrf.Allow.parse(["127.0.0.1"]), _no_lookup)
    assert allowed.address == "127.0.0.1"


async def test_check_resolves_names_and_every_address_must_pass() -> None:
    resolve = _resolver(
        {
            "public.example": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
            "mixed.example": ["93.184.216.34", "10.0.0.5"],
            "localhost": ["127.0.0.1", "::1"],
        }
    )
    none = ssrf.Allow()
    target = await ssrf.check("https://public.example/hook", none, resolve)
    assert target.address == "93.184.216.34"
    with pytest.raises(ssrf.WebhookRefused, match=r"mixed\.example resolves to a private"):
        await ssrf.check("https://mixed.example/", none, resolve)
    with pytest.raises(ssrf.WebhookRefused, match="loopback"):
        await ssrf.check("http://localhost:8000/", none, resolve)
    by_name = await ssrf.check("http://localhost:8000/", ssrf.Allow.parse(["localhost"]), resolve)
    assert by_name.address == "127.0.0.1"
    with pytest.raises(OSError):
        await ssrf.check("https://nowhere.invalid/", none, resolve)


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("ftp://8.8.8.8/x", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("http:///x", "no host"),
        ("https://user:pw@8.8.8.8/", "credentials"),
    ],
)
async def test_check_refuses_bad_urls(url: str, rule: str) -> None:
    with pytest.raises(ssrf.WebhookRefused, match=rule):
        await ssrf.check(url, ssrf.Allow(), _no_lookup)


async def test_a_refusal_names_the_rule_never_the_address_a_name_resolves_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Otherwise any caller could read our internal DNS through 422 messages. The address
    stays in a DEBUG log line on our side."""
    resolve = _resolver({"x.example": ["10.0.0.5"], "y.example": ["fd00::5"]})
    caplog.set_level("DEBUG", logger="inferq.api.webhooks")
    for host, address, rule in [
        ("x.example", "10.0.0.5", "private"),
        ("y.example", "fd00::5", "private"),
    ]:
        with pytest.raises(ssrf.WebhookRefused) as e:
            await ssrf.check(f"https://{host}/h", ssrf.Allow(), resolve)
        message = str(e.value)
        assert message == (
            f"webhook host {host} resolves to a {rule} address; allow it with INFERQ_WEBHOOK_ALLOW"
        )
        assert address not in message
        assert address in caplog.text  # for the operator
    keyed = _settings(webhook_secret=SECRET)
    with pytest.raises(InputInvalid) as e:
        await webhooks.submit_target(keyed, "", "https://x.example/h", resolve=resolve)
    assert "10.0.0.5" not in str(e.value) and "private address" in str(e.value)


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("a..b", "an empty label"),
        ("." + "a" * 10, "an empty label"),
        ("a" * 64 + ".example", "a label longer than 63 characters"),
        (".".join(["a" * 60] * 5), "longer than 253 characters"),
    ],
)
async def test_a_host_that_is_no_dns_name_is_refused_before_any_lookup(
    host: str, problem: str
) -> None:
    """httpx accepts these; the system resolver's IDNA step raised UnicodeError (a 500)."""
    with pytest.raises(ssrf.WebhookRefused, match=f"not a valid host name: {problem}"):
        await ssrf.check(f"https://{host}/h", ssrf.Allow(), _no_lookup)
    keyed = _settings(webhook_secret=SECRET)
    with pytest.raises(InputInvalid, match=f"webhook host {re.escape(host)} is not a valid"):
        await webhooks.submit_target(keyed, "", f"https://{host}/h")  # the system resolver
    rec = Recorder()  # at delivery (a job queued before this check existed): a dead letter
    poster = Poster(keyed, resolve=_no_lookup, transport=httpx.MockTransport(rec))
    out = await poster.attempt(Delivery.of(_job(), "5-0", f"https://{host}/h"))
    assert out.kind == "dead" and problem in out.reason and rec.requests == []
    await poster.aclose()
    assert await ssrf.check(
        "https://example.com./h", ssrf.Allow(), _resolver({"example.com.": ["8.8.8.8"]})
    )


async def test_a_resolver_value_error_is_a_refusal_not_a_crash() -> None:
    """Whatever ValueError a resolver raises (UnicodeError from IDNA, say) is final: 422 at
    submit, a dead letter at delivery."""

    async def idna_fails(host: str, port: int) -> list[str]:
        raise UnicodeError("encoding with 'idna' codec failed (UnicodeError: label too long)")

    async def garbage(host: str, port: int) -> list[str]:
        return ["not-an-address"]

    keyed = _settings(webhook_secret=SECRET)
    for resolve in (idna_fails, garbage):
        with pytest.raises(InputInvalid, match=r"webhook host x\.example"):
            await webhooks.submit_target(keyed, "", "https://x.example/h", resolve=resolve)
        rec = Recorder()
        poster = Poster(keyed, resolve=resolve, transport=httpx.MockTransport(rec))
        out = await poster.attempt(Delivery.of(_job(), "5-0", "https://x.example/h"))
        assert out.kind == "dead" and "x.example" in out.reason and rec.requests == []
        await poster.aclose()


def test_a_webhook_host_that_is_no_dns_name_is_a_422_at_submit(make_app: MakeApp) -> None:
    app = make_app(webhook_secret=SECRET)
    for host in ("a..b", "a" * 64 + ".example", "xn--a-", "xn--a-.example"):
        body = {"input": "hi", "webhook": {"url": f"https://{host}/hook"}}
        r = app.client.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_input"
        assert f"webhook host {host} is not a valid host name" in r.json()["error"]["message"]


async def test_an_a_label_idna_cannot_decode_is_refused_with_the_reason() -> None:
    """httpx parses `xn--a-` but raises idna's IDNAError when asked for the host: that was
    raised outside every check (a 500 at submit)."""
    with pytest.raises(ssrf.WebhookRefused) as e:
        ssrf.parse_url("https://xn--a-/hook")
    assert str(e.value) == (
        "webhook host xn--a- is not a valid host name: A-label must not end with a hyphen"
    )
    keyed = _settings(webhook_secret=SECRET)
    with pytest.raises(InputInvalid, match="A-label must not end with a hyphen"):
        await webhooks.submit_target(keyed, "", "https://xn--a-/hook", resolve=_no_lookup)
    rec = Recorder()  # at delivery (queued before this check): a dead letter, no request
    poster = Poster(keyed, resolve=_no_lookup, transport=httpx.MockTransport(rec))
    out = await poster.attempt(Delivery.of(_job(), "5-0", "https://xn--a-/hook"))
    assert out.kind == "dead" and "A-label" in out.reason and rec.requests == []
    await poster.aclose()


def test_target_pins_the_checked_address() -> None:
    t = ssrf.Target(httpx.URL("https://hooks.example:8443/a?b=1"), "93.184.216.34")
    assert str(t.pinned_url) == "https://93.184.216.34:8443/a?b=1"
    assert t.host_header == "hooks.example:8443"
    assert t.extensions == {"sni_hostname": "hooks.example"}
    v6 = ssrf.Target(httpx.URL("http://hooks.example/"), "2606:2800:220:1::1")
    assert v6.pinned_url.host == "2606:2800:220:1::1" and "[2606:2800:220:1::1]" in str(
        v6.pinned_url
    )


# --- submit -------------------------------------------------------------------------------------


async def test_submit_target_rules() -> None:
    keyed = _settings(webhook_secret=SECRET)
    assert await webhooks.submit_target(keyed, "", None) is None
    with pytest.raises(InputInvalid, match="INFERQ_WEBHOOK_SECRET"):
        await webhooks.submit_target(_settings(), "", "https://8.8.8.8/")
    with pytest.raises(InputInvalid, match=r"10\.0\.0\.1 is a private address"):
        await webhooks.submit_target(keyed, "", "http://10.0.0.1/x")
    with pytest.raises(InputInvalid, match="does not resolve"):
        await webhooks.submit_target(keyed, "", "https://nowhere.invalid/", resolve=_resolver({}))
    allowed = _settings(webhook_secret=SECRET, webhook_allow="127.0.0.1")
    url = "http://127.0.0.1:9999/hook"
    assert await webhooks.submit_target(allowed, "", url) == {"url": url}


@pytest.fixture
def keyless_app(make_app: MakeApp) -> tuple[TestClient, fakeredis.FakeAsyncRedis]:
    app = make_app()
    return app.client, app.redis


def test_submit_with_a_webhook_and_no_key_is_422_and_stores_nothing(keyless_app) -> None:  # type: ignore[no-untyped-def]
    c, fake = keyless_app
    r = c.post("/v1/jobs", json={"input": "hi", "webhook": {"url": "https://8.8.8.8/h"}})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_input"
    assert "INFERQ_WEBHOOK_SECRET" in r.json()["error"]["message"]
    assert c.portal.call(fake.keys, "inferq:job:*") == []  # type: ignore[attr-defined]


def test_bad_webhook_settings_stop_the_start() -> None:
    with pytest.raises(ValueError, match="INFERQ_WEBHOOK_ALLOW"):
        create_app(_settings(webhook_allow="10.0.0.0/40"))


# --- retries ------------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    base, cap = 1.0, 600.0
    for failures in range(1, 30):
        full = min(cap, base * 2 ** (failures - 1))
        samples = [webhooks.backoff_s(failures, base, cap, rng) for _ in range(200)]
        assert all(full / 2 <= s <= full for s in samples), failures
        assert max(samples) - min(samples) > full / 10  # jittered, not constant
    assert webhooks.backoff_s(10**6, base, cap, rng) <= cap  # no overflow, still capped
    means = [
        sum(webhooks.backoff_s(n, 0.05, cap, rng) for _ in range(400)) / 400 for n in (1, 2, 3, 4)
    ]
    assert all(b > 1.6 * a for a, b in itertools.pairwise(means)), means  # ~doubles


@pytest.mark.parametrize(
    ("status", "kind"),
    [(200, "delivered"), (204, "delivered"), (500, "retry"), (503, "retry"), (408, "retry"),
     (429, "retry"), (400, "dead"), (401, "dead"), (404, "dead"), (410, "dead"), (301, "dead"),
     (302, "dead")],
)  # fmt: skip
def test_outcome_table(status: int, kind: str) -> None:
    assert webhooks.outcome_of(status, None).kind == kind


def test_retry_after_is_read() -> None:
    assert webhooks.outcome_of(429, "30").retry_after_s == 30.0
    assert webhooks.outcome_of(503, "Wed, 21 Oct 2015 07:28:00 GMT").retry_after_s is None


# --- the record and one attempt -----------------------------------------------------------------


def _job() -> Job:
    return Job(
        id="j-1", model="echo", inputs=["a", "b"], status=Status.SUCCEEDED, tenant="acme",
        created_ms=1_000, started_ms=1_010, finished_ms=1_030,
        outputs=np.arange(8, dtype=np.float32).reshape(2, 4), batch_size=2, batch_tokens=2,
        worker="w-1", webhook={"url": "https://hooks.example/in"},
    )  # fmt: skip


def test_body_is_what_get_answers() -> None:
    job = _job()
    assert webhooks.body_of(job) == FastJSON(job_view(job)).body
    cancelled = Job(id="j-2", model="echo", inputs=["x"], status=Status.CANCELLED,
                    error=JobError(ErrorCode.CANCELLED, "cancelled by the client"))  # fmt: skip
    assert json.loads(webhooks.body_of(cancelled))["error"]["code"] == "cancelled"


def test_delivery_record_round_trip() -> None:
    d = Delivery.of(_job(), "5-0", "https://hooks.example/in")
    assert d.ended_ms == 1_030 and d.attempts == 0 and d.tenant == "acme"
    again = Delivery.unpack(d.failed("HTTP 500").pack())
    assert again == d.failed("HTTP 500") and again.attempts == 1 and again.error == "HTTP 500"
    assert again.id == d.id == webhooks.delivery_id("j-1", "5-0")
    with pytest.raises(CodecError):
        Delivery.unpack(b"\x81\xa1v\x63")  # version 99
    with pytest.raises(CodecError):
        Delivery.unpack(b"not msgpack at all \xc1")


class Recorder:
    """A fake transport: answers `status` (with `headers`) and keeps every request."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status, self.headers = status, headers or {}
        self.requests: list[httpx.Request] = []
        self.error: Exception | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return httpx.Response(self.status, headers=self.headers, text="ok")


def _poster(recorder: Recorder, table: dict[str, list[str]], **kw: object) -> Poster:
    settings = _settings(webhook_secret=SECRET, webhook_tenant_secrets="acme:acme-key", **kw)
    return Poster(settings, resolve=_resolver(table), transport=httpx.MockTransport(recorder))


async def test_attempt_signs_and_posts_to_the_checked_address() -> None:
    rec = Recorder(204)
    poster = _poster(rec, {"hooks.example": ["93.184.216.34"]})
    d = Delivery.of(_job(), "5-0", "https://hooks.example/in?x=1")
    assert (await poster.attempt(d)).kind == "delivered"
    (req,) = rec.requests
    assert req.method == "POST" and req.url.host == "93.184.216.34" and req.url.query == b"x=1"
    assert req.headers["host"] == "hooks.example"
    assert req.extensions["sni_hostname"] == "hooks.example"
    assert req.content == d.body and req.headers["content-type"] == "application/json"
    ts = req.headers["x-inferq-timestamp"]
    signed = f"{ts}.{d.id}.".encode() + d.body
    mac = hmac.new(b"acme-key", signed, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(req.headers["x-inferq-signature"], f"sha256={mac}")  # tenant's key
    assert req.headers["x-inferq-delivery"] == d.id
    await poster.aclose()


async def test_attempt_outcomes() -> None:
    table = {"hooks.example": ["93.184.216.34"]}
    d = Delivery.of(_job(), "5-0", "https://hooks.example/in")
    redirect = Recorder(302, {"location": "http://169.254.169.254/"})
    poster = _poster(redirect, table)
    out = await poster.attempt(d)
    assert out.kind == "dead" and out.reason == "HTTP 302" and len(redirect.requests) == 1
    busy = Recorder(429, {"retry-after": "7"})
    out = await _poster(busy, table).attempt(d)
    assert out.kind == "retry" and out.retry_after_s == 7.0
    down = Recorder()
    down.error = httpx.ConnectError("connection refused")
    out = await _poster(down, table).attempt(d)
    assert out.kind == "retry" and "ConnectError" in out.reason
    slow = Recorder()
    slow.error = httpx.ReadTimeout("timed out")
    assert (await _poster(slow, table).attempt(d)).kind == "retry"
    gone = Recorder()
    assert (await _poster(gone, {}).attempt(d)).kind == "retry"  # DNS failing: transient
    assert gone.requests == []


async def test_attempt_rechecks_dns_and_never_connects_to_a_rebound_name() -> None:
    rec = Recorder()
    poster = _poster(rec, {"hooks.example": ["169.254.169.254"]})  # was public at submit
    out = await poster.attempt(Delivery.of(_job(), "5-0", "https://hooks.example/in"))
    assert out.kind == "dead" and "metadata" in out.reason and rec.requests == []


async def test_attempt_without_a_key_is_retried_not_sent() -> None:
    rec = Recorder()
    settings = _settings(webhook_tenant_secrets="other:k")
    poster = Poster(settings, resolve=_resolver({}), transport=httpx.MockTransport(rec))
    out = await poster.attempt(Delivery.of(_job(), "5-0", "https://hooks.example/in"))
    assert out.kind == "retry" and "acme" in out.reason and rec.requests == []


# --- one dispatcher, every shard ----------------------------------------------------------------


def test_each_shard_keeps_its_delivery_keys_in_one_slot() -> None:
    shards = webhook_scripts.shards_of(["echo", "other"], 4)
    assert len(shards) == 8 and len({s.stream for s in shards}) == 8
    for shard in shards:  # what lets SETTLE and PROMOTE run on a cluster
        names = (shard.stream, shard.retry, shard.dead, shard.tenant_webhooks("acme"))
        assert len({key_slot(k.encode()) for k in names}) == 1


@pytest.mark.parametrize("cluster", [False, True])
async def test_a_dispatcher_delivers_from_every_shard(
    monkeypatch: pytest.MonkeyPatch, cluster: bool
) -> None:
    """Two shards of one model: entries on both, some there before the dispatcher reads and
    some added while it waits, are all delivered and settled on their own shard. As if on a
    cluster, every read names one stream (a command may not span slots there)."""
    settings = _settings(webhook_secret=SECRET, stream_shards=2, webhook_concurrency=2)
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server)
    shards = webhook_scripts.shards_of(["echo"], 2)
    sent: list[str] = []
    enough = {5: asyncio.Event(), 7: asyncio.Event()}

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["id"])
        if len(sent) in enough:
            enough[len(sent)].set()
        return httpx.Response(204)

    async def queue_delivery(shard: webhook_scripts.Shard, job_id: str) -> None:
        job = Job(id=job_id, model="echo", inputs=["x"], status=Status.SUCCEEDED)
        record = Delivery.of(job, "1-0", "https://8.8.8.8/hook").pack()
        await redis.xadd(shard.stream, {"delivery": record})

    settled: list[tuple[str, str]] = []

    async def settle(keys: list[str], args: list[object]) -> int:  # SETTLE's "done", in Python
        stream, (group, _, entry_id, mode) = keys[0], args[:4]
        (shard,) = [s for s in shards if s.stream == stream]
        # Settled for good: the tenant's counter of unsettled deliveries, on the same shard.
        assert keys == [shard.stream, shard.retry, shard.dead, shard.tenant_webhooks("")]
        assert mode == "done"
        await redis.xack(stream, str(group), str(entry_id))
        await redis.xdel(stream, str(entry_id))
        settled.append((stream, str(entry_id)))
        return 1

    async def promote(keys: list[str], args: list[object]) -> list[int]:
        assert keys in ([s.retry, s.stream] for s in shards)
        return [0, -1]

    for i in range(5):  # before the first read: the pass takes them, two slots at a time
        await queue_delivery(shards[i % 2], f"early-{i}")
    poster = Poster(settings, transport=httpx.MockTransport(answer))
    queue = JobQueue(redis, result_ttl_s=60, shards=2)
    blocking = fakeredis.FakeAsyncRedis(server=server)
    dispatcher = Dispatcher(settings, queue, blocking, api_metrics(), poster=poster)
    assert [s.stream for s in dispatcher.shards] == [s.stream for s in shards]
    monkeypatch.setattr(dispatcher.scripts, "_settle", settle)  # fakeredis runs no Lua here
    monkeypatch.setattr(dispatcher.scripts, "_promote", promote)
    dispatcher.reader.cluster = cluster
    monkeypatch.setattr(webhook_scripts, "BLOCK_MS", 200)  # fakeredis may sit out a cancel
    read = blocking.xreadgroup
    named: list[int] = []  # streams named by each read

    async def spy(*args: Any, **kw: Any) -> Any:
        named.append(len(args[2]))
        return await read(*args, **kw)

    monkeypatch.setattr(blocking, "xreadgroup", spy)
    dispatcher.start()
    try:
        await asyncio.wait_for(enough[5].wait(), 5)
        await asyncio.sleep(0.1)  # idle: the dispatcher waits on both streams
        await queue_delivery(shards[1], "late-1")
        await queue_delivery(shards[0], "late-0")
        await asyncio.wait_for(enough[7].wait(), 5)
    finally:
        await dispatcher.stop()
    assert max(named) == (1 if cluster else 2)
    assert sorted(sent) == sorted([f"early-{i}" for i in range(5)] + ["late-0", "late-1"])
    assert {stream for stream, _ in settled} == {s.stream for s in shards}
    for shard in shards:
        assert await redis.xlen(shard.stream) == 0
        assert (await redis.xpending(shard.stream, "deliverers"))["pending"] == 0
    await redis.zadd(shards[1].retry, {b"r": 1})
    await redis.xadd(shards[0].dead, {"job": "j"})
    counts = await webhook_scripts.counts(redis, ["echo"], 2)  # /v1/health adds the shards up
    assert counts == {"queued": 0, "retrying": 1, "dead": 1}
