-- Give a dead broker's unacknowledged messages back, and apply the crash rule to the calls
-- its process was running (toolfleet.worker.messaging.recovery, .maintenance).
--
-- KEYS: the events stream, then one block per queue: the dead broker's acks set of that
-- queue, the queue list, the queue's messages hash, its dead letters (``.XQ``) and their
-- messages hash (``.XQ.msgs``), then five keys per call of that queue given in ARGV:
-- claim, outcome, cancel marker, crash count, reply list.
-- ARGV: events maxlen, the dead process's claim-token prefix ("<worker id>#", or "" to
-- apply no crash rule), crash reruns R, now (epoch ms), number of queues, then per queue:
-- its number of calls C, then per call: Redis message id, deadline (epoch ms), the
-- ``crashed`` reply envelope, outcome ttl (s), reply ttl (s), the ``tool_responded`` event.
--
-- For each queue, every id of the acks set whose message still exists goes back to the head
-- of the queue (in the set's order), and the acks set is deleted. A call the dead process
-- had claimed (its claim token starts with the prefix) and that has no outcome died with
-- it: its crash count goes up by one (the count expires at the call's deadline). Past R,
-- it is not given back: its ``crashed`` outcome is recorded (SET NX) with its event and
-- reply (unless a cancel marker other than REQUESTED says the producer resolved the
-- call), and its message is dead-lettered as Dramatiq's ``nack`` does it.
-- Returns {messages given back, then the 1-based index (in ARGV order) of each call
-- answered ``crashed``}.
local prefix, reruns, now = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local moved, answered = 0, {}
local q, a, n = 2, 6, 0

local function answer(k, c)
    if redis.call("set", KEYS[k + 1], ARGV[c + 2], "NX", "EX", ARGV[c + 3]) then
        redis.call("xadd", KEYS[1], "MAXLEN", "~", ARGV[1], "*", "event", ARGV[c + 5])
        local cancel = redis.pcall("get", KEYS[k + 2])
        if type(cancel) ~= "table" and (not cancel or cancel == "${REQUESTED}") then
            local pushed = redis.pcall("rpush", KEYS[k + 4], ARGV[c + 2])
            if type(pushed) ~= "table" then
                redis.call("expire", KEYS[k + 4], ARGV[c + 4])
            end
        end
    end
end

for _ = 1, tonumber(ARGV[5]) do
    local calls = tonumber(ARGV[a])
    local by_id = {}
    for i = 1, calls do
        by_id[ARGV[a + 1 + (i - 1) * 6]] = {k = q + 5 + (i - 1) * 5, c = a + 1 + (i - 1) * 6, n = n + i}
    end
    local ids = redis.call("smembers", KEYS[q])
    for i = #ids, 1, -1 do
        local id = ids[i]
        local body = redis.call("hget", KEYS[q + 2], id)
        if body then
            local call = by_id[id]
            local given_up = false
            if call and prefix ~= "" then
                local owner = redis.call("get", KEYS[call.k])
                if owner and string.sub(owner, 1, #prefix) == prefix
                    and redis.call("exists", KEYS[call.k + 1]) == 0 then
                    local count = redis.call("incr", KEYS[call.k + 3])
                    redis.call("pexpireat", KEYS[call.k + 3], ARGV[call.c + 1])
                    given_up = count > reruns
                end
            end
            if given_up then
                answer(call.k, call.c)
                redis.call("zadd", KEYS[q + 3], now, id)
                redis.call("hset", KEYS[q + 4], id, body)
                redis.call("hdel", KEYS[q + 2], id)
                answered[#answered + 1] = call.n
            else
                redis.call("lpush", KEYS[q + 1], id)
                moved = moved + 1
            end
        end
    end
    redis.call("del", KEYS[q])
    q = q + 5 + calls * 5
    a = a + 1 + calls * 6
    n = n + calls
end
return {moved, unpack(answered)}
