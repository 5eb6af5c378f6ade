-- Claim a call for one delivery (toolfleet.worker.pipeline.ledger).
--
-- KEYS: claim, outcome, cancel marker, in-flight hash, switches hash. ARGV: token, ttl
-- (s), call id, in-flight record. The outcome and the cancel marker are read with one
-- MGET; the in-flight hash gets no TTL here (the process's heartbeat refreshes it).
-- Returns {state, value, cancel marker, switches (flat)}:
-- state 0 = an outcome exists (value: it), 1 = claimed by this token, 2 = claimed already
-- (value: the owner's token).
local found = redis.call("mget", KEYS[2], KEYS[3])
local outcome = found[1]
local cancel = found[2] or ""
local switches = redis.call("hgetall", KEYS[5])
if outcome then return {0, outcome, cancel, switches} end
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
    redis.call("hset", KEYS[4], ARGV[3], ARGV[4])
    return {1, "", cancel, switches}
end
return {2, redis.call("get", KEYS[1]) or "", cancel, switches}
