-- Give a dead broker's unacknowledged messages back (toolfleet.worker.messaging.recovery,
-- toolfleet.worker.messaging.maintenance).
--
-- KEYS: one triple per queue: the dead broker's acks set of that queue, the queue list, the
-- queue's messages hash (a multiple of 3 keys; one triple is the common case).
-- For each triple, moves every id of the acks set whose message still exists to the head of
-- the queue (in the set's order) and deletes the acks set. Returns how many ids moved in all.
local moved = 0
for t = 1, #KEYS - 2, 3 do
    local ids = redis.call("smembers", KEYS[t])
    for i = #ids, 1, -1 do
        if redis.call("hexists", KEYS[t + 2], ids[i]) > 0 then
            redis.call("lpush", KEYS[t + 1], ids[i])
            moved = moved + 1
        end
    end
    redis.call("del", KEYS[t])
end
return moved
