-- Take a batch of messages from a queue and its lanes (toolfleet.worker.messaging.broker).
--
-- KEYS: queue list, this broker's acks set, messages hash, the lane rotation, then every
-- lane, lane 0 first. ARGV: count. Dramatiq's ``fetch`` (pop ids, add them to the acks
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
local lanes = #KEYS - 4
local rebuilt = false
local function from_lanes()
    for _ = 0, lanes do
        local number = redis.call("lpop", KEYS[4])
        if not number then
            if rebuilt then return false end
            rebuilt = true
            for lane = 0, lanes - 1 do
                if redis.call("llen", KEYS[5 + lane]) > 0 then
                    redis.call("rpush", KEYS[4], lane)
                end
            end
            number = redis.call("lpop", KEYS[4])
            if not number then return false end
        end
        local lane = tonumber(number)
        if lane and lane >= 0 and lane < lanes then
            local id = redis.call("lpop", KEYS[5 + lane])
            if id then
                if redis.call("llen", KEYS[5 + lane]) > 0 then redis.call("rpush", KEYS[4], lane) end
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
if #ids > 0 then
    redis.call("sadd", KEYS[2], unpack(ids))
    local bodies = redis.call("hmget", KEYS[3], unpack(ids))
    for i = 1, #ids do
        out[2 * i - 1] = ids[i]
        out[2 * i] = bodies[i]
    end
end
return out
