"""The Batch API's Lua scripts (`inferq.api.batches.store` runs them): batch records, their
line results, their input files and their leases. Each touches one batch's (or one file's)
keys, so each runs on one slot of a cluster.

They use the prelude tables of `inferq.shared.lua`: `B` (batch fields), `BS` (batch
statuses), `BFINAL`, `FF` (file fields). Values are plain strings, not msgpack.

- `ADVANCE`: move a batch to a status from one of the given ones, stamping `<status>_at`.
- `RECORD`: record line results (HSETNX: a line recorded twice counts once) and move the
  `completed`/`failed` counts with them; nothing once the batch is final.
- `BATCH_END`: make the batch final with its file ids, once.
- `KEEP`: keep a batch's input file as long as the batch, if it is still there.
- `RENEW`, `RELEASE`: extend or drop a lease only while its owner holds it.
"""

from __future__ import annotations

# KEYS: batch. ARGV: to, timestamp field, now, from... → the status after the call.
ADVANCE = """
local st = redis.call('HGET', KEYS[1], B.status)
if not st then return '' end
for i = 4, #ARGV do
  if st == ARGV[i] then
    redis.call('HSET', KEYS[1], B.status, ARGV[1], ARGV[2], ARGV[3])
    return ARGV[1]
  end
end
return st
"""

# KEYS: results, batch. ARGV: ttl_s, then (line, value) pairs; a value's first byte is its
# kind (o: output, e: error). A line already recorded is left alone and not counted again;
# nothing is recorded once the batch is final. → {new outputs, new errors}.
RECORD = """
local st = redis.call('HGET', KEYS[2], B.status)
if not st or BFINAL[st] then return {0, 0} end
local ok, err = 0, 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    if string.sub(ARGV[i + 1], 1, 1) == 'o' then ok = ok + 1 else err = err + 1 end
  end
end
if ok > 0 then redis.call('HINCRBY', KEYS[2], B.completed, ok) end
if err > 0 then redis.call('HINCRBY', KEYS[2], B.failed, err) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {ok, err}
"""

# KEYS: batch, results. ARGV: status, timestamp field, now, output file id, error file id,
# errors JSON ('' for none), grace s. The files hold the results now; the hash stays
# `RESULTS_GRACE_S` more, so a paused ex-holder that finalizes late still writes the same
# bytes. → 1 if this call ended the batch, 0 if it had ended already. `BATCHES_ACTIVE` is in
# another slot, so the batch leaves it in a step of its own (`BatchStore.deactivate`).
BATCH_END = """
local st = redis.call('HGET', KEYS[1], B.status)
if not st or BFINAL[st] then return 0 end
redis.call('HSET', KEYS[1], B.status, ARGV[1], ARGV[2], ARGV[3],
  B.output_file_id, ARGV[4], B.error_file_id, ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], B.errors, ARGV[6]) end
redis.call('EXPIRE', KEYS[2], ARGV[7])
return 1
"""

# KEYS: file, its content. ARGV: ttl_s, expires_at. A batch's input must outlive the batch
# (a runner that takes over reads it again): keep it as long, if it is still there (a file
# deleted meanwhile is not brought back as a hash of one field). → 1 if it is there.
KEEP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], FF.expires_at, ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""

# KEYS: lease. ARGV: owner, ms. Extend the lease only if we still hold it.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: lease. ARGV: owner. Drop the lease only if we still hold it.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
