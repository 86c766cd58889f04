-- The circuit breaker of one chain member, shared by every worker process.
-- One command per call, so each state change is atomic.
--
-- KEYS[1]: the member's breaker hash (fields: state, failures, open_until, probe_until)
-- ARGV[1]: the command; ARGV[2]: now in milliseconds; the rest depend on the command.
--
-- States: closed (no hash, or failures below the threshold), open (calls skipped until
-- open_until), half_open (one probe call in flight until probe_until).
-- The hash expires ARGV[ttl] after its last change, so a member that went away leaves nothing.

local key = KEYS[1]
local command = ARGV[1]
local now = tonumber(ARGV[2])

if command == 'acquire' then
  -- May this caller call the member? ARGV: probe lease ms, ttl ms.
  -- Returns 1 (closed: call), 2 (this caller holds the half-open probe: call), 0 (skip).
  local state = redis.call('HGET', key, 'state')
  if not state or state == 'closed' then return 1 end
  if state == 'open' then
    if now < tonumber(redis.call('HGET', key, 'open_until')) then return 0 end
  elseif state == 'half_open' then
    -- A probe is in flight elsewhere; if its holder died, its lease lapses and we take over.
    if now < tonumber(redis.call('HGET', key, 'probe_until')) then return 0 end
  end
  redis.call('HSET', key, 'state', 'half_open', 'probe_until', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', key, tonumber(ARGV[4]))
  return 2

elseif command == 'success' then
  -- Any success closes the breaker. Returns the state it was in.
  local state = redis.call('HGET', key, 'state') or 'closed'
  redis.call('DEL', key)
  return state

elseif command == 'failure' then
  -- ARGV: threshold, cooldown ms, ttl ms. Returns the state after the failure, 'opened'
  -- when this failure is the one that opened it.
  local threshold, cooldown, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local state = redis.call('HGET', key, 'state') or 'closed'
  local failures = redis.call('HINCRBY', key, 'failures', 1)
  if state == 'half_open' or (state == 'closed' and failures >= threshold) then
    redis.call('HSET', key, 'state', 'open', 'open_until', now + cooldown)
    state = 'opened'
  elseif state == 'closed' then
    redis.call('HSET', key, 'state', 'closed')
  end
  -- A failure reported while already open (a call that began before it opened) only counts.
  redis.call('PEXPIRE', key, ttl)
  return state
end

return redis.error_reply('unknown command ' .. tostring(command))
