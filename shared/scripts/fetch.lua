-- Take a batch of messages from a queue and its lanes (toolfleet.worker.messaging.broker).
--
-- KEYS: queue list, this broker's acks set, messages hash, the lane rotation, (when
-- claiming) the switches hash and this process's in-flight hash, every lane, lane 0 first,
-- then (when claiming) the claim, outcome and cancel keys of each expected id. ARGV:
-- count, then when claiming: lanes, now (epoch s), claim token prefix, reply ttl (s),
-- longest ttl ahead (s), deadline grace (s), least answer time (s), the claimable
-- functions (JSON: function -> [time limit s, isolation margin s, 1 when retried]), ids
-- to peek, then the expected ids. Dramatiq's ``fetch`` (pop ids, add them to the acks
-- set, read the bodies) without its heartbeat (the process's periodic heartbeat writes
-- it), returning ``{id, body or false, id, body or false, ...}``; a lane token popped
-- from the queue list is replaced by the head of the lane at the rotation's head, whose
-- number goes back to the rotation's tail while the lane still holds ids (round robin
-- over the non-empty lanes, O(1) commands per message; see
-- :mod:`toolfleet.shared.tenancy.lanes`). A stale
-- number (its lane empty) is dropped, at most one per lane per token; a rotation found
-- empty while a token waits is rebuilt once per call from the lanes' lengths (only a
-- broken invariant leads there, e.g. lanes filled by a version without the rotation).
-- The batch comes off the queue list with one ``LPOP <count>`` (Redis 6.2), its ids go to
-- the acks set with one ``SADD`` and its bodies come back from one ``HMGET``.
--
-- Fetch is claim (toolfleet.worker.pipeline.fetch): a fetched id whose keys came in KEYS
-- (the caller expects it: the head its wait saw, or an id the last fetch peeked at) and
-- that is a request published under its own call id to a claimable function (one with no
-- fleet-wide concurrency limit: such a call is claimed once it holds its slot) is
-- claimed here as ``claim.lua`` does: outcome and cancel marker read with one MGET, the
-- claim SET NX with token ``<prefix><index>``, the watchdog's in-flight record; the
-- switches are read once for the batch. The reply is then ``{switches (flat), the ids
-- the next fetch expects (below), id, body, state, value, cancel, ...}``: state -1 = not
-- claimed here, 0 = an outcome exists (value: it), 1 = claimed (value: the token), 2 =
-- claimed already (value: the owner's token).
local claiming = ARGV[2] ~= nil
local first_lane = claiming and 7 or 5
local lanes = claiming and tonumber(ARGV[2]) or #KEYS - 4
local rebuilt = false
local function from_lanes()
    for _ = 0, lanes do
        local number = redis.call("lpop", KEYS[4])
        if not number then
            if rebuilt then return false end
            rebuilt = true
            for lane = 0, lanes - 1 do
                if redis.call("llen", KEYS[first_lane + lane]) > 0 then
                    redis.call("rpush", KEYS[4], lane)
                end
            end
            number = redis.call("lpop", KEYS[4])
            if not number then return false end
        end
        local lane = tonumber(number)
        if lane and lane >= 0 and lane < lanes then
            local id = redis.call("lpop", KEYS[first_lane + lane])
            if id then
                if redis.call("llen", KEYS[first_lane + lane]) > 0 then redis.call("rpush", KEYS[4], lane) end
                return id
            end
        end
    end
    return false
end
local ids = {}
local popped = redis.call("lpop", KEYS[1], math.min(tonumber(ARGV[1]), 1000))
for _, id in ipairs(popped or {}) do
    if id == "${TOKEN}" then id = from_lanes() end
    if id then
        ids[#ids + 1] = id
    end
end
local out = {}
local bodies = {}
if #ids > 0 then
    redis.call("sadd", KEYS[2], unpack(ids))
    bodies = redis.call("hmget", KEYS[3], unpack(ids))
end
if not claiming then
    for i = 1, #ids do
        out[2 * i - 1] = ids[i]
        out[2 * i] = bodies[i]
    end
    return out
end
local now, reply_ttl, most_ahead = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
local grace, least = tonumber(ARGV[7]), tonumber(ARGV[8])
local expected = {}
for j = 11, #ARGV do expected[ARGV[j]] = first_lane + lanes + 3 * (j - 11) end
local limits = nil
local function request_of(id, body)
    if not body or not expected[id] then return nil end
    limits = limits or cjson.decode(ARGV[9])
    local ok, message = pcall(cjson.decode, body)
    if not ok or type(message) ~= "table" or type(message.args) ~= "table" then return nil end
    local request = message.args[1]
    if type(request) == "string" then
        ok, request = pcall(cjson.decode, request)
        if not ok then return nil end
    end
    if type(request) ~= "table" or request.id ~= id or type(request.deadline) ~= "number"
        or type(request.reply_to) ~= "string" or type(request["function"]) ~= "string"
        or not limits[request["function"]] then
        return nil
    end
    return request
end
out[1] = #ids > 0 and redis.call("hgetall", KEYS[5]) or {}
-- the ids the next fetch takes if nothing else takes them first: a plain id at the queue's
-- head as is, a lane token as the head of the lane the rotation serves next (a lane
-- holding ids keeps its turn in the rotation, so the n-th token after r of them is the
-- lane of rotation entry n mod r, at position n div r)
local heads = {}
local peek = tonumber(ARGV[10])
if peek > 0 then heads = redis.call("lrange", KEYS[1], 0, peek - 1) end
local tokens = 0
for _, next_id in ipairs(heads) do
    if next_id == "${TOKEN}" then tokens = tokens + 1 end
end
local from_lane = {}
if tokens > 0 then
    local rotation = redis.call("lrange", KEYS[4], 0, tokens - 1)
    local r = #rotation
    for entry = 1, r do
        local lane = tonumber(rotation[entry])
        if lane and lane >= 0 and lane < lanes then
            -- tokens entry, entry + r, ... take this lane's ids 0, 1, ...
            local held = redis.call("lrange", KEYS[first_lane + lane], 0,
                math.floor((tokens - entry) / r))
            for at = 1, #held do from_lane[entry + (at - 1) * r] = held[at] end
        end
    end
end
local ahead, turn = {}, 0
for _, next_id in ipairs(heads) do
    if next_id == "${TOKEN}" then
        turn = turn + 1
        next_id = from_lane[turn]
    end
    if next_id then ahead[#ahead + 1] = next_id end
end
out[2] = ahead
for i = 1, #ids do
    local id, body = ids[i], bodies[i]
    local state, value, cancel = -1, "", ""
    local request = request_of(id, body)
    if request then
        local k = expected[id]
        local found = redis.call("mget", KEYS[k + 1], KEYS[k + 2])
        cancel = found[2] or ""
        if found[1] then
            state, value = 0, found[1]
        else
            local ahead = math.min(math.max(0, request.deadline - now), most_ahead)
            local token = ARGV[4] .. i
            if redis.call("set", KEYS[k], token, "NX", "EX", math.floor(ahead) + reply_ttl) then
                local limit = limits[request["function"]]
                local limit_s = math.max(0, request.deadline - now + grace)
                if limit[3] == 0 then limit_s = math.min(limit[1], limit_s) end
                redis.call("hset", KEYS[6], id, cjson.encode({
                    id = id, tool_call_id = request.tool_call_id, ["function"] = request["function"],
                    reply_to = request.reply_to, answer_by = now + math.max(limit_s, least) + limit[2],
                    limit_s = limit_s,
                }))
                state, value = 1, token
            else
                state, value = 2, redis.call("get", KEYS[k]) or ""
            end
        end
    end
    local at = 5 * i - 2
    out[at], out[at + 1], out[at + 2], out[at + 3], out[at + 4] = id, body, state, value, cancel
end
return out
