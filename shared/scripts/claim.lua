-- Claim a call for one delivery (toolfleet.worker.pipeline.ledger).
--
-- KEYS: claim, outcome, cancel marker, in-flight hash, switches hash. ARGV: token, ttl
-- (s), call id, in-flight record. Returns {state, value, cancel marker, switches (flat)}:
-- state 0 = an outcome exists (value: it), 1 = claimed by this token, 2 = claimed already
-- (value: the owner's token).
local outcome = redis.call("get", KEYS[2])
local cancel = redis.call("get", KEYS[3]) or ""
local switches = redis.call("hgetall", KEYS[5])
if outcome then return {0, outcome, cancel, switches} end
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
    redis.call("hset", KEYS[4], ARGV[3], ARGV[4])
    redis.call("expire", KEYS[4], ARGV[2])
    return {1, "", cancel, switches}
end
return {2, redis.call("get", KEYS[1]) or "", cancel, switches}
