-- Every state change rerankq makes to a stream, one command per call, so each is atomic.
--
-- KEYS (always, in this order): spec, candidates, meta, results, attempts, pending, events,
-- then the stream's shard: its active-stream index and its counters, then the stream's
-- embeddings (written by a commit only), then the shard's indexes of uncommitted windows,
-- one per device (each key ends in ':<device>'). All carry the shard's hash tag, so a call
-- touches one Cluster slot.
-- ARGV[1]: the command; ARGV[2]: now in milliseconds; the rest depend on the command.
--
-- Under maxmemory Redis refuses a script at its first write that could grow memory, before
-- anything is written, and lets a script that has already written finish: either way a
-- command happens whole or not at all.
--
-- Return codes shared by commands: -3 the stream does not exist (never opened or expired),
-- -5 no such window (not a canonical integer in [0, n_windows)).
--
-- A window's queued mark, meta field 'queued:<w>' (ms), says a message for it was (about to
-- be) sent then and no delivery has begun it since: set where a window is admitted or claimed
-- by the sweep for a re-send, cleared by begin, commit and hurry (a send that failed). The sweep
-- trusts it where it cannot look into the queues (RabbitMQ), up to an age limit.

local spec_key, cands_key, meta_key, results_key, attempts_key, pending_key, events_key, active_key, counters_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local embeddings_key = KEYS[10]
local command = ARGV[1]
local now = tonumber(ARGV[2])

local function expire_own(expire_at)
  for i = 1, 7 do
    redis.call('PEXPIREAT', KEYS[i], expire_at)
  end
end

-- The shard index lives as long as its longest-lived stream: its expiry only ever moves out
-- (Redis 6.2 has no PEXPIREAT GT, hence the PTTL).
local function extend_expiry(key, expire_at)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or now + ttl < expire_at then
    redis.call('PEXPIREAT', key, expire_at)
  end
end

-- The stream's id, as its keys spell it (ids never contain a colon).
local stream_id = string.match(meta_key, ':([^:]+):meta$')

-- The shard's indexes of uncommitted windows, one per device, found by name wherever they
-- stand among the keys. Members are '<stream>:<window>', scored by the stream's expiry, so a
-- count of live entries skips expired streams without a scan (the exporter's backlog).
local uncommitted_keys = {}
for i = 10, #KEYS do
  if string.find(KEYS[i], ':uncommitted:{', 1, true) then table.insert(uncommitted_keys, KEYS[i]) end
end

-- The index for this stream's device; nil for a device no key was passed for.
local function uncommitted_key(device)
  local suffix = ':' .. tostring(device)
  for _, key in ipairs(uncommitted_keys) do
    if string.sub(key, -#suffix) == suffix then return key end
  end
  return nil
end

local function n_windows()
  local n = tonumber(redis.call('HGET', meta_key, 'n'))
  local size = tonumber(redis.call('HGET', meta_key, 'window_size'))
  return math.floor((n + size - 1) / size), size
end

-- A window number as the queue carries it: digits only, no sign, no leading zero, in range.
-- Anything else (-1, "1.0", "01", a huge number) names no window of this stream.
local function window_number(text, count)
  if type(text) ~= 'string' or #text > 9 or not string.match(text, '^%d+$') then return nil end
  if #text > 1 and string.sub(text, 1, 1) == '0' then return nil end
  local w = tonumber(text)
  if w >= count then return nil end
  return w
end

-- Admit windows up to `target` (bounded by the window count); each new window is put in
-- the pending set with a deadline, which the sweep uses to find lost messages, gets its
-- admit time (for its queue wait), and enters its device's uncommitted index.
local function admit(target, deadline)
  local count = n_windows()
  local admitted = tonumber(redis.call('HGET', meta_key, 'admitted'))
  if target > count then target = count end
  local new = {}
  for w = admitted, target - 1 do
    redis.call('ZADD', pending_key, deadline, w)
    table.insert(new, w)
  end
  if target > admitted then
    local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
    redis.call('HSET', meta_key, 'admitted', target)
    redis.call('PEXPIREAT', pending_key, expire_at)
    local index = uncommitted_key(redis.call('HGET', meta_key, 'device'))
    if index then
      -- Entries of streams that expired uncommitted are dropped here, a few at a time.
      redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
      for _, w in ipairs(new) do
        redis.call('HSET', meta_key, 'admitted_at:' .. w, now, 'queued:' .. w, now)
        redis.call('ZADD', index, expire_at, stream_id .. ':' .. w)
      end
      extend_expiry(index, expire_at)
    else
      for _, w in ipairs(new) do
        redis.call('HSET', meta_key, 'admitted_at:' .. w, now, 'queued:' .. w, now)
      end
    end
  end
  return new
end

if command == 'open' then
  -- ARGV: stream id, fingerprint, expire_at, spec, window_size, first_windows, deadline, device,
  -- lane, candidate... Returns {1, admitted windows...}; {0} for a retried open of the same job
  -- and {-1} for another job under the same key, both without writing anything. The device and
  -- lane are kept in meta: every later send of a window (a deeper pull, the sweep) goes there.
  local fingerprint, expire_at = ARGV[4], tonumber(ARGV[5])
  if redis.call('EXISTS', meta_key) == 1 then
    if redis.call('HGET', meta_key, 'fingerprint') ~= fingerprint then
      return {-1}
    end
    return {0}
  end
  local first_candidate = 12
  local n = #ARGV - first_candidate + 1
  redis.call('SET', spec_key, ARGV[6])
  for i = first_candidate, #ARGV, 500 do
    redis.call('RPUSH', cands_key, unpack(ARGV, i, math.min(i + 499, #ARGV)))
  end
  redis.call('HSET', meta_key, 'n', n, 'window_size', ARGV[7], 'admitted', 0, 'committed', 0,
    'fingerprint', fingerprint, 'created_at', now, 'expire_at', expire_at, 'device', ARGV[10],
    'lane', ARGV[11])
  local new = admit(tonumber(ARGV[8]), tonumber(ARGV[9]))
  expire_own(expire_at)
  redis.call('ZADD', active_key, expire_at, stream_id)
  extend_expiry(active_key, expire_at)
  table.insert(new, 1, 1)
  return new

elseif command == 'admit' then
  -- ARGV: target window count, deadline
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local new = admit(tonumber(ARGV[3]), tonumber(ARGV[4]))
  table.insert(new, 1, 1)
  return new

elseif command == 'begin' then
  -- A delivery starts on a window. ARGV: window, lease expiry (ms), delivery id, takeover
  -- ('1' when the broker itself says it delivers this message again: RabbitMQ's redelivered
  -- flag, which no publisher can set).
  -- Returns {attempt, admitted at (ms, 0 if unknown), spec, candidate...} (the window's own
  -- candidates), or {code}:
  -- -1 already committed, -2 never admitted, -4 another delivery holds a live lease.
  --
  -- The lease is what keeps the attempt count honest under at-least-once delivery: while
  -- a delivery holds a live lease, every other begin is turned away without counting - a
  -- sweep's re-send, and a copy of the very same message too (anyone who can write to the
  -- queue can replay one). The window's own attempt ends the lease early only through
  -- 'release', sent by the worker that saw it end (its pool process died, its time limit
  -- killed it, the worker cancelled it): the requeued message then begins at once. An attempt
  -- whose whole worker died is taken over once its lease runs out, or at once by the same
  -- delivery when RabbitMQ hands it back (takeover), and counts.
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local count, size = n_windows()
  local w = window_number(ARGV[3], count)
  if w == nil then return {-5} end
  local window = ARGV[3]
  local lease_until, delivery = tonumber(ARGV[4]), ARGV[5]
  if redis.call('HEXISTS', results_key, window) == 1 then return {-1} end
  if w >= tonumber(redis.call('HGET', meta_key, 'admitted')) then return {-2} end
  local holder = redis.call('HMGET', attempts_key, 'holder:' .. window, 'until:' .. window)
  local takes_over = ARGV[6] == '1' and holder[1] == delivery
  if holder[1] and tonumber(holder[2]) > now and not takes_over then return {-4} end
  local attempt = redis.call('HINCRBY', attempts_key, window, 1)
  redis.call('HSET', attempts_key, 'holder:' .. window, delivery, 'until:' .. window, lease_until)
  redis.call('PEXPIREAT', attempts_key, tonumber(redis.call('HGET', meta_key, 'expire_at')))
  -- The sweep leaves the window be until the lease runs out; its message is queued no more.
  redis.call('ZADD', pending_key, 'XX', lease_until, window)
  redis.call('HDEL', meta_key, 'queued:' .. window)
  -- Streams opened before admit times were kept fall back to their open time.
  local admitted_at = redis.call('HGET', meta_key, 'admitted_at:' .. window) or redis.call('HGET', meta_key, 'created_at')
  local reply = {attempt, tonumber(admitted_at) or 0, redis.call('GET', spec_key)}
  for _, blob in ipairs(redis.call('LRANGE', cands_key, w * size, (w + 1) * size - 1)) do
    table.insert(reply, blob)
  end
  return reply

elseif command == 'release' then
  -- The worker that ran a delivery saw its attempt end without a commit. ARGV: window,
  -- delivery, refund: '0' when the window's own work failed (its pool process died, or the
  -- worker's time limit killed it: the attempt stands), '1' when the worker cancelled it (a
  -- shutdown, a lost broker connection: the attempt is given back). The lease ends now.
  -- Returns 1 released, 0 when that delivery holds no live lease on the window (already
  -- released, run out, or never its own).
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local w = window_number(ARGV[3], n_windows())
  if w == nil then return -5 end
  local window = ARGV[3]
  local holder = redis.call('HMGET', attempts_key, 'holder:' .. window, 'until:' .. window)
  if holder[1] ~= ARGV[4] or (tonumber(holder[2]) or 0) <= now then return 0 end
  redis.call('HSET', attempts_key, 'until:' .. window, 0)
  if ARGV[5] == '1' and (tonumber(redis.call('HGET', attempts_key, window)) or 0) > 0 then
    redis.call('HINCRBY', attempts_key, window, -1)
  end
  return 1

elseif command == 'commit' then
  -- ARGV: window, encoded result, event log maxlen, outcome (ranked, failed or poisoned),
  -- the window's encoded embeddings (empty when it has none), failovers on the way. Writes only
  -- the first commit of an admitted window, and counts it in the shard's counters and in the
  -- stream's meta (its progress, readable without decoding results). Returns 1 written, 0
  -- already committed, -2 never admitted.
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local count = n_windows()
  local w = window_number(ARGV[3], count)
  if w == nil then return -5 end
  local window = ARGV[3]
  local outcome = ARGV[6]
  if outcome ~= 'ranked' and outcome ~= 'failed' and outcome ~= 'poisoned' then
    return redis.error_reply('unknown outcome ' .. tostring(outcome))
  end
  if redis.call('HEXISTS', results_key, window) == 1 then return 0 end
  if w >= tonumber(redis.call('HGET', meta_key, 'admitted')) then return -2 end
  local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
  redis.call('HSET', results_key, window, ARGV[4])
  if ARGV[7] and #ARGV[7] > 0 then
    redis.call('HSET', embeddings_key, window, ARGV[7])
    redis.call('PEXPIREAT', embeddings_key, expire_at)
  end
  redis.call('ZREM', pending_key, window)
  redis.call('HDEL', attempts_key, 'holder:' .. window, 'until:' .. window)
  redis.call('HDEL', meta_key, 'queued:' .. window)
  redis.call('HINCRBY', meta_key, 'committed', 1)
  local failovers = tonumber(ARGV[8]) or 0
  if failovers > 0 then
    redis.call('HINCRBY', meta_key, 'failovers', failovers)
  end
  if outcome ~= 'ranked' then
    redis.call('HINCRBY', meta_key, 'failed', 1)
  end
  redis.call('XADD', events_key, 'MAXLEN', '~', ARGV[5], '*', 'window', window)
  redis.call('PEXPIREAT', results_key, expire_at)
  redis.call('PEXPIREAT', events_key, expire_at)
  for _, key in ipairs(uncommitted_keys) do
    redis.call('ZREM', key, stream_id .. ':' .. window)
  end
  redis.call('HINCRBY', counters_key, 'windows_committed', 1)
  if outcome ~= 'ranked' then
    redis.call('HINCRBY', counters_key, 'windows_' .. outcome, 1)
  end
  return 1

elseif command == 'due' then
  -- The sweep: admitted, uncommitted windows whose deadline (enqueue grace or lease)
  -- passed; their deadline moves to ARGV[3] so a second sweeper does not take them too.
  -- ARGV[4]: trust a queued mark younger than this many ms (0: never; the caller looks into
  -- the queues itself): such a window is held, not claimed. A claimed window is marked
  -- queued now (the sweep sends it). Returns {device, lane, held, window...}, or {} when
  -- nothing is due (or the stream is gone).
  if redis.call('EXISTS', meta_key) == 0 then return {} end
  local due = redis.call('ZRANGEBYSCORE', pending_key, '-inf', now)
  if #due == 0 then return {} end
  local trust_ms = tonumber(ARGV[4]) or 0
  local claimed, held = {}, 0
  for _, window in ipairs(due) do
    redis.call('ZADD', pending_key, tonumber(ARGV[3]), window)
    local mark = tonumber(redis.call('HGET', meta_key, 'queued:' .. window))
    if trust_ms > 0 and mark and now - mark < trust_ms then
      held = held + 1
    else
      redis.call('HSET', meta_key, 'queued:' .. window, now)
      table.insert(claimed, window)
    end
  end
  local route = redis.call('HMGET', meta_key, 'device', 'lane')
  table.insert(claimed, 1, held)
  table.insert(claimed, 1, route[2] or 'interactive')
  table.insert(claimed, 1, route[1] or 'cpu')
  return claimed

elseif command == 'hurry' then
  -- Make windows due now (their message could not be sent); ARGV: window...
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  for i = 3, #ARGV do
    redis.call('ZADD', pending_key, 'XX', now, ARGV[i])
    redis.call('HDEL', meta_key, 'queued:' .. ARGV[i])
  end
  return 1
end

return redis.error_reply('unknown command ' .. tostring(command))
