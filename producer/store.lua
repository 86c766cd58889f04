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
  -- A worker starts on a window. ARGV: window, deadline.
  -- Returns the attempt number, -1 when already committed, -2 when never admitted.
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local window = ARGV[3]
  if redis.call('HEXISTS', results_key, window) == 1 then return -1 end
  if tonumber(window) >= tonumber(redis.call('HGET', meta_key, 'admitted')) then return -2 end
  local attempt = redis.call('HINCRBY', attempts_key, window, 1)
  redis.call('PEXPIREAT', attempts_key, tonumber(redis.call('HGET', meta_key, 'expire_at')))
  -- Push the deadline out while the window is being worked on, so the sweep leaves it be.
  redis.call('ZADD', pending_key, 'XX', tonumber(ARGV[4]), window)
  return attempt

elseif command == 'commit' then
  -- ARGV: window, encoded result, event log maxlen. Writes only the first commit.
  if redis.call('EXISTS', meta_key) == 0 then return -3 end
  local window = ARGV[3]
  if redis.call('HEXISTS', results_key, window) == 1 then return 0 end
  local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
  redis.call('HSET', results_key, window, ARGV[4])
  redis.call('ZREM', pending_key, window)
  redis.call('HINCRBY', meta_key, 'committed', 1)
  redis.call('XADD', events_key, 'MAXLEN', '~', ARGV[5], '*', 'window', window)
  redis.call('PEXPIREAT', results_key, expire_at)
  redis.call('PEXPIREAT', events_key, expire_at)
  return 1

elseif command == 'due' then
  -- The sweep: windows whose deadline passed; their deadline moves to ARGV[3] so a
  -- second sweeper does not take them too.
  if redis.call('EXISTS', meta_key) == 0 then return {} end
  local due = redis.call('ZRANGEBYSCORE', pending_key, '-inf', now)
  for _, window in ipairs(due) do
    redis.call('ZADD', pending_key, tonumber(ARGV[3]), window)
  end
  return due
end

return redis.error_reply('unknown command ' .. tostring(command))
