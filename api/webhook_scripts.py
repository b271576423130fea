"""The Redis side of webhook delivery, for `webhook_dispatch.Dispatcher` and `/v1/health`:
the three Lua scripts that each move a delivery in one step (PROMOTE: retry zset back to
the stream; SETTLE: done, retry or dead letter, then XACK+XDEL; FORGET: drop an idle
consumer), and the plain stream calls around them (the consumer group, XREADGROUP replies,
take-over with delivery counts, health counts).

Keys: `keys.webhooks()` (the stream, group `keys.WEBHOOK_GROUP`), `keys.webhook_retry()`
(the retry zset, scored by due time in ms on Redis' clock) and `keys.webhook_dead()` (the
dead-letter stream).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.shared import keys
from inferq.shared.redis_conn import unavailable

# KEYS: retry zset, stream. ARGV: most to move. Moves due retries back into the stream (as
# `{delivery: record}`) on Redis' clock, so API hosts with skewed clocks agree on "due".
# Returns {moved, ms until the next is due (-1: none)}.
PROMOTE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[1], record)
  redis.call('XADD', KEYS[2], '*', 'delivery', record)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return {#due, -1} end
return {#due, math.max(0, tonumber(nxt[2]) - now)}
"""

# KEYS: stream, retry zset, dead stream. ARGV: group, consumer, entry id, mode, then
# done: nothing | retry: delay ms, record | dead: maxlen, job id, record, reason.
# Only while `consumer` still holds the entry: one taken over meanwhile is the taker's to
# settle, so a slow deliverer never adds a second retry record or dead letter. Returns 1|0.
SETTLE = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #held == 0 then return 0 end
if ARGV[4] == 'retry' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[6])
elseif ARGV[4] == 'dead' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*',
             'job', ARGV[6], 'delivery', ARGV[7], 'reason', ARGV[8])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
return 1
"""

# KEYS: stream. ARGV: group, consumer. Deleting a consumer drops its pending entries for
# good (reliability guide #2), so only one that holds none, checked in the same step.
FORGET = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

Entry = tuple[str, dict[bytes, bytes]]


def to_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_entries(reply: Any) -> list[Entry]:
    """XREADGROUP's reply, RESP2 or RESP3, as (entry id, fields)."""
    if isinstance(reply, dict):
        reply = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [(to_str(eid), fields or {}) for _, items in reply or [] for eid, fields in items]


@unavailable
async def ensure_group(redis: Redis) -> None:
    """Create the delivery group (and the stream) unless it exists."""
    try:
        await redis.xgroup_create(keys.webhooks(), keys.WEBHOOK_GROUP, id="0", mkstream=True)
    except ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


@unavailable
async def autoclaim(redis: Redis, consumer: str, idle_ms: int, n: int) -> list[tuple[Entry, int]]:
    """Up to `n` entries idle past `idle_ms`, now `consumer`'s, with their delivery counts."""
    claimed: list[Entry] = []
    cursor = "0-0"
    for _ in range(10):  # one XAUTOCLAIM scans at most count×10 entries; bounded per pass
        reply = await redis.xautoclaim(
            keys.webhooks(), keys.WEBHOOK_GROUP, consumer, idle_ms,
            start_id=cursor, count=n - len(claimed),
        )  # fmt: skip
        cursor = to_str(reply[0])
        # An entry deleted while pending comes back empty (Redis 6.2) or is dropped (7).
        claimed += [(to_str(eid), f or {}) for eid, f in reply[1] if eid is not None]
        if cursor == "0-0" or len(claimed) >= n:
            break
    if not claimed:
        return []
    async with redis.pipeline(transaction=False) as p:
        for eid, _ in claimed:
            p.xpending_range(keys.webhooks(), keys.WEBHOOK_GROUP, eid, eid, 1)
        pending = await p.execute()
    times = [int(p[0]["times_delivered"]) if p else 1 for p in pending]
    return list(zip(claimed, times, strict=True))


@unavailable
async def counts(redis: Redis) -> dict[str, int]:
    """`/v1/health`'s `webhooks`: in the stream (new or in flight), waiting to retry, dead."""
    async with redis.pipeline(transaction=False) as p:
        p.xlen(keys.webhooks())
        p.zcard(keys.webhook_retry())
        p.xlen(keys.webhook_dead())
        queued, retrying, dead = await p.execute()
    return {"queued": int(queued), "retrying": int(retrying), "dead": int(dead)}
