-- Catalog entries with a life (toolfleet.shared.catalog_life), run once per worker heartbeat.
-- KEYS: catalog hash, liveness sorted set, owners hash, then the workers set of each
-- published name, then the schemas set of each, both in ARGV order. ARGV: now (epoch s),
-- the cutoff (epoch s), this worker's id, the sets' lifetime (ms), then per name: name,
-- identity, entry (JSON), schema hash.
-- Returns {contested, gone, listed, schemas}; schemas holds, per name written, the list
-- {name, member...} of its schemas set's members that beat since the cutoff.
local contested = {}
local schemas = {}
local cutoff = tonumber(ARGV[2])
local n = (#ARGV - 4) / 4
for i = 0, n - 1 do
  local name, identity = ARGV[5 + 4 * i], ARGV[6 + 4 * i]
  local owner = redis.call('HGET', KEYS[3], name)
  local beat = tonumber(redis.call('ZSCORE', KEYS[2], name) or '-1')
  if owner and owner ~= identity and beat >= cutoff then
    table.insert(contested, name)
    table.insert(contested, owner)
  else
    redis.call('HSET', KEYS[1], name, ARGV[7 + 4 * i])
    redis.call('HSET', KEYS[3], name, identity)
    redis.call('ZADD', KEYS[2], 'GT', ARGV[1], name)
    -- the workers set (member: this worker), then the schemas set (member: hash worker)
    for k, member in ipairs({ARGV[3], ARGV[8 + 4 * i] .. ' ' .. ARGV[3]}) do
      local at = 4 + (k - 1) * n + i
      redis.call('ZADD', KEYS[at], ARGV[1], member)
      redis.call('ZREMRANGEBYSCORE', KEYS[at], '-inf', '(' .. ARGV[2])
      redis.call('PEXPIRE', KEYS[at], ARGV[4])
    end
    local live = redis.call('ZRANGEBYSCORE', KEYS[4 + n + i], ARGV[2], '+inf')
    table.insert(live, 1, name)
    table.insert(schemas, live)
  end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
for _, name in ipairs(gone) do
  redis.call('HDEL', KEYS[1], name)
  redis.call('HDEL', KEYS[3], name)
  redis.call('ZREM', KEYS[2], name)
end
return {contested, gone, redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf'), schemas}
