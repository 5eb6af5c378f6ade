-- Count a call's outcome in its tool's breaker (toolfleet.worker.tenancy.breakers).
--
-- KEYS: the breaker hash. ARGV: call id, now (ms), failed (1/0), failures to open,
-- window (ms), cool-down (ms). Returns the new state when it changed, else "".
local state = redis.call("hget", KEYS[1], "state") or "closed"
local now = tonumber(ARGV[2])
local probing = state == "half_open" and redis.call("hget", KEYS[1], "probe") == ARGV[1]
if ARGV[3] == "1" then
    if probing then
        redis.call("hset", KEYS[1], "state", "open", "until", now + tonumber(ARGV[6]),
                   "failures", 0)
        return "open"
    end
    if state ~= "closed" then return "" end
    local first = tonumber(redis.call("hget", KEYS[1], "first") or "0")
    local failures = tonumber(redis.call("hget", KEYS[1], "failures") or "0")
    if failures == 0 or now - first > tonumber(ARGV[5]) then
        failures = 0
        redis.call("hset", KEYS[1], "first", now)
    end
    failures = failures + 1
    if failures >= tonumber(ARGV[4]) then
        redis.call("hset", KEYS[1], "state", "open", "until", now + tonumber(ARGV[6]),
                   "failures", 0)
        return "open"
    end
    redis.call("hset", KEYS[1], "state", "closed", "failures", failures)
    return ""
end
if probing then
    redis.call("hset", KEYS[1], "state", "closed", "failures", 0)
    redis.call("hdel", KEYS[1], "probe", "until")
    return "closed"
end
if state == "closed" then redis.call("hset", KEYS[1], "failures", 0) end
return ""
