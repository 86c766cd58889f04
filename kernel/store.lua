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
-- -5 no such window (not a canonical integer in [0, n_windows): a cascade's later stages'
-- slots included).
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

-- == Fair share: each device queue's ledger of what each bucket (a tenant and lane, or a
-- stream without a tenant) has queued, and the windows it holds back. ==
--
-- KEYS (the device's ledger, one hash tag): queued, inflight, waiting, deferred, turns.
--   queued    HASH  '<bucket> w' windows and '<bucket> t' tokens sent and not done, '<bucket> n'
--                   windows and '<bucket> c' tokens waiting; 'seq' orders the waiting entries
--   inflight  HASH  '<stream>:<window>' -> '<bucket> <cost> <expire_at>'
--   waiting   ZSET  (score 0, by name) '<bucket> <seq> <stream>:<window> <cost> <expire_at> <lane>'
--   deferred  HASH  '<stream>:<window>' -> its waiting entry
--   turns     LIST  the buckets with windows waiting, in the order they are served
-- ARGV[3], ARGV[4]: a bucket's bound in windows and in tokens. A bucket with nothing in flight
-- may always send one window, whatever it costs, so every bucket makes progress. Bucket names
-- and members never hold a space (tokens, stream ids), so ' ' separates fields.
if string.sub(command, 1, 5) == 'fair_' then
  local queued_key, inflight_key, waiting_key, deferred_key, turns_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
  local max_windows, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])

  local function fits(bucket, cost)
    local held = redis.call('HMGET', queued_key, bucket .. ' w', bucket .. ' t')
    local windows, tokens = tonumber(held[1]) or 0, tonumber(held[2]) or 0
    return windows == 0 or (windows < max_windows and tokens + cost <= max_tokens)
  end

  local function take(bucket, member, cost, expire_at)
    redis.call('HINCRBY', queued_key, bucket .. ' w', 1)
    redis.call('HINCRBY', queued_key, bucket .. ' t', cost)
    redis.call('HSET', inflight_key, member, bucket .. ' ' .. cost .. ' ' .. expire_at)
  end

  local function give_back(member)
    local entry = redis.call('HGET', inflight_key, member)
    if not entry then return end
    local bucket, cost = string.match(entry, '^(%S+) (%d+)')
    redis.call('HDEL', inflight_key, member)
    if redis.call('HINCRBY', queued_key, bucket .. ' w', -1) <= 0 then
      redis.call('HDEL', queued_key, bucket .. ' w', bucket .. ' t')
    else
      redis.call('HINCRBY', queued_key, bucket .. ' t', -tonumber(cost))
    end
  end

  local function unwait(entry)
    local bucket, member, cost = string.match(entry, '^(%S+) %S+ (%S+) (%d+)')
    redis.call('ZREM', waiting_key, entry)
    redis.call('HDEL', deferred_key, member)
    if redis.call('HINCRBY', queued_key, bucket .. ' n', -1) <= 0 then
      redis.call('HDEL', queued_key, bucket .. ' n', bucket .. ' c')
      redis.call('LREM', turns_key, 0, bucket)  -- its turn ends with its last waiting window
    else
      redis.call('HINCRBY', queued_key, bucket .. ' c', -tonumber(cost))
    end
  end

  local function oldest(bucket)
    local found = redis.call('ZRANGEBYLEX', waiting_key, '[' .. bucket .. ' ', '(' .. bucket .. '!', 'LIMIT', 0, 1)
    return found[1]
  end

  -- One window per bucket per turn, round robin over the buckets that have any waiting, for
  -- as long as a whole round releases something (at most 64 windows a call). A waiting entry
  -- of a stream that expired is dropped on the way.
  local function release()
    local released = {}
    local steps = 0
    while #released < 64 and steps < 512 do
      local round = redis.call('LLEN', turns_key)
      if round == 0 then break end
      local before = #released
      for _ = 1, round do
        steps = steps + 1
        local bucket = redis.call('LPOP', turns_key)
        if not bucket then break end
        local entry = oldest(bucket)
        while entry do
          local expire_at = tonumber(string.match(entry, '^%S+ %S+ %S+ %d+ (%d+)'))
          if expire_at > now then break end
          unwait(entry)
          entry = oldest(bucket)
        end
        if entry then
          local member, cost, expire_at, lane = string.match(entry, '^%S+ %S+ (%S+) (%d+) (%d+) (%S+)$')
          if fits(bucket, tonumber(cost)) then
            unwait(entry)
            take(bucket, member, tonumber(cost), expire_at)
            table.insert(released, member)
            table.insert(released, lane)
          end
          if oldest(bucket) then redis.call('RPUSH', turns_key, bucket) end
        end
        if #released >= 64 then break end
      end
      if #released == before then break end
    end
    return released
  end

  if command == 'fair_enter' then
    -- Windows a producer admitted. ARGV: bounds, bucket, stream id, expire_at, lane, then
    -- (window, cost) pairs. Returns the windows to send now; the rest wait, in order, behind
    -- the bucket's earlier ones. A window entered before is left as it is (not sent again).
    local bucket, stream, expire_at, lane = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
    local send = {}
    for i = 9, #ARGV - 1, 2 do
      local member, cost = stream .. ':' .. ARGV[i], tonumber(ARGV[i + 1])
      if redis.call('HEXISTS', inflight_key, member) == 0 and redis.call('HEXISTS', deferred_key, member) == 0 then
        if not redis.call('HGET', queued_key, bucket .. ' n') and fits(bucket, cost) then
          take(bucket, member, cost, expire_at)
          table.insert(send, ARGV[i])
        else
          local seq = redis.call('HINCRBY', queued_key, 'seq', 1)
          local entry = string.format('%s %012d %s %d %s %s', bucket, seq, member, cost, expire_at, lane)
          redis.call('ZADD', waiting_key, 0, entry)
          redis.call('HSET', deferred_key, member, entry)
          redis.call('HINCRBY', queued_key, bucket .. ' c', cost)
          if redis.call('HINCRBY', queued_key, bucket .. ' n', 1) == 1 then
            redis.call('RPUSH', turns_key, bucket)
          end
        end
      end
    end
    return send

  elseif command == 'fair_done' then
    -- Windows done with (committed, or found committed or gone): their share comes back, and
    -- whatever now fits is released. ARGV: bounds, member... Returns {member, lane, ...}, the
    -- windows the caller now sends.
    for i = 5, #ARGV do
      give_back(ARGV[i])
      local entry = redis.call('HGET', deferred_key, ARGV[i])
      if entry then unwait(entry) end  -- it ran while it waited (a re-send): it waits no more
    end
    return release()

  elseif command == 'fair_release' then
    -- The sweep's backstop: release whatever fits. ARGV: bounds. Returns as fair_done.
    return release()

  elseif command == 'fair_deferred' then
    -- Which of these members are waiting. ARGV: bounds (unused), member... Returns 1 or 0 each.
    local out = {}
    for i = 5, #ARGV do
      table.insert(out, redis.call('HEXISTS', deferred_key, ARGV[i]))
    end
    return out
  end
  return redis.error_reply('unknown command ' .. tostring(command))
end

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

-- The stream's own windows (its first stage), and their size.
local function first_stage_windows()
  local n = tonumber(redis.call('HGET', meta_key, 'n'))
  local size = tonumber(redis.call('HGET', meta_key, 'window_size'))
  return math.floor((n + size - 1) / size), size
end

-- == A cascade (kernel/windows.py): the stages after the first, as open wrote them in meta
-- field 'stages', each 'first:slots:size:keep:max_pairs:max_tokens' (0: no budget), ';' apart.
-- A later stage is handed what it reads once ('handed:<n>' = the windows it uses, 'members:<n>'
-- the candidate indexes it reads, in the previous stage's order); 'unhanded' counts the stages
-- not handed yet and 'later' the windows handed so far. A committed window of a stage that
-- hands on keeps its rows' order ('order:<w>': candidate indexes as its page shows them). ==

local function later_stages()
  local stages = {}
  local text = redis.call('HGET', meta_key, 'stages')
  if not text then return stages end
  local number = 2
  for first, slots, size, keep, pairs, tokens in string.gmatch(text, '(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)') do
    table.insert(stages, {
      number = number, first = tonumber(first), slots = tonumber(slots), size = tonumber(size),
      keep = tonumber(keep), max_pairs = tonumber(pairs), max_tokens = tonumber(tokens),
    })
    number = number + 1
  end
  return stages
end

-- Every window the stream has a slot for, its later stages' included, and the first stage's size.
local function n_windows()
  local count, size = first_stage_windows()
  for _, stage in ipairs(later_stages()) do count = count + stage.slots end
  return count, size
end

-- The later stage whose slots hold window w; nil for a window of the first stage.
local function stage_holding(w, stages)
  for _, stage in ipairs(stages) do
    if w >= stage.first and w < stage.first + stage.slots then return stage end
  end
  return nil
end

-- Whether window w was admitted: a first-stage window by the admitted count, a later stage's
-- once its stage was handed rows for it.
local function is_admitted(w, stage)
  if stage == nil then return w < tonumber(redis.call('HGET', meta_key, 'admitted')) end
  local handed = tonumber(redis.call('HGET', meta_key, 'handed:' .. stage.number))
  return handed ~= nil and w - stage.first < handed
end

local function numbers(text)
  local out = {}
  for x in string.gmatch(text or '', '%d+') do table.insert(out, tonumber(x)) end
  return out
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

-- Each new window is put in the pending set with a deadline, which the sweep uses to find
-- lost messages, gets its admit time (for its queue wait), and enters its device's
-- uncommitted index.
local function enter_pending(new, deadline)
  if #new == 0 then return end
  local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
  for _, w in ipairs(new) do
    redis.call('ZADD', pending_key, deadline, w)
    redis.call('HSET', meta_key, 'admitted_at:' .. w, now, 'queued:' .. w, now)
  end
  redis.call('PEXPIREAT', pending_key, expire_at)
  local index = uncommitted_key(redis.call('HGET', meta_key, 'device'))
  if index then
    -- Entries of streams that expired uncommitted are dropped here, a few at a time.
    redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
    for _, w in ipairs(new) do
      redis.call('ZADD', index, expire_at, stream_id .. ':' .. w)
    end
    extend_expiry(index, expire_at)
  end
end

-- Admit the first stage's windows up to `target` (bounded by its window count).
local function admit(target, deadline)
  local count = first_stage_windows()
  local admitted = tonumber(redis.call('HGET', meta_key, 'admitted'))
  if target > count then target = count end
  local new = {}
  for w = admitted, target - 1 do
    table.insert(new, w)
  end
  if target > admitted then
    redis.call('HSET', meta_key, 'admitted', target)
    enter_pending(new, deadline)
  end
  return new
end

-- Hand a later stage what it reads: the previous stage's best `keep` rows, once the previous
-- stage's windows that show them are committed (or all of them are), cut short where its
-- budget of pairs or tokens would be passed; its windows are admitted here, once, each with
-- its cost. A first stage whose committed windows show fewer than `keep` rows admits its next
-- window instead. Returns the windows admitted.
local function hand_off(stage, stages, deadline)
  if redis.call('HEXISTS', meta_key, 'handed:' .. stage.number) == 1 then return {} end
  local from, upto = 0, first_stage_windows()
  if stage.number > 2 then
    local previous = stages[stage.number - 2]
    local handed = tonumber(redis.call('HGET', meta_key, 'handed:' .. previous.number))
    if handed == nil then return {} end
    from, upto = previous.first, previous.first + handed
  end
  local read = {}
  for w = from, upto - 1 do
    local order = redis.call('HGET', meta_key, 'order:' .. w)
    if not order then
      if stage.number == 2 and w >= tonumber(redis.call('HGET', meta_key, 'admitted')) then
        return admit(w + 1, deadline)
      end
      return {}
    end
    for index in string.gmatch(order, '%d+') do
      if #read < stage.keep then table.insert(read, tonumber(index)) end
    end
    if #read >= stage.keep then break end
  end
  local pairs_each = numbers(redis.call('HGET', meta_key, 'cpairs'))
  local tokens_each = numbers(redis.call('HGET', meta_key, 'ctokens'))
  local members, pairs, tokens, stopped = {}, 0, 0, nil
  for _, index in ipairs(read) do
    local p, t = pairs_each[index + 1] or 1, tokens_each[index + 1] or 0
    if stage.max_pairs > 0 and pairs + p > stage.max_pairs then stopped = 'max_pairs' break end
    if stage.max_tokens > 0 and tokens + t > stage.max_tokens then stopped = 'max_tokens' break end
    pairs, tokens = pairs + p, tokens + t
    table.insert(members, index)
  end
  local used = math.floor((#members + stage.size - 1) / stage.size)
  redis.call('HSET', meta_key, 'handed:' .. stage.number, used, 'members:' .. stage.number,
    table.concat(members, ','), 'handed_at:' .. stage.number, now)
  if stopped then redis.call('HSET', meta_key, 'stopped:' .. stage.number, stopped) end
  redis.call('HINCRBY', meta_key, 'unhanded', -1)
  redis.call('HINCRBY', meta_key, 'later', used)
  local new = {}
  for k = 0, used - 1 do
    local w = stage.first + k
    local cost = 0
    for i = k * stage.size + 1, math.min((k + 1) * stage.size, #members) do
      cost = cost + (tokens_each[members[i] + 1] or 0)
    end
    redis.call('HSET', meta_key, 'cost:' .. w, cost)
    table.insert(new, w)
  end
  enter_pending(new, deadline)
  return new
end

-- After window w's commit: hand the stage after w's its rows if they are known now, and on
-- through any stage handed nothing (it has no windows to wait for). Returns the windows admitted.
local function hand_on(w, deadline)
  local stages = later_stages()
  if #stages == 0 or redis.call('HEXISTS', meta_key, 'cancelled_at') == 1 then return {} end
  local own = stage_holding(w, stages)
  local admitted = {}
  for i = own and own.number or 1, #stages do
    for _, x in ipairs(hand_off(stages[i], stages, deadline)) do table.insert(admitted, x) end
    local handed = tonumber(redis.call('HGET', meta_key, 'handed:' .. stages[i].number))
    if handed == nil or handed > 0 then break end
  end
  return admitted
end

if command == 'open' then
  -- ARGV: stream id, fingerprint, expire_at, spec, window_size, first_windows, deadline, device,
  -- lane, fair-share bucket, window costs (comma-separated, one per window), a cascade's later
  -- stages ('stages' above; empty for one stage), each candidate's tokens and pairs
  -- (comma-separated; empty for one stage), every stage's chain profile (comma-separated, empty
  -- for the whole chain; kept for readers), candidate...
  -- Returns {1, admitted windows...}; {0} for a retried open of the same job
  -- and {-1} for another job under the same key, both without writing anything. The device,
  -- lane, bucket and costs are kept in meta: every later send of a window (a deeper pull, the
  -- sweep) goes there, and a deeper admit answers each window's cost.
  local fingerprint, expire_at = ARGV[4], tonumber(ARGV[5])
  if redis.call('EXISTS', meta_key) == 1 then
    if redis.call('HGET', meta_key, 'fingerprint') ~= fingerprint then
      return {-1}
    end
    return {0}
  end
  local first_candidate = 18
  local n = #ARGV - first_candidate + 1
  redis.call('SET', spec_key, ARGV[6])
  for i = first_candidate, #ARGV, 500 do
    redis.call('RPUSH', cands_key, unpack(ARGV, i, math.min(i + 499, #ARGV)))
  end
  redis.call('HSET', meta_key, 'n', n, 'window_size', ARGV[7], 'admitted', 0, 'committed', 0,
    'fingerprint', fingerprint, 'created_at', now, 'expire_at', expire_at, 'device', ARGV[10],
    'lane', ARGV[11], 'bucket', ARGV[12])
  local costs, w = {}, 0
  for cost in string.gmatch(ARGV[13], '%d+') do
    table.insert(costs, 'cost:' .. w)
    table.insert(costs, cost)
    w = w + 1
    if #costs >= 1000 then
      redis.call('HSET', meta_key, unpack(costs))
      costs = {}
    end
  end
  if #costs > 0 then redis.call('HSET', meta_key, unpack(costs)) end
  if #ARGV[14] > 0 then
    local later = 0
    for _ in string.gmatch(ARGV[14], '[^;]+') do later = later + 1 end
    redis.call('HSET', meta_key, 'stages', ARGV[14], 'unhanded', later, 'later', 0, 'cpairs', ARGV[16],
      'ctokens', ARGV[15], 'stage_chains', ARGV[17])
  end
  local new = admit(tonumber(ARGV[8]), tonumber(ARGV[9]))
  expire_own(expire_at)
  redis.call('ZADD', active_key, expire_at, stream_id)
  extend_expiry(active_key, expire_at)
  table.insert(new, 1, 1)
  return new

elseif command == 'admit' then
  -- ARGV: target window count, deadline. Returns {1, bucket, expire_at, window, cost, ...}
  -- (the cost 0 where open kept none).
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local new = admit(tonumber(ARGV[3]), tonumber(ARGV[4]))
  local info = redis.call('HMGET', meta_key, 'bucket', 'expire_at')
  local reply = {1, info[1] or '', tonumber(info[2]) or 0}
  for _, w in ipairs(new) do
    table.insert(reply, w)
    table.insert(reply, tonumber(redis.call('HGET', meta_key, 'cost:' .. w)) or 0)
  end
  return reply

elseif command == 'begin' then
  -- A delivery starts on a window. ARGV: window, lease expiry (ms), delivery id, takeover
  -- ('1' when the broker itself says it delivers this message again: RabbitMQ's redelivered
  -- flag, which no publisher can set).
  -- Returns {attempt, admitted at (ms, 0 if unknown), spec, indexes, candidate...} (the window's
  -- own candidates; indexes: a later stage's candidate indexes, comma-separated, else empty), or
  -- {code}:
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
  local stage = stage_holding(w, later_stages())
  if not is_admitted(w, stage) then return {-2} end
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
  local reply = {attempt, tonumber(admitted_at) or 0, redis.call('GET', spec_key), ''}
  if stage then
    local members = numbers(redis.call('HGET', meta_key, 'members:' .. stage.number))
    local from = (w - stage.first) * stage.size + 1
    local picked = {}
    for i = from, math.min(from + stage.size - 1, #members) do
      table.insert(picked, members[i])
      table.insert(reply, redis.call('LINDEX', cands_key, members[i]))
    end
    reply[4] = table.concat(picked, ',')
    return reply
  end
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
  -- ARGV: window, encoded result, event log maxlen, outcome (ranked, failed, poisoned, or
  -- skipped: a cascade stage's window past its time budget), the window's encoded embeddings
  -- (empty when it has none), failovers on the way, its rows' order (candidate indexes as its
  -- page shows them, comma-separated), the deadline of windows it admits (ms). Writes only the
  -- first commit of an admitted window, and counts it in the shard's counters and in the
  -- stream's meta (its progress, readable without decoding results); in a cascade, hands the
  -- next stage its rows once they are known (hand_on). Returns {1, bucket, expire_at, lane,
  -- (window, cost)...} written, with the windows it admitted; {0} already committed, {-2} never
  -- admitted.
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local count = n_windows()
  local w = window_number(ARGV[3], count)
  if w == nil then return {-5} end
  local window = ARGV[3]
  local outcome = ARGV[6]
  if outcome ~= 'ranked' and outcome ~= 'failed' and outcome ~= 'poisoned' and outcome ~= 'skipped' then
    return redis.error_reply('unknown outcome ' .. tostring(outcome))
  end
  if redis.call('HEXISTS', results_key, window) == 1 then return {0} end
  if not is_admitted(w, stage_holding(w, later_stages())) then return {-2} end
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
  if outcome == 'failed' or outcome == 'poisoned' then
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
  local reply = {1}
  if redis.call('HEXISTS', meta_key, 'stages') == 1 then
    redis.call('HSET', meta_key, 'order:' .. window, ARGV[9] or '')
    local info = redis.call('HMGET', meta_key, 'bucket', 'expire_at', 'lane')
    reply = {1, info[1] or '', tonumber(info[2]) or 0, info[3] or 'interactive'}
    for _, x in ipairs(hand_on(w, tonumber(ARGV[10]) or now)) do
      table.insert(reply, x)
      table.insert(reply, tonumber(redis.call('HGET', meta_key, 'cost:' .. x)) or 0)
    end
  end
  return reply

elseif command == 'cancel' then
  -- Commit every window not yet committed as cancelled, admitted or not, in this one call:
  -- a worker that begins one afterwards finds it committed and skips it, and one that
  -- finishes scoring it afterwards loses the commit race, so nothing is scored into the
  -- stream after this. ARGV: event log maxlen, then (window, encoded result) pairs, one per
  -- window the caller saw uncommitted (a window committed since is left as it is).
  -- Returns {1, window...}: the windows this call committed (none for a stream cancelled before);
  -- {-6} when a cascade stage was handed windows the caller did not see (read again, retry).
  if redis.call('EXISTS', meta_key) == 0 then return {-3} end
  local count = n_windows()
  local expire_at = tonumber(redis.call('HGET', meta_key, 'expire_at'))
  local given = {}
  for i = 4, #ARGV - 1, 2 do given[ARGV[i]] = true end
  for _, stage in ipairs(later_stages()) do
    local handed = tonumber(redis.call('HGET', meta_key, 'handed:' .. stage.number)) or 0
    for w = stage.first, stage.first + handed - 1 do
      if not given[tostring(w)] and redis.call('HEXISTS', results_key, w) == 0 then return {-6} end
    end
  end
  local written = {1}
  for i = 4, #ARGV - 1, 2 do
    local w = window_number(ARGV[i], count)
    local window = ARGV[i]
    if w ~= nil and redis.call('HEXISTS', results_key, window) == 0 then
      redis.call('HSET', results_key, window, ARGV[i + 1])
      redis.call('ZREM', pending_key, window)
      redis.call('HDEL', attempts_key, 'holder:' .. window, 'until:' .. window)
      redis.call('HDEL', meta_key, 'queued:' .. window)
      redis.call('XADD', events_key, 'MAXLEN', '~', ARGV[3], '*', 'window', window)
      for _, key in ipairs(uncommitted_keys) do
        redis.call('ZREM', key, stream_id .. ':' .. window)
      end
      table.insert(written, w)
    end
  end
  local n = #written - 1
  if n > 0 then
    -- Every window now counts as admitted, so no later pull admits (and sends) one, and no
    -- cascade stage is handed anything more.
    redis.call('HSET', meta_key, 'admitted', first_stage_windows(), 'cancelled_at', now)
    if redis.call('HEXISTS', meta_key, 'stages') == 1 then redis.call('HSET', meta_key, 'unhanded', 0) end
    redis.call('HINCRBY', meta_key, 'committed', n)
    redis.call('HINCRBY', meta_key, 'cancelled', n)
    redis.call('HINCRBY', counters_key, 'windows_committed', n)
    redis.call('HINCRBY', counters_key, 'windows_cancelled', n)
    redis.call('PEXPIREAT', results_key, expire_at)
    redis.call('PEXPIREAT', events_key, expire_at)
  end
  return written

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
