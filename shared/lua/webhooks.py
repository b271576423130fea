"""Webhook delivery's Lua scripts (`inferq.api.webhooks.store` runs them). Each names one
(model, queue shard)'s delivery keys only, which share the shard's hash tag.

They use the prelude table `D` of `inferq.shared.lua` (delivery stream entry fields).

- `PROMOTE`: move due retries from the retry zset back into the stream, on Redis' clock.
- `SETTLE`: done, retry or dead letter, then XACK+XDEL, only while the consumer holds it;
  settled for good, the tenant's counter of unsettled deliveries one down.
- `FORGET`: drop a consumer that holds nothing (dropping one that holds entries loses them).
"""

from __future__ import annotations

# KEYS: retry zset, stream. ARGV: most to move. Moves due retries back into the stream (as
# `{delivery: record}`) on Redis' clock, so API hosts with skewed clocks agree on "due".
# Returns {moved, ms until the next is due (-1: none)}.
PROMOTE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[1], record)
  redis.call('XADD', KEYS[2], '*', D.delivery, record)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return {#due, -1} end
return {#due, math.max(0, tonumber(nxt[2]) - now)}
"""

# KEYS: stream, retry zset, dead stream[, the tenant's counter of unsettled deliveries].
# ARGV: group, consumer, entry id, mode, then
# done: nothing | retry: delay ms, record | dead: maxlen, job id, record, reason.
# Only while `consumer` still holds the entry: one taken over meanwhile is the taker's to
# settle, so a slow deliverer never adds a second retry record or dead letter, nor counts the
# tenant down twice. Done or dead is for good: the counter FINISH/CACHED counted up goes one
# down (never below 0, and never created); a retry (or a deferral) stays counted. Returns 1|0.
SETTLE = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #held == 0 then return 0 end
if ARGV[4] == 'retry' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[6])
elseif ARGV[4] == 'dead' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*',
             D.job, ARGV[6], D.delivery, ARGV[7], D.reason, ARGV[8])
end
if KEYS[4] and ARGV[4] ~= 'retry' and tonumber(redis.call('GET', KEYS[4]) or '0') > 0 then
  redis.call('DECR', KEYS[4])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
return 1
"""

# KEYS: stream. ARGV: group, consumer. Deleting a consumer drops its pending entries for
# good (no XAUTOCLAIM can find them after), so only one that holds none, checked in the
# same step.
FORGET = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
