-- The catalog's epoch at a worker's heartbeat (toolfleet.shared.catalog_epoch).
--
-- KEYS: 1 epoch key, 2 recovering key. ARGV: 1 a fresh epoch id, 2 the window (ms: one
-- worker TTL), 3 the epoch this worker knows ("" on its first beat), 4 the function
-- names it remembers from that epoch, one per line. Returns the current epoch.
local current = redis.call('GET', KEYS[1])
if not current then
  current = ARGV[1]
  redis.call('SET', KEYS[1], current)
  redis.call('SADD', KEYS[2], '${WINDOW_MARK}')
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if ARGV[3] ~= '' and ARGV[3] ~= current and redis.call('EXISTS', KEYS[2]) == 1 then
  for name in string.gmatch(ARGV[4], '[^\n]+') do
    redis.call('SADD', KEYS[2], name)
  end
end
return current
