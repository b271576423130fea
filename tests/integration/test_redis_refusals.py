"""A Redis that answers but refuses writes for a while (NOREPLICAS, MISCONF): the worker
rides it out and serves the next job, instead of exiting on the first refused pipeline.

Each test has a Redis of its own: the windows change its configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from inferq.redis_server import RedisServer, RedisServerError, find_redis_server
from tests.integration.stack import Proc, Stack, wait_for

WINDOW_S = 5.0


@pytest.fixture
def own_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    try:
        find_redis_server()
    except RedisServerError as e:
        pytest.skip(f"no redis-server: {e}")
    server = RedisServer(tmp_path / "redis")
    server.start()
    s = Stack(server.url, tmp_path)
    yield s
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(s.logs())
    s.close()
    server.stop()


def _refuses_writes(r: redis.Redis) -> str:
    """The refusal a write meets now, or '' when writes pass."""
    try:
        r.set("refusal-probe", 1)
    except redis.ResponseError as e:
        return str(e).split(" ", 1)[0]
    return ""


def _ride_out(stack: Stack, worker: Proc, base: str, close: Callable[[], None], code: str) -> None:
    """Hold the window open WINDOW_S (the worker must stay up all along), close it, then the
    worker must serve a job promptly."""
    assert _refuses_writes(stack.r) == code
    deadline = time.monotonic() + WINDOW_S
    while time.monotonic() < deadline:
        assert worker.alive(), f"worker exited ({worker.popen.returncode}) during {code}"
        time.sleep(0.05)
    close()
    assert _refuses_writes(stack.r) == ""
    t0 = time.monotonic()
    r = httpx.post(f"{base}/v1/infer", json={"input": "after"}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    served_s = time.monotonic() - t0
    print(f"{code}: served a job {served_s:.2f}s after the window")
    assert worker.alive()
    # The worker met the refusal (its reads, beats and posts were refused), and said so.
    assert f"redis unavailable: {code}" in worker.log()


def test_worker_rides_out_noreplicas(own_stack: Stack) -> None:
    worker = own_stack.worker()
    base = own_stack.api()
    assert httpx.post(f"{base}/v1/infer", json={"input": "before"}, timeout=30).status_code == 200
    own_stack.r.config_set("min-replicas-to-write", 1)
    _ride_out(
        own_stack,
        worker,
        base,
        lambda: own_stack.r.config_set("min-replicas-to-write", 0),
        "NOREPLICAS",
    )


def test_worker_rides_out_misconf(own_stack: Stack, tmp_path: Path) -> None:
    worker = own_stack.worker()
    base = own_stack.api()
    assert httpx.post(f"{base}/v1/infer", json={"input": "before"}, timeout=30).status_code == 200
    r = own_stack.r
    # MISCONF on Redis 7: writes stop after a failed RDB save only when save points are set
    # (the test server starts with `--save ""`), and `dir` cannot be changed at run time; a
    # directory where the dump file should land makes the save's final rename fail.
    dump = Path(str(r.config_get("dir")["dir"])) / str(r.config_get("dbfilename")["dbfilename"])
    r.config_set("save", "3600 1")
    dump.mkdir()
    r.bgsave()
    wait_for(
        lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err", 10, "a failed BGSAVE"
    )

    def close() -> None:
        dump.rmdir()
        r.bgsave()
        wait_for(
            lambda: (
                r.info("persistence")["rdb_last_bgsave_status"] == "ok"
                and not r.info("persistence")["rdb_bgsave_in_progress"]
            ),
            10,
            "a good BGSAVE",
        )

    _ride_out(own_stack, worker, base, close, "MISCONF")
