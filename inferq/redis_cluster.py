"""A real local Redis Cluster (tests, `scripts/scale_bench.py`): 3 masters + 3 replicas on
free ports, each a supervised `RedisServer`.

`redis-server --cluster-enabled yes` six times, then `redis-cli --cluster create`. The bus
port is given explicitly (`--cluster-port`, Redis 7+), because a free client port above
55535 has no bus port 10000 above it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from inferq.redis_server import RedisServer, free_port


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


class LocalCluster:
    def __init__(self, root: Path, masters: int = 3, replicas: int = 1) -> None:
        self.root = root
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            d = root / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            args = ["--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf")]
            args += ["--cluster-node-timeout", "2000", "--cluster-port", str(free_port())]
            self.nodes.append(RedisServer(d, appendonly=True, extra_args=args))
        self.replicas = replicas

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is needed to create a cluster")
        for n in self.nodes:
            n.start()
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"{n.host}:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.url)

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Every live node reports the cluster ok and every slot has a live master."""

        def ok() -> bool:
            for n in self.nodes:
                if not n.running:
                    continue
                try:
                    c = redis.Redis(host=n.host, port=n.port, socket_timeout=1)
                    if c.cluster("info")["cluster_state"] != "ok":
                        return False
                except redis.RedisError:
                    return False
            return True

        wait_for(ok, timeout_s, "the cluster to report ok")

    def wait_synced(self, timeout_s: float = 30.0) -> None:
        """Every live replica's link to its master is up: only then can it take over (a
        replica that never synced does not stand for election)."""

        def synced() -> bool:
            for n in self.nodes:
                if not n.running:
                    continue
                try:
                    info = redis.Redis(host=n.host, port=n.port, socket_timeout=1).info(
                        "replication"
                    )
                except redis.RedisError:
                    return False
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
            return True

        wait_for(synced, timeout_s, "every replica's link to its master")

    def wait_promoted(self, dead: RedisServer, key: str, timeout_s: float = 30.0) -> None:
        """A live node other than `dead` is the master of `key`'s slot, as the others see it."""
        slot = key_slot(key.encode())

        def promoted() -> bool:
            for n in self.nodes:
                if n is dead or not n.running:
                    continue
                try:
                    c = redis.Redis(host=n.host, port=n.port, socket_timeout=1)
                    for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                        if start <= slot <= end:
                            return bool(int(master[1]) != dead.port)
                except redis.RedisError:
                    return False
            return False

        wait_for(promoted, timeout_s, f"a new master for slot {slot}")

    def _masters(self) -> Iterator[redis.Redis]:
        """A client of each live node that is a master now (closed after use)."""
        for n in self.nodes:
            if not n.running:
                continue
            c = redis.Redis(host=n.host, port=n.port, socket_timeout=2)
            try:
                if c.info("replication")["role"] == "master":
                    yield c
            finally:
                c.close()

    def keys_on_masters(self, pattern: str) -> list[bytes]:
        """Keys matching `pattern`, each once: scanned on the masters only."""
        return [k for c in self._masters() for k in c.scan_iter(match=pattern, count=1000)]

    def master_of(self, key: str) -> RedisServer:
        c = self.client()
        try:
            node = c.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == node.port)
        finally:
            c.close()

    def flush(self) -> None:
        for c in self._masters():
            c.flushall()

    def stop(self) -> None:
        for n in self.nodes:
            if n.running:
                n.stop()


def cluster_available() -> str | None:
    """Why a local cluster cannot be made here, or None."""
    from inferq.redis_server import RedisServerError, find_redis_server

    try:
        binary = find_redis_server()
    except RedisServerError as e:
        return str(e)
    if shutil.which("redis-cli") is None:
        return "no redis-cli"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    major = int(out.split("v=")[1].split(".")[0]) if "v=" in out else 0
    if major < 7:
        return f"redis-server {major}.x has no --cluster-port (needs 7+)"
    return None
