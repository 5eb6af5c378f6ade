-- Whether a call may run under its tool's breaker (toolfleet.worker.tenancy.breakers).
--
-- KEYS: the breaker hash. ARGV: call id, now (ms), probe lease end (ms). Returns
-- ``{"run" | "probe" | "open", retry after (ms)}``.
local state = redis.call("hget", KEYS[1], "state")
local now = tonumber(ARGV[2])
if state == "open" then
    local reopen = tonumber(redis.call("hget", KEYS[1], "until") or "0")
    if now < reopen then return {"open", reopen - now} end
    redis.call("hset", KEYS[1], "state", "half_open", "probe", ARGV[1], "until", ARGV[3])
    return {"probe", 0}
end
if state == "half_open" then
    local lease = tonumber(redis.call("hget", KEYS[1], "until") or "0")
    if now < lease then return {"open", lease - now} end
    redis.call("hset", KEYS[1], "probe", ARGV[1], "until", ARGV[3])
    return {"probe", 0}
end
return {"run", 0}
