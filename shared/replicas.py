"""Acknowledge only what the replicas hold: a write and its WAIT (INFERQ_REDIS_WAIT_REPLICAS).

WAIT counts the replicas that have everything *the connection it runs on* wrote. So the write
and its WAIT go out in one pipeline, which is one connection; a pipeline retried after a
dropped connection runs again whole on the new one (maybe another node, after a failover),
so a WAIT never vouches for a write made elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

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
