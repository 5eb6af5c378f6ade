-- Answer a queued call canceled by its producer (toolfleet.producer._core.fleet).
--
-- KEYS: 1 the call's outcome, 2 its caller's reply list, 3 its cancel marker. ARGV: 1 the
-- reply envelope, 2 the outcome's ttl (s), 3 the reply list's ttl (s), 4 the cancel
-- channel, 5 the cancel message. The RESOLVED marker and the channel message stop a
-- worker that runs it meanwhile. Returns 1 when answered, 0 when the call had its
-- outcome (or was resolved) already.
if redis.call("exists", KEYS[1]) == 1 then return 0 end
local marker = redis.call("get", KEYS[3])
if marker and marker ~= "${REQUESTED}" then return 0 end
redis.call("set", KEYS[1], ARGV[1], "EX", ARGV[2])
redis.call("set", KEYS[3], "${RESOLVED}", "EX", ARGV[2])
redis.call("rpush", KEYS[2], ARGV[1])
redis.call("expire", KEYS[2], ARGV[3])
redis.call("publish", ARGV[4], ARGV[5])
return 1
