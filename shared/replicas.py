"""Acknowledge only what the replicas hold: a write and its WAIT (INFERQ_REDIS_WAIT_REPLICAS).

WAIT counts the replicas that have everything *the connection it runs on* wrote. So the write
and its WAIT go out in one pipeline, which is one connection; a pipeline retried after a
dropped connection runs again whole on the new one (maybe another node, after a failover),
so a WAIT never vouches for a write made elsewhere. A cluster client refuses scripts in its
pipelines, so there the three commands go out together on one connection of the node that
owns the key's slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from inferq.shared.errors import QueueUnavailable

# WAIT's answers on a node that is, or just became, a replica.
_DEMOTED = ("WAIT cannot be used with replica", "UNBLOCKED")


async def call_and_wait(
    redis: Redis,
    script: AsyncScript,
    keys: Sequence[str],
    args: Sequence[bytes | str | int],
    wait: tuple[int, int],
    renew: tuple[str, int] | None = None,
) -> tuple[Any, int | None]:
    """(the script's reply, how many replicas hold its writes): `wait` = (replicas to wait
    for, timeout ms), as WAIT takes them; no replicas to wait for: just the call, and None.

    `renew` = (key, ttl_s): set that key's TTL before the WAIT. A script that found its work
    already done (a repeat) wrote nothing, so the WAIT would not cover what it found (whose
    first write may have been refused for want of replicas); renewing a key that belongs to
    it is a write that does, on whichever node answered. A missing key: a no-op.
    """
    if wait[0] <= 0:
        return await script(keys=keys, args=args), None
    if isinstance(redis, RedisCluster):
        return await _on_node(redis, script, keys, args, wait, renew)
    async with redis.pipeline(transaction=False) as p:
        await script(keys=keys, args=args, client=p)
        if renew is not None:
            p.expire(*renew)
        p.wait(*wait)
        try:
            replies = await p.execute()
        except ResponseError as e:
            # The node became a replica under this connection, or the retry reached a new
            # master that has not loaded the script yet (the next pipeline loads it).
            if isinstance(e, NoScriptError) or any(d in str(e) for d in _DEMOTED):
                raise QueueUnavailable(f"redis failing over: {e}") from e
            raise
    return replies[0], int(replies[-1])


async def _on_node(
    redis: RedisCluster,
    script: AsyncScript,
    keys: Sequence[str],
    args: Sequence[bytes | str | int],
    wait: tuple[int, int],
    renew: tuple[str, int] | None,
) -> tuple[Any, int | None]:
    """`call_and_wait` on a cluster: EVALSHA, EXPIRE, WAIT as one pipeline to the slot's
    master. Any failure is the failover's: 503, and the client's retry (same Idempotency-Key)
    lands wherever the slot is then."""
    node = redis.get_node_from_key(keys[0])
    if node is None:
        raise QueueUnavailable(f"no cluster node serves {keys[0]!r}")
    for attempt in range(2):
        commands = [PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args)]
        if renew is not None:
            commands.append(PipelineCommand(1, "EXPIRE", *renew))
        commands.append(PipelineCommand(len(commands), "WAIT", *wait))
        try:
            await node.execute_pipeline(commands)
        except (ConnectionError, TimeoutError, OSError, RedisError) as e:
            await _reload(redis)
            raise QueueUnavailable(f"redis failing over: {type(e).__name__}: {e}") from e
        results = [c.result for c in commands]
        if attempt == 0 and isinstance(results[0], NoScriptError):
            await redis.script_load(script.script)  # to every master; then once more
            continue
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # A moved slot or a node that stopped being master: reload the map for the retry.
            await _reload(redis)
            raise QueueUnavailable(f"redis failing over: {errors[0]}")
        return results[0], int(results[-1])  # type: ignore[arg-type]
    raise QueueUnavailable("the script could not be loaded on its node")


async def _reload(redis: RedisCluster) -> None:
    """Re-read the slot map (best effort: while no node answers, the next call tries again)."""
    with contextlib.suppress(RedisError, RedisClusterException, OSError):
        await redis.nodes_manager.initialize()
