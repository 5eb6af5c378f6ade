-- Admit a call under its quotas and breaker, and enqueue it on its queue or lane.
--
-- KEYS: 1 queue list, 2 messages hash, 3 limits hash, 4 the function's breaker hash,
-- then per quota scope (ARGV[12] of them, the account's first) its in-flight sorted set
-- and its rate key, then (only with lanes) the account's two lanes and the queue's lane
-- rotation, then (only with an idempotency key) the key's record, then the outcome key
-- of each call id checked (the ids after the scopes).
-- ARGV: 1 redis message id, 2 body, 3 now (ms), 4 deadline (ms), 5 call id,
-- 6 default in_flight, 7 per_s, 8 burst (0: none), 9 read the breaker ("1"/"0"),
-- 10 and 11 the numbers of the two lanes ("": no lanes), 12 how many scopes, 13 the
-- call's idempotency fingerprint ("": no key), 14 its record's ttl (ms), then the
-- scopes, then the call ids whose outcome keys were passed.
--
-- Returns 0 when enqueued; {reason, scope, limit, retry after (ms)} (reason "in_flight",
-- "per_s" or "breaker") when refused; {"check", id...} when an in-flight scope is full
-- of calls whose outcomes it was not given: run again with their outcome keys (a call
-- answered frees its place); {"duplicate" | "misuse", first call id} when the key's
-- record exists (the same call, or another one, under the key). Nothing is written
-- unless it enqueued (an answered call dropped from an in-flight set aside).
local scopes = tonumber(ARGV[12])
local lanes = ARGV[10] ~= ""
local idempotency = nil
if ARGV[13] ~= "" then
    idempotency = 5 + 2 * scopes + (lanes and 3 or 0)
    local held = redis.call("get", KEYS[idempotency])
    if held then
        local same = string.sub(held, 1, #ARGV[13]) == ARGV[13]
        return {same and "duplicate" or "misuse", string.sub(held, #ARGV[13] + 1)}
    end
end
local now = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4])
if ARGV[9] == "1" then
    local breaker = redis.call("hmget", KEYS[4], "state", "until")
    if breaker[1] == "open" or breaker[1] == "half_open" then
        local reopen = tonumber(breaker[2] or "0")
        if now < reopen then return {"breaker", "", "", math.ceil(reopen - now)} end
    end
end
local function number(value)
    if value == nil or value == cjson.null then return 0 end
    return tonumber(value) or 0
end
local checked_at = 4 + 2 * scopes + (lanes and 3 or 0) + (idempotency and 1 or 0)
local checked = {}  -- call id -> the index of its outcome key in KEYS
for j = 15 + scopes, #ARGV do
    checked[ARGV[j]] = checked_at + j - 14 - scopes
end
local rechecking = #ARGV >= 15 + scopes
local taken = {}
local raws = {}
if scopes > 0 then
    local fields = {}
    for i = 1, scopes do fields[i] = ARGV[14 + i] end
    fields[scopes + 1] = "*"
    raws = redis.call("hmget", KEYS[3], unpack(fields))
end
for i = 1, scopes do
    local scope = ARGV[14 + i]
    local raw = raws[i]
    local quota = nil
    if raw then
        quota = cjson.decode(raw)
    elseif i == 1 then
        raw = raws[scopes + 1]
        if raw then
            quota = cjson.decode(raw)
        else
            quota = {in_flight = ARGV[6], per_s = ARGV[7], burst = ARGV[8]}
        end
    end
    if quota then
        local in_flight = number(quota["in_flight"])
        if in_flight > 0 then
            local key = 3 + 2 * i
            redis.call("zremrangebyscore", KEYS[key], "-inf", now)
            local held = redis.call("zcard", KEYS[key])
            if held >= in_flight then
                local unchecked = {}
                for _, id in ipairs(redis.call("zrange", KEYS[key], 0, -1)) do
                    local outcome = checked[id]
                    if outcome then
                        if redis.call("exists", KEYS[outcome]) == 1 then
                            redis.call("zrem", KEYS[key], id)
                            held = held - 1
                        end
                    else
                        unchecked[#unchecked + 1] = id
                    end
                end
                if not rechecking and #unchecked > 0 and held - #unchecked < in_flight then
                    return {"check", unpack(unchecked)}
                end
            end
            if held >= in_flight then
                local first = redis.call("zrange", KEYS[key], 0, 0, "WITHSCORES")
                local wait = math.min(tonumber(first[2]) - now, 1000)
                return {"in_flight", scope, tostring(in_flight), math.max(math.ceil(wait), 1)}
            end
            taken[#taken + 1] = {"in_flight", key}
        end
        local per_s = number(quota["per_s"])
        if per_s > 0 then
            local burst = number(quota["burst"])
            if burst <= 0 then burst = math.max(1, math.ceil(per_s)) end
            local interval = 1000 / per_s
            local key = 4 + 2 * i
            local tat = math.max(tonumber(redis.call("get", KEYS[key]) or "0"), now)
            local allow_at = tat + interval - burst * interval
            if allow_at > now then
                return {"per_s", scope, tostring(per_s), math.max(math.ceil(allow_at - now), 1)}
            end
            taken[#taken + 1] = {"per_s", key, tat + interval}
        end
    end
end
for _, t in ipairs(taken) do
    if t[1] == "in_flight" then
        redis.call("zadd", KEYS[t[2]], deadline, ARGV[5])
        local ttl = math.ceil(deadline - now) + 1000
        if redis.call("pttl", KEYS[t[2]]) < ttl then redis.call("pexpire", KEYS[t[2]], ttl) end
    else
        redis.call("set", KEYS[t[2]], string.format("%.3f", t[3]), "PX", math.ceil(t[3] - now) + 1)
    end
end
if idempotency then redis.call("set", KEYS[idempotency], ARGV[13] .. ARGV[5], "PX", ARGV[14]) end
redis.call("hset", KEYS[2], ARGV[1], ARGV[2])
if lanes then
    local lane = 5 + 2 * scopes
    local lane_number = ARGV[10]
    local first = redis.call("llen", KEYS[lane])
    if first > 0 and redis.call("llen", KEYS[lane + 1]) < first then
        lane = lane + 1
        lane_number = ARGV[11]
    end
    if redis.call("rpush", KEYS[lane], ARGV[1]) == 1 then
        redis.call("rpush", KEYS[7 + 2 * scopes], lane_number)
    end
    redis.call("rpush", KEYS[1], "${TOKEN}")
else
    redis.call("rpush", KEYS[1], ARGV[1])
end
return 0
