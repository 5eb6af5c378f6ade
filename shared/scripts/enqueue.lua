-- Admit calls under their quotas and breakers, and enqueue each on its queue or lane:
-- a batch of calls in one run, each decided on its own (a call refused or failing leaves
-- the others enqueued).
--
-- ARGV: 1 the number of calls n, then per call its numbers of keys and of arguments
-- (2 * n values), then each call's arguments in turn; KEYS: each call's keys in turn.
-- Returns per call its reply (below), or an error reply when the call failed (what it
-- wrote before failing stays written, as for any script).
--
-- One call's keys: 1 queue list, 2 messages hash, 3 limits hash, 4 the function's
-- breaker hash, then per quota scope (its argument 12 of them, the account's first) its
-- in-flight sorted set and its rate key, then (only with lanes) the account's two lanes
-- and the queue's lane rotation, then (only with an idempotency key) the key's record,
-- then the outcome key of each call id checked (the ids after the scopes).
-- One call's arguments: 1 redis message id, 2 body, 3 now (ms), 4 deadline (ms), 5 call
-- id, 6 default in_flight, 7 per_s, 8 burst (0: none), 9 read the breaker ("1"/"0"),
-- 10 and 11 the numbers of the two lanes ("": no lanes), 12 how many scopes, 13 the
-- call's idempotency fingerprint ("": no key), 14 its record's ttl (ms), then the
-- scopes, then the call ids whose outcome keys were passed.
--
-- One call's reply: 0 when enqueued; {reason, scope, limit, retry after (ms)} (reason
-- "in_flight", "per_s" or "breaker") when refused; {"check", id...} when an in-flight
-- scope is full of calls whose outcomes it was not given: run it again with their
-- outcome keys (a call answered frees its place); {"duplicate" | "misuse", first call
-- id} when the key's record exists (the same call, or another one, under the key).
-- Nothing is written for a call unless it enqueued (an answered call dropped from an
-- in-flight set aside).

-- The call whose keys follow KEYS[k] and arguments ARGV[a] (argc of them).
local function enqueue(k, a, argc)
    local scopes = tonumber(ARGV[a + 12])
    local lanes = ARGV[a + 10] ~= ""
    local idempotency = nil
    if ARGV[a + 13] ~= "" then
        idempotency = 5 + 2 * scopes + (lanes and 3 or 0)
        local held = redis.call("get", KEYS[k + idempotency])
        if held then
            local same = string.sub(held, 1, #ARGV[a + 13]) == ARGV[a + 13]
            return {same and "duplicate" or "misuse", string.sub(held, #ARGV[a + 13] + 1)}
        end
    end
    local now = tonumber(ARGV[a + 3])
    local deadline = tonumber(ARGV[a + 4])
    if ARGV[a + 9] == "1" then
        local breaker = redis.call("hmget", KEYS[k + 4], "state", "until")
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
    for j = 15 + scopes, argc do
        checked[ARGV[a + j]] = checked_at + j - 14 - scopes
    end
    local rechecking = argc >= 15 + scopes
    local taken = {}
    local raws = {}
    if scopes > 0 then
        local fields = {}
        for i = 1, scopes do fields[i] = ARGV[a + 14 + i] end
        fields[scopes + 1] = "*"
        raws = redis.call("hmget", KEYS[k + 3], unpack(fields))
    end
    for i = 1, scopes do
        local scope = ARGV[a + 14 + i]
        local raw = raws[i]
        local quota = nil
        if raw then
            quota = cjson.decode(raw)
        elseif i == 1 then
            raw = raws[scopes + 1]
            if raw then
                quota = cjson.decode(raw)
            else
                quota = {in_flight = ARGV[a + 6], per_s = ARGV[a + 7], burst = ARGV[a + 8]}
            end
        end
        if quota then
            local in_flight = number(quota["in_flight"])
            if in_flight > 0 then
                local key = 3 + 2 * i
                redis.call("zremrangebyscore", KEYS[k + key], "-inf", now)
                local held = redis.call("zcard", KEYS[k + key])
                if held >= in_flight then
                    local unchecked = {}
                    for _, id in ipairs(redis.call("zrange", KEYS[k + key], 0, -1)) do
                        local outcome = checked[id]
                        if outcome then
                            if redis.call("exists", KEYS[k + outcome]) == 1 then
                                redis.call("zrem", KEYS[k + key], id)
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
                    local first = redis.call("zrange", KEYS[k + key], 0, 0, "WITHSCORES")
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
                local tat = math.max(tonumber(redis.call("get", KEYS[k + key]) or "0"), now)
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
            redis.call("zadd", KEYS[k + t[2]], deadline, ARGV[a + 5])
            local ttl = math.ceil(deadline - now) + 1000
            if redis.call("pttl", KEYS[k + t[2]]) < ttl then
                redis.call("pexpire", KEYS[k + t[2]], ttl)
            end
        else
            local px = math.ceil(t[3] - now) + 1
            redis.call("set", KEYS[k + t[2]], string.format("%.3f", t[3]), "PX", px)
        end
    end
    if idempotency then
        redis.call("set", KEYS[k + idempotency], ARGV[a + 13] .. ARGV[a + 5], "PX", ARGV[a + 14])
    end
    redis.call("hset", KEYS[k + 2], ARGV[a + 1], ARGV[a + 2])
    if lanes then
        local lane = 5 + 2 * scopes
        local lane_number = ARGV[a + 10]
        local first = redis.call("llen", KEYS[k + lane])
        if first > 0 and redis.call("llen", KEYS[k + lane + 1]) < first then
            lane = lane + 1
            lane_number = ARGV[a + 11]
        end
        if redis.call("rpush", KEYS[k + lane], ARGV[a + 1]) == 1 then
            redis.call("rpush", KEYS[k + 7 + 2 * scopes], lane_number)
        end
        redis.call("rpush", KEYS[k + 1], "${TOKEN}")
    else
        redis.call("rpush", KEYS[k + 1], ARGV[a + 1])
    end
    return 0
end

local n = tonumber(ARGV[1])
local replies = {}
local k, a = 0, 1 + 2 * n
for i = 1, n do
    local keys, argc = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    local ok, reply = pcall(enqueue, k, a, argc)
    if ok then
        replies[i] = reply
    elseif type(reply) == "table" and reply.err then
        replies[i] = reply
    else
        replies[i] = {err = tostring(reply)}
    end
    k, a = k + keys, a + argc
end
return replies
