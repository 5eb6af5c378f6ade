-- Catalog entries with a life (toolfleet.shared.catalog_life), run once per worker heartbeat.
-- KEYS: catalog hash, liveness sorted set, owners hash, then the workers set of each
-- published name, in ARGV order. ARGV: now (epoch s), the cutoff (epoch s), this worker's
-- id, the workers sets' lifetime (ms), then per name: name, identity, entry (JSON).
-- Returns {contested, gone, listed}.
local contested = {}
local cutoff = tonumber(ARGV[2])
local n = (#ARGV - 4) / 3
for i = 0, n - 1 do
  local name, identity = ARGV[5 + 3 * i], ARGV[6 + 3 * i]
  local owner = redis.call('HGET', KEYS[3], name)
  local beat = tonumber(redis.call('ZSCORE', KEYS[2], name) or '-1')
  if owner and owner ~= identity and beat >= cutoff then
    table.insert(contested, name)
    table.insert(contested, owner)
  else
    redis.call('HSET', KEYS[1], name, ARGV[7 + 3 * i])
    redis.call('HSET', KEYS[3], name, identity)
    redis.call('ZADD', KEYS[2], 'GT', ARGV[1], name)
    redis.call('ZADD', KEYS[4 + i], ARGV[1], ARGV[3])
    redis.call('ZREMRANGEBYSCORE', KEYS[4 + i], '-inf', '(' .. ARGV[2])
    redis.call('PEXPIRE', KEYS[4 + i], ARGV[4])
  end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
for _, name in ipairs(gone) do
  redis.call('HDEL', KEYS[1], name)
  redis.call('HDEL', KEYS[3], name)
  redis.call('ZREM', KEYS[2], name)
end
return {contested, gone, redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf')}
