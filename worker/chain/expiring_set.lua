-- A cache's fresh values, each SET with its expiry, and its hit/miss counts, in one atomic command.
-- Shared by the pair cache (worker.chain.cache) and the embedding cache (worker.chain.embedding_cache).
--
-- KEYS[1]: the counters hash; KEYS[2..]: the cache keys.
-- ARGV[1]: ttl in seconds; ARGV[2]: the counters' prefix (pair_cache, embedding_cache);
-- ARGV[3]: hits; ARGV[4]: misses; ARGV[5..]: one value per cache key, in KEYS' order.
-- Returns how many values were set.

local ttl = ARGV[1]
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 3], 'EX', ttl)
end
local prefix = ARGV[2]
if tonumber(ARGV[4]) > 0 then redis.call('HINCRBY', KEYS[1], prefix .. '_misses', ARGV[4]) end
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[1], prefix .. '_hits', ARGV[3]) end
return #KEYS - 1
