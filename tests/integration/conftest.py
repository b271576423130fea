"""A real redis-server for the whole session (free port, AOF on), flushed per test, and a
`JobQueue` on it; and a local Redis Cluster (3 masters + 3 replicas), started once when a
test first asks for it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from inferq.redis_cluster import LocalCluster, cluster_available
from inferq.redis_server import RedisServer, RedisServerError, find_redis_server
from inferq.shared.redis_conn import MuxRedis, multiplexed
from tests.conftest import in_ci
from tests.integration.stack import Stack
from tests.queues import JobQueue


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        find_redis_server()
    except RedisServerError as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but no redis-server is available: {e}")
        pytest.skip(f"no redis-server: {e}")
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")), appendonly=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    if not redis_server.running:  # a chaos test may have left it down
        redis_server.start()
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    r.close()
    yield redis_server.url


@pytest.fixture(params=["pooled", "multiplexed"])
async def queue(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[JobQueue]:
    """The broker client over the session's Redis (flushed for this test): its scripts and
    reads on pooled connections, and on multiplexed ones as the processes run them (scripts
    on one, a worker's reads on another)."""
    r = MuxRedis.from_url(redis_url)
    if request.param == "multiplexed":
        multiplexed(r, retries=0, reads=True)
    yield JobQueue(r, result_ttl_s=60)
    await r.aclose()


@pytest.fixture
def stack(redis_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    s = Stack(redis_url, tmp_path)
    yield s
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(s.logs())
    s.close()


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    why = cluster_available()
    if why is not None:
        if in_ci():
            pytest.fail(f"CI is set but no local Redis Cluster can be made: {why}")
        pytest.skip(why)
    c = LocalCluster(Path(tmp_path_factory.mktemp("cluster")))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def cstack(
    local_cluster: LocalCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A `Stack` on the cluster (INFERQ_REDIS_CLUSTER=true), every node up and flushed."""
    for n in local_cluster.nodes:  # a failover test may have killed one
        if not n.running:
            n.start()
    local_cluster.wait_ok()
    local_cluster.flush()
    s = Stack(local_cluster.url, tmp_path, cluster=True)
    yield s
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(s.logs())
    s.close()
