"""/v1/health, /v1/models, /metrics and the status page on fakeredis (no sockets)."""

from __future__ import annotations

import fakeredis
import orjson
import pytest
from fastapi.testclient import TestClient

from inferq.api.core import health
from inferq.shared import keys
from inferq.shared.jobs import now_ms
from inferq.shared.registry import decode_beat as decode_heartbeat
from tests.unit.api.conftest import MakeApp

Client = tuple[TestClient, fakeredis.FakeAsyncRedis, fakeredis.FakeServer]


@pytest.fixture
def client(make_app: MakeApp) -> Client:
    app = make_app(models=["echo", "other=echo"])
    return app.client, app.redis, app.server


def _beat(c: TestClient, fake: fakeredis.FakeAsyncRedis, model: str, wid: str, **extra) -> None:  # type: ignore[no-untyped-def]
    now = now_ms()
    record = {
        "id": wid, "host": "h", "pid": "42", "model": model, "backend": "torch",
        "device": "cuda:0", "token_ceiling": "8192", "items_per_s": "12.5",
        "last_batch_size": "4", "last_batch_tokens": "64", "last_batch_at_ms": str(now),
        "batches": "7", "ooms": "0", "held_items": "0", "beat_ms": str(now),
        "mem_allocated": "100", "mem_reserved": "200", "mem_total": "1000",
        "calibration": orjson.dumps({"bytes_per_token": 1234}).decode(),
    } | extra  # fmt: skip

    async def write() -> None:
        await fake.hset(keys.worker(wid), mapping=record)
        await fake.zadd(keys.workers(model), {wid: now + 5000})

    c.portal.call(write)  # type: ignore[attr-defined]


def test_decode_heartbeat_is_tolerant() -> None:
    out = decode_heartbeat(
        {
            b"id": b"w1",
            b"pid": b"12",
            b"items_per_s": b"3.5",
            b"mem_total": b"",
            b"token_ceiling": b"lots",
            b"calibration": b"{bad",
            b"extra": b"x",
        }
    )
    assert out == {
        "id": "w1",
        "pid": 12,
        "items_per_s": 3.5,
        "mem_total": None,
        "token_ceiling": "lots",
        "calibration": "{bad",
        "extra": "x",
    }
    assert decode_heartbeat({"calibration": ""}) == {"calibration": None}


def test_health_degraded_until_every_model_is_served(client: Client) -> None:
    c, fake, _ = client
    r = c.get("/v1/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "degraded" and body["redis"]["up"] is True
    assert body["models"]["echo"]["status"] == "unserved"
    _beat(c, fake, "echo", "w-echo")
    _beat(c, fake, "other", "w-other")
    c.portal.call(lambda: fake.xadd(keys.stream("echo"), {"job": "j1"}))  # type: ignore[attr-defined]
    body = c.get("/v1/health").json()
    assert body["status"] == "ok", body
    echo = body["models"]["echo"]
    assert echo["queue_depth"] == 1 and echo["oldest_queued_age_ms"] >= 0
    (w,) = echo["workers"]
    assert w["id"] == "w-echo" and w["mem_allocated"] == 100 and w["items_per_s"] == 12.5
    assert w["calibration"] == {"bytes_per_token": 1234} and w["beat_age_ms"] >= 0


def test_health_stalled_queue_is_degraded(client: Client) -> None:
    c, fake, _ = client
    old = now_ms() - int(health.STALLED_AFTER_S * 1000) - 5000
    _beat(c, fake, "echo", "w-echo", last_batch_at_ms=str(old))
    _beat(c, fake, "other", "w-other")
    c.portal.call(lambda: fake.xadd(keys.stream("echo"), {"job": "j1"}, id=f"{old}-0"))  # type: ignore[attr-defined]
    body = c.get("/v1/health").json()
    assert body["status"] == "degraded"
    assert body["models"]["echo"]["status"] == "stalled"
    assert body["models"]["other"]["status"] == "ok"


def test_health_down_is_503_with_a_body(client: Client) -> None:
    c, _, server = client
    server.connected = False
    r = c.get("/v1/health")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "down" and body["redis"]["up"] is False
    assert set(body["models"]) == {"echo", "other"}
    assert c.get("/v1/models").status_code == 503
    assert c.get("/metrics").status_code == 200  # still scrapeable


def test_models_lists_workers(client: Client) -> None:
    c, fake, _ = client
    _beat(c, fake, "echo", "w-echo")
    body = c.get("/v1/models").json()
    assert body["default"] == "echo"
    by_name = {m["name"]: m for m in body["models"]}
    assert by_name["other"]["workers"] == [] and by_name["other"]["target"] == "echo"
    assert by_name["echo"]["workers"] == [
        {
            "id": "w-echo",
            "host": "h",
            "device": "cuda:0",
            "backend": "torch",
            "token_ceiling": 8192,
            "calibration": {"bytes_per_token": 1234},
        }
    ]


def test_metrics_refresh_queue_depth(client: Client) -> None:
    c, fake, _ = client
    c.portal.call(lambda: fake.xadd(keys.stream("other"), {"job": "j1"}))  # type: ignore[attr-defined]
    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'inferq_queue_depth{model="other"} 1.0' in r.text
    assert 'inferq_queue_depth{model="echo"} 0.0' in r.text


@pytest.mark.parametrize("path", ["/", "/status"])
def test_status_page_is_self_contained(client: Client, path: str) -> None:
    c, _, _ = client
    r = c.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert 'id="chart-queue"' in html and "data-points" in html and "v1/health" in html
    for external in ("http://", "https://", "//cdn", "<link", "src="):
        # the only URL allowed is the SVG namespace string
        assert html.replace("http://www.w3.org/2000/svg", "").count(external) == 0, external
