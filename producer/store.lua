-- Every state change rerankq makes to a stream, one command per call, so each is atomic.
--
-- KEYS (always, in this order): spec, candidates, meta, results, attempts, pending, events
-- ARGV[1]: the command; ARGV[2]: now in milliseconds; the rest depend on the command.
--
-- Return codes shared by commands: -3 the stream does not exist (never opened or expired).

local spec_key, cands_key, meta_key, results_key, attempts_key, pending_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local command = ARGV[1]
local now = tonumber(ARGV[2])

local function expire_all(expire_at)
  for _, key in ipairs(KEYS) do
    redis.call('PEXPIREAT', key, expire_at)
  end
end

-- Admit windows up to `target` (bounded by the candidate count); each new window is
-- put in the pending set with a deadline, which the sweep uses to find lost messages.
local function admit(target, deadline)
  local n = tonumber(redis.call('HGET', meta_key, 'n'))
  local size = tonumber(redis.call('HGET', meta_key, 'window_size'))
  local admitted = tonumber(redis.call('HGET', meta_key, 'admitted'))
  local n_windows = math.floor((n + size - 1) / size)
  if target > n_windows then target = n_windows end
  local new = {}
  for w = admitted, target - 1 do
    redis.call('ZADD', pending_key, deadline, w)
    table.insert(new, w)
  end
  if target > admitted then
    redis.call('HSET', meta_key, 'admitted', target)
    local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
    redis.call('PEXPIREAT', pending_key, expire_at)
  end
  return new
end

if command == 'open' then
  -- ARGV: fingerprint, expire_at, spec, window_size, first_windows, deadline, candidate...
  local fingerprint, expire_at = ARGV[3], tonumber(ARGV[4])
  if redis.call('EXISTS', meta_key) == 1 then
    if redis.call('HGET', meta_key, 'fingerprint') ~= fingerprint then
      return {-1}
    end
    return {0}
  end
  local n = #ARGV - 8
  redis.call('SET', spec_key, ARGV[5])
  for i = 9, #ARGV, 500 do
    redis.call('RPUSH', cands_key, unpack(ARGV, i, math.min(i + 499, #ARGV)))
  end
  redis.call('HSET', meta_key, 'n', n, 'window_size', ARGV[6], 'admitted', 0, 'committed', 0,
    'fingerprint', fingerprint, 'created_at', now, 'expire_at', expire_at)
  local new = admit(tonumber(ARGV[7]), tonumber(ARGV[8]))
  expire_all(expire_at)
  table.insert(new, 1, 1)
  return new

elseif command == 'admit' then
  -- ARGV: target window count, deadline
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local new = admit(tonumber(ARGV[3]), tonumber(ARGV[4]))
  table.insert(new, 1, 1)
  return new

elseif command == 'begin' then
  -- A delivery starts on a window. ARGV: window, lease expiry (ms), delivery id.
  -- Returns the attempt number, -1 when already committed, -2 when never admitted,
  -- -4 when another delivery holds a live lease on it.
  --
  -- The lease is what keeps the attempt count honest under at-least-once delivery:
  -- a duplicate (a sweep's re-send while the first delivery is still scoring) is
  -- turned away without counting, while the same delivery coming back (its process
  -- was killed and Celery requeued the message) takes the lease over and counts.
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local window = ARGV[3]
  local lease_until, delivery = tonumber(ARGV[4]), ARGV[5]
  if redis.call('HEXISTS', results_key, window) == 1 then return -1 end
  if tonumber(window) >= tonumber(redis.call('HGET', meta_key, 'admitted')) then return -2 end
  local holder = redis.call('HMGET', attempts_key, 'holder:' .. window, 'until:' .. window)
  if holder[1] and holder[1] ~= delivery and tonumber(holder[2]) > now then return -4 end
  local attempt = redis.call('HINCRBY', attempts_key, window, 1)
  redis.call('HSET', attempts_key, 'holder:' .. window, delivery, 'until:' .. window, lease_until)
  redis.call('PEXPIREAT', attempts_key, tonumber(redis.call('HGET', meta_key, 'expire_at')))
  -- The sweep leaves the window be until the lease runs out.
  redis.call('ZADD', pending_key, 'XX', lease_until, window)
  return attempt

elseif command == 'commit' then
  -- ARGV: window, encoded result, event log maxlen. Writes only the first commit.
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local window = ARGV[3]
  if redis.call('HEXISTS', results_key, window) == 1 then return 0 end
  local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
  redis.call('HSET', results_key, window, ARGV[4])
  redis.call('ZREM', pending_key, window)
  redis.call('HDEL', attempts_key, 'holder:' .. window, 'until:' .. window)
  redis.call('HINCRBY', meta_key, 'committed', 1)
  redis.call('XADD', events_key, 'MAXLEN', '~', ARGV[5], '*', 'window', window)
  redis.call('PEXPIREAT', results_key, expire_at)
  redis.call('PEXPIREAT', events_key, expire_at)
  return 1

elseif command == 'due' then
  -- The sweep: admitted, uncommitted windows whose deadline (enqueue grace or lease)
  -- passed; their deadline moves to ARGV[3] so a second sweeper does not take them too.
  if redis.call('EXISTS', meta_key) == 0 then return {} end
  local due = redis.call('ZRANGEBYSCORE', pending_key, '-inf', now)
  for _, window in ipairs(due) do
    redis.call('ZADD', pending_key, tonumber(ARGV[3]), window)
  end
  return due
end

return redis.error_reply('unknown command ' .. tostring(command))
