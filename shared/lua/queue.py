"""The queue's Lua scripts (`inferq.shared.queue` runs them). Each is atomic, so each is
safe to retry.

They use the prelude tables of `inferq.shared.lua`: `F` (job fields), `S` (statuses),
`FINAL`, `ENTRY_JOB`. Field values are msgpack (`cmsgpack` in Lua).

- `SUBMIT`: admission caps (items and bytes) + idempotency key + record + stream entry, all
  or nothing; a no-op if the job id (or the idempotency key) already exists, a `conflict` if
  the key was made by a request with another fingerprint. The byte cap
  always admits into an empty queue, so one job larger than the cap is not refused forever.
- `CLAIM`: mark jobs running (only from queued) and read them, in one trip.
- `START`: right before a batch, count each job's first device start (`attempts`), so a crash
  that never returns still counts, and write each job's progress (`items_done`); returns the
  live statuses and whether a cancel was asked.
- `REQUEST_CANCEL`: mark a running job for its worker to end `cancelled` at its next batch.
- `KEEP`: give a job's record the default TTL and index instead of the brief ones it was
  made with.
- `FINISH`: write the final fields, set the TTL, release the admission counts, publish to
  the API processes the record names, else unaddressed (`keys.done_channel`) (and
  dead-letter a poisoned job, queue its webhook delivery, fill the result cache), unless the
  job is already final: a duplicate delivery after a crash can never clobber a result, and a
  job is published (and delivered) once.
- `LISTEN`: read a job's record, and have FINISH also tell the API process `listener` when
  it ends (one script: a FINISH cannot fall between the two, so a wait misses nothing).
- `CACHED`: record a job answered from the result cache, final at birth (TTL, idempotency
  key and webhook delivery as if it had run); never queued, so never published.
- `HAND_BACK`: a stopping worker re-queues a job it holds, at once, taking back the device
  start it counted (a clean stop is not a crash).
"""

from __future__ import annotations

# An idempotency key holds "<job id> <fingerprint>" (or the job id alone, written before
# fingerprints or without one): the job its request created, and a digest of that request. A
# repeat whose fingerprint differs gets {'conflict', job id}, never the other request's job.
_IDEMPOTENT = """
local function prior_job(key, fingerprint)
  local prior = redis.call('GET', key)
  if not prior then return nil end
  local id, was = string.match(prior, '^(.*) (%x+)$')
  if not id then return {'dup', prior} end
  if fingerprint ~= '' and was ~= fingerprint then return {'conflict', id} end
  return {'dup', id}
end
local function bound_to(id, fingerprint)
  if fingerprint == '' then return id end
  return id .. ' ' .. fingerprint
end
"""

# The tenant's job index (`keys.tenant_jobs`, what GET /v1/jobs pages through): a new job's
# record key is added by creation time, and the two oldest are checked and dropped if their
# record has expired. Each call adds one and may drop two, so the index follows the records'
# lifetime without a sweeper while its records expire in the order they were made (brief
# ones have an index of their own). A record kept longer (its own `result_ttl_s`, up to
# days) at the head would stop that, so two members picked at random are checked too: each
# call then drops two × the share of gone members, which holds them to about half the index
# whatever sits at its head. The listing drops the ones it meets too. Members are record
# keys, not ids, so each check is an EXISTS with nothing built in Lua.
_INDEX = """
local function drop_gone(index, members)
  for _, old in ipairs(members) do
    if redis.call('EXISTS', old) == 0 then redis.call('ZREM', index, old) end
  end
end
local function index_add(index, key, created)
  redis.call('ZADD', index, created, key)
  drop_gone(index, redis.call('ZRANGE', index, 0, 1))
  drop_gone(index, redis.call('ZRANDMEMBER', index, 2))
end
"""

# KEYS: job, stream, item counter, byte counter, tenant item counter, tenant byte counter,
# tenant job index [, idempotency]. ARGV: id, items, max_queue, idem_ttl_s, bytes, max_bytes,
# tenant max items, tenant max bytes (0, 0: the tenant's counters are not kept), fingerprint
# ('' for none), created ms, fields...
# Returns {status, value}: ok → entry id; dup → existing job id; conflict → the job id a
# different request made under the key; full → items queued; full_bytes → bytes queued;
# tenant_full → the tenant's items; tenant_bytes → its bytes.
# A job counted against its tenant's counters is marked (F.quota), so FINISH takes back
# exactly what SUBMIT added, whatever the settings are by then.
SUBMIT = (
    _IDEMPOTENT
    + _INDEX
    + """
if #KEYS == 8 then
  local prior = prior_job(KEYS[8], ARGV[9])
  if prior then return prior end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'dup', ARGV[1]} end
local c = redis.call('MGET', KEYS[3], KEYS[4], KEYS[5], KEYS[6])
local depth, held = tonumber(c[1] or '0'), tonumber(c[2] or '0')
if depth + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {'full', tostring(depth)} end
if held > 0 and held + tonumber(ARGV[5]) > tonumber(ARGV[6]) then return {'full_bytes', tostring(held)} end
local quota = tonumber(ARGV[7]) > 0
if quota then
  local mine, mine_bytes = tonumber(c[3] or '0'), tonumber(c[4] or '0')
  if mine > 0 and mine + tonumber(ARGV[2]) > tonumber(ARGV[7]) then
    return {'tenant_full', tostring(mine)}
  end
  if mine_bytes > 0 and mine_bytes + tonumber(ARGV[5]) > tonumber(ARGV[8]) then
    return {'tenant_bytes', tostring(mine_bytes)}
  end
end
local eid = redis.call('XADD', KEYS[2], '*', ENTRY_JOB, ARGV[1])
if quota then
  redis.call('HSET', KEYS[1], F.entry, cmsgpack.pack(eid), F.quota, cmsgpack.pack(true), unpack(ARGV, 11))
  redis.call('INCRBY', KEYS[5], ARGV[2])
  redis.call('INCRBY', KEYS[6], ARGV[5])
else
  redis.call('HSET', KEYS[1], F.entry, cmsgpack.pack(eid), unpack(ARGV, 11))
end
redis.call('INCRBY', KEYS[3], ARGV[2])
redis.call('INCRBY', KEYS[4], ARGV[5])
index_add(KEYS[7], KEYS[1], ARGV[10])
if #KEYS == 8 then redis.call('SET', KEYS[8], bound_to(ARGV[1], ARGV[9]), 'EX', ARGV[4]) end
return {'ok', eid}
"""
)

# KEYS: jobs. ARGV[1] = packed now_ms; ARGV[2] = '1' when the worker starts these jobs at
# once (it is idle and read one job): a one-item job not yet at ARGV[3] (max deliveries) nor
# past its deadline gets its device start counted here, as START would a moment later, and
# START's round trip is skipped. Returns per key {} if missing, else {the record as HGETALL
# read it before the count, 1 if counted here else 0}.
CLAIM = """
local now = cmsgpack.unpack(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then
    out[i] = {}
  else
    local at = {}
    for j = 1, #flat, 2 do at[flat[j]] = j + 1 end
    local status = cmsgpack.unpack(flat[at[F.status]])
    local changes, counted = {}, 0
    if status == S.queued then
      flat[at[F.status]] = cmsgpack.pack(S.running)
      changes = {F.status, flat[at[F.status]], F.started_ms, ARGV[1]}
      if at[F.started_ms] then flat[at[F.started_ms]] = ARGV[1] else
        flat[#flat + 1] = F.started_ms
        flat[#flat + 1] = ARGV[1]
      end
    end
    if ARGV[2] == '1' and not FINAL[status] then
      local function get(f) return at[f] and cmsgpack.unpack(flat[at[f]]) or 0 end
      local attempts, deadline = get(F.attempts), get(F.deadline_ms)
      if get(F.items) == 1 and attempts < tonumber(ARGV[3]) and (deadline == 0 or now <= deadline) then
        changes[#changes + 1] = F.attempts
        changes[#changes + 1] = cmsgpack.pack(attempts + 1)
        counted = 1
      end
    end
    if #changes > 0 then redis.call('HSET', key, unpack(changes)) end
    out[i] = {flat, counted}
  end
end
return out
"""

# KEYS: jobs about to run on the device. ARGV[2i-1] = '1' if job i starts its first item in
# this worker: counted in `attempts` (device starts). A job whose worker dies while it is on
# the device comes back with one more attempt; one that merely waited in a dead worker's hands
# does not, so only the job that kills workers is ever dead-lettered. ARGV[2i] = how many of
# job i's inputs have an output so far: its progress, written here so it costs no round trip
# of its own. Returns per job {raw status ('' if gone), 1 if a cancel was asked while it ran}.
START = """
local out = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, F.status, F.attempts, F.cancel)
  out[i] = {h[1] or '', h[3] and 1 or 0}
  if h[1] and not FINAL[cmsgpack.unpack(h[1])] then
    if ARGV[2 * i - 1] == '1' then
      redis.call('HSET', key, F.attempts, cmsgpack.pack((h[2] and cmsgpack.unpack(h[2]) or 0) + 1))
    end
    local done = tonumber(ARGV[2 * i])
    if done > 0 then redis.call('HSET', key, F.items_done, cmsgpack.pack(done)) end
  end
end
return out
"""

# KEYS: job. A client cancels a job a worker has started: it is marked, and its worker ends
# it `cancelled`, with the outputs it has, at its next batch boundary (START says so; a worker
# that claims it after a crash ends it at once). Returns the status ('' if gone); marks
# only a running job (a queued one is made final by FINISH; a final one stays as it is).
REQUEST_CANCEL = """
local raw = redis.call('HGET', KEYS[1], F.status)
if not raw then return '' end
local status = cmsgpack.unpack(raw)
if status == S.running then redis.call('HSET', KEYS[1], F.cancel, cmsgpack.pack(true)) end
return status
"""

# KEYS: job, its brief index, its tenant's default index. ARGV: the default TTL.
# A job whose record was to live briefly (answered in its response) is kept the default TTL
# after all: its wait ran out, and the 202's Location must still find it. Final already (it
# ended after the wait): the TTL changes now; not yet: FINISH sets the default, finding no
# `result_ttl`. It moves to the default index, whose members expire in the order they were
# made. One script, so a FINISH in between cannot slip through.
KEEP = (
    _INDEX
    + """
local raw = redis.call('HGET', KEYS[1], F.status)
if not raw then return 0 end
redis.call('HDEL', KEYS[1], F.result_ttl)
if FINAL[cmsgpack.unpack(raw)] then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
local created = redis.call('ZSCORE', KEYS[2], KEYS[1])
if created then
  redis.call('ZREM', KEYS[2], KEYS[1])
  index_add(KEYS[3], KEYS[1], created)
end
return 1
"""
)

# A webhook fires on the final statuses its job asked for (`events`; all of them without).
_WANTS = """
local function wants(spec, status)
  if not spec.events then return true end
  for _, e in ipairs(spec.events) do
    if e == status then return true end
  end
  return false
end
"""

# The record without its inputs, packed: what a webhook's delivery entry carries. Large
# outputs the caller already holds (`outputs`: FINISH's argument) are not read back: every
# value read into Lua is copied and hashed whole (~1 µs a KiB; 32 vectors are 49 KiB), so
# the rest is read by name and the outputs added from the argument. Small ones: one HGETALL
# is cheaper than naming the fields.
_RECORD = """
local BIG_OUTPUTS = 8192
local function record_without_inputs(key, outputs)
  local flat = {}
  if outputs and #outputs > BIG_OUTPUTS then
    local wanted = {}
    for _, name in ipairs(redis.call('HKEYS', key)) do
      if name ~= F.inputs and name ~= F.outputs then wanted[#wanted + 1] = name end
    end
    local values = redis.call('HMGET', key, unpack(wanted))
    for j = 1, #wanted do
      flat[#flat + 1] = wanted[j]
      flat[#flat + 1] = values[j]
    end
    flat[#flat + 1] = F.outputs
    flat[#flat + 1] = outputs
  else
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      if all[j] ~= F.inputs then
        flat[#flat + 1] = all[j]
        flat[#flat + 1] = all[j + 1]
      end
    end
  end
  return cmsgpack.pack(flat)
end
"""

# Final outcomes for a batch of jobs in one call (a script call costs Redis far more than
# the writes inside it). KEYS: item counter, byte counter, dead-letter stream, webhook stream,
# cache index, cache sizes, cache bytes, then `ns` job streams, then per job: the job, its
# tenant's item counter, byte counter and webhook counter.
# ARGV: ttl_s (the default: a job's own `result_ttl_s` wins), only_if_queued (0|1), now_ms, group, keep_inputs (0|1), ns, then per stream:
# m, m entry ids to XACK + XDEL; then per job: channel, dead (0|1), 2n, n field/value pairs.
# Returns per job: 1 written, 0 already final, 2 not queued (only_if_queued), -1 no such job.
# A job written final that asked for a webhook gets its delivery entry in the same step,
# carrying the final record (the delivery needs nothing else, however late it runs), and
# a succeeded job that asked for caching stores its outputs (bounded: see `keys`), so neither
# can be lost between the final write and a later call. The acks ride in the same script:
# one round trip, atomic, and no MULTI (whose script pre-check costs another trip).
# Inputs are dropped from the record unless keep_inputs: a finished job holds its outcome.
# The completion message carries the fields written here and the worker's progress fields
# (`PROGRESS`) when they are small, so a waiting API answers without reading the record
# back (it has the rest); otherwise it says 'final'.
FINISH = (
    _WANTS
    + _RECORD
    + """
local now = tonumber(ARGV[3])
local PUBLISH_MAX = 262144
local PROGRESS = {F.started_ms, F.attempts, F.items_done}  -- written by the job's worker
local function cache_drop(k)
  local size = redis.call('HGET', KEYS[6], k)
  if size then
    redis.call('HDEL', KEYS[6], k)
    if redis.call('DECRBY', KEYS[7], size) < 0 then redis.call('SET', KEYS[7], 0) end
  end
  redis.call('ZREM', KEYS[5], k)
  redis.call('DEL', k)
end
local function cache_put(spec, value)
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 64)) do
    cache_drop(k)
  end
  if #value > spec.max_bytes then return end
  cache_drop(spec.key)
  redis.call('SET', spec.key, value, 'PX', math.floor(spec.ttl_s * 1000))
  redis.call('ZADD', KEYS[5], now + math.floor(spec.ttl_s * 1000), spec.key)
  redis.call('HSET', KEYS[6], spec.key, #value)
  local held = redis.call('INCRBY', KEYS[7], #value)
  while held > spec.max_bytes do
    local first = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    if not first then break end
    cache_drop(first)
    held = tonumber(redis.call('GET', KEYS[7]) or '0')
  end
end
local function release(counter, packed)
  if packed and redis.call('DECRBY', counter, cmsgpack.unpack(packed)) < 0 then
    redis.call('SET', counter, 0)
  end
end
local ns = tonumber(ARGV[6])
local a = 7
for j = 8, 7 + ns do
  local m = tonumber(ARGV[a])
  if m > 0 then
    redis.call('XACK', KEYS[j], ARGV[4], unpack(ARGV, a + 1, a + m))
    redis.call('XDEL', KEYS[j], unpack(ARGV, a + 1, a + m))
  end
  a = a + m + 1
end
local out = {}
for i = 8 + ns, #KEYS, 4 do
  local key, channel, dead, n = KEYS[i], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local first, last = a + 3, a + 2 + n
  a = last + 1
  local h = redis.call(
    'HMGET', key, F.status, F.items, F.bytes, F.quota, F.id, F.cache, F.webhook, F.result_ttl,
    F.listeners, F.started_ms, F.attempts, F.items_done
  )
  local status = h[1] and cmsgpack.unpack(h[1])
  if not h[1] then
    out[#out + 1] = -1
  elseif FINAL[status] then
    out[#out + 1] = 0
  elseif ARGV[2] == '1' and status ~= S.queued then
    out[#out + 1] = 2
  else
    redis.call('HSET', key, unpack(ARGV, first, last))
    redis.call('EXPIRE', key, h[8] and cmsgpack.unpack(h[8]) or ARGV[1])
    release(KEYS[1], h[2])
    release(KEYS[2], h[3])
    if h[4] then
      release(KEYS[i + 1], h[2])
      release(KEYS[i + 2], h[3])
    end
    local id = cmsgpack.unpack(h[5])
    if dead == '1' then
      redis.call('XADD', KEYS[3], '*', ENTRY_JOB, id)
    end
    local final = cmsgpack.unpack(redis.call('HGET', key, F.status))
    local outputs
    for f = first, last, 2 do
      if ARGV[f] == F.outputs then outputs = ARGV[f + 1] end
    end
    if h[6] and final == S.succeeded then
      outputs = outputs or redis.call('HGET', key, F.outputs)
      if outputs then cache_put(cmsgpack.unpack(h[6]), outputs) end
    end
    if ARGV[5] ~= '1' then redis.call('HDEL', key, F.inputs) end
    if h[7] and wants(cmsgpack.unpack(h[7]), final) then
      redis.call('XADD', KEYS[4], '*', D.job, id, D.record, record_without_inputs(key, outputs))
      redis.call('INCR', KEYS[i + 3])
    end
    -- What this call wrote, after what the worker wrote while the job ran: every waiter
    -- holds the record as it was queued or running and lays these over it
    -- (`jobs.published_job`), so the record is never read back into Lua for it.
    local said = {}
    for j, name in ipairs(PROGRESS) do
      if h[9 + j] then
        said[#said + 1] = name
        said[#said + 1] = h[9 + j]
      end
    end
    for f = first, last do said[#said + 1] = ARGV[f] end
    local packed = cmsgpack.pack(said)
    local message = #packed <= PUBLISH_MAX and packed or 'final'
    if h[9] then  -- only the API processes that wait on it (keys.done_channel)
      local base = channel:sub(1, #channel - #id)
      for listener in string.gmatch(cmsgpack.unpack(h[9]), '%S+') do
        redis.call('PUBLISH', base .. listener .. ':' .. id, message)
      end
    else
      redis.call('PUBLISH', channel, message)
    end
    out[#out + 1] = 1
  end
end
return out
"""
)

# KEYS: job. ARGV: listener id. Returns the record (HGETALL).
LISTEN = """
local LISTENERS_MAX = 16  -- past them, a process's waits re-read on their timer
local h = redis.call('HMGET', KEYS[1], F.status, F.listeners)
if h[1] and not FINAL[cmsgpack.unpack(h[1])] then
  local have = h[2] and cmsgpack.unpack(h[2]) or ''
  local _, n = string.gsub(have, '%S+', '')
  if n < LISTENERS_MAX and not string.find(' ' .. have .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then
    local both = have == '' and ARGV[1] or have .. ' ' .. ARGV[1]
    redis.call('HSET', KEYS[1], F.listeners, cmsgpack.pack(both))
  end
end
return redis.call('HGETALL', KEYS[1])
"""

# KEYS: job, webhook stream, the tenant's webhook counter, the tenant's job index
# [, idempotency]. ARGV: id, ttl_s, idem_ttl_s, fingerprint, created ms, fields... (inputs
# already left out unless kept)
# Returns {status, value}: ok → ''; dup / conflict → the existing job id (as SUBMIT).
CACHED = (
    _IDEMPOTENT
    + _WANTS
    + _INDEX
    + _RECORD
    + """
if #KEYS == 5 then
  local prior = prior_job(KEYS[5], ARGV[4])
  if prior then return prior end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'dup', ARGV[1]} end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[2])
index_add(KEYS[4], KEYS[1], ARGV[5])
local webhook = redis.call('HGET', KEYS[1], F.webhook)
if webhook and wants(cmsgpack.unpack(webhook), S.succeeded) then
  redis.call('XADD', KEYS[2], '*', D.job, ARGV[1], D.record, record_without_inputs(KEYS[1]))
  redis.call('INCR', KEYS[3])
end
if #KEYS == 5 then redis.call('SET', KEYS[5], bound_to(ARGV[1], ARGV[4]), 'EX', ARGV[3]) end
return {'ok', ''}
"""
)

# KEYS: job, stream. ARGV: group, old entry id, job id, uncount (0|1).
# Re-queues a not-final job at the tail and acks the old entry; with uncount, takes back the
# device start this (cleanly stopping) worker counted.
HAND_BACK = """
local raw = redis.call('HGET', KEYS[1], F.status)
if raw and not FINAL[cmsgpack.unpack(raw)] then
  local eid = redis.call('XADD', KEYS[2], '*', ENTRY_JOB, ARGV[3])
  redis.call('HSET', KEYS[1], F.status, cmsgpack.pack(S.queued), F.entry, cmsgpack.pack(eid))
  redis.call('HDEL', KEYS[1], F.started_ms)
  if ARGV[4] == '1' then
    local attempts = redis.call('HGET', KEYS[1], F.attempts)
    local n = attempts and cmsgpack.unpack(attempts) or 0
    if n > 0 then redis.call('HSET', KEYS[1], F.attempts, cmsgpack.pack(n - 1)) end
  end
end
redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[2])
return raw and 1 or 0
"""


# KEYS: streams. ARGV: group, consumer, then per stream: n, n entry ids held by `consumer`.
# Resets the idle time of the entries still in `consumer`'s own pending list (XCLAIM JUSTID
# does not count a delivery) and returns, per stream, the ids that are not: another worker
# took them over while this one was unresponsive. A plain XCLAIM would steal them back.
REFRESH = """
local out, a = {}, 3
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  local mine = {}
  for _, p in ipairs(redis.call('XPENDING', key, ARGV[1], '-', '+', 100000, ARGV[2])) do
    mine[p[1]] = true
  end
  local claim, lost = {'XCLAIM', key, ARGV[1], ARGV[2], 0}, {}
  for j = a + 1, a + n do
    if mine[ARGV[j]] then claim[#claim + 1] = ARGV[j] else lost[#lost + 1] = ARGV[j] end
  end
  if #claim > 5 then
    claim[#claim + 1] = 'JUSTID'
    redis.call(unpack(claim))
  end
  out[i] = lost
  a = a + n + 1
end
return out
"""
