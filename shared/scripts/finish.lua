-- Record the outcomes of N calls and post their replies (toolfleet.worker.pipeline.ledger).
--
-- KEYS: in-flight hash, events stream, then per call: outcome, reply list, cancel marker,
-- and, when its Redis id is not "", the message's Dramatiq acks set and messages hash.
-- ARGV: events maxlen, N, then per call: reply envelope, outcome ttl (s), reply ttl (s),
-- call id, the message's Redis id (or ""), number of events E, then its E events.
-- Per call, as one call's script did it: the message is acknowledged first, as
-- Dramatiq's own ``ack`` does it (drop the id from the acks set; if it was there, drop the
-- body), whatever the outcome: the delivery is over once its call is answered, by this
-- worker or another. Its in-flight record is dropped (one HDEL for all N). The outcome is
-- recorded only if none exists (SET NX); only then are its events appended and its reply
-- posted, unless a cancel marker other than REQUESTED says the producer resolved the call.
-- Replies to one list go in one RPUSH, in call order, and one EXPIRE (the longest ttl).
-- Returns N results, one per call in order: 0 when an outcome existed (nothing written),
-- 1 when recorded and posted, 2 when recorded but not posted, or the error of the call's
-- own cancel marker or reply list (a key of another type): that call's alone, the other
-- calls are written all the same.
local n = tonumber(ARGV[2])
local results, ids, lists, order = {}, {}, {}, {}
local k, a = 3, 3
for c = 1, n do
    local events = tonumber(ARGV[a + 5])
    if ARGV[a + 4] ~= "" then
        if redis.call("srem", KEYS[k + 3], ARGV[a + 4]) > 0 then
            redis.call("hdel", KEYS[k + 4], ARGV[a + 4])
        end
    end
    ids[c] = ARGV[a + 3]
    local result = 0
    if redis.call("set", KEYS[k], ARGV[a], "NX", "EX", ARGV[a + 1]) then
        for i = a + 6, a + 5 + events do
            redis.call("xadd", KEYS[2], "MAXLEN", "~", ARGV[1], "*", "event", ARGV[i])
        end
        local cancel = redis.pcall("get", KEYS[k + 2])
        if type(cancel) == "table" and cancel.err then
            result = cancel
        elseif cancel and cancel ~= "${REQUESTED}" then
            result = 2
        else
            result = 1
            local list = lists[KEYS[k + 1]]
            if not list then
                list = {key = k + 1, ttl = 0, calls = {}}
                lists[KEYS[k + 1]] = list
                order[#order + 1] = list
            end
            list[#list + 1] = ARGV[a]
            list.calls[#list.calls + 1] = c
            list.ttl = math.max(list.ttl, tonumber(ARGV[a + 2]))
        end
    end
    results[c] = result
    if ARGV[a + 4] ~= "" then k = k + 5 else k = k + 3 end
    a = a + 6 + events
end
if n > 0 then redis.call("hdel", KEYS[1], unpack(ids)) end
for _, list in ipairs(order) do
    local pushed = redis.pcall("rpush", KEYS[list.key], unpack(list))
    if type(pushed) == "table" and pushed.err then
        for _, c in ipairs(list.calls) do results[c] = pushed end
    else
        redis.call("expire", KEYS[list.key], list.ttl)
    end
end
return results
