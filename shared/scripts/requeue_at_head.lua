-- Give a dead worker's unacknowledged messages back (toolfleet.worker.messaging.recovery).
--
-- KEYS: the dead broker's acks set of one queue, the queue list, the queue's messages hash.
-- Moves every id of the acks set whose message still exists to the head of the queue (in
-- the set's order), deletes the acks set, and returns how many ids moved.
local ids = redis.call("smembers", KEYS[1])
local moved = 0
for i = #ids, 1, -1 do
    if redis.call("hexists", KEYS[3], ids[i]) > 0 then
        redis.call("lpush", KEYS[2], ids[i])
        moved = moved + 1
    end
end
redis.call("del", KEYS[1])
return moved
