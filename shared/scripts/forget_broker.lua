-- Forget a dead Dramatiq broker once nothing of it is left (toolfleet.worker.messaging.maintenance).
--
-- KEYS: [1] the broker heartbeats sorted set, [2] the broker-queues hash, then the broker's
-- acks set of every queue it consumed.
-- ARGV: [1] the broker id, [2] the heartbeat cutoff (epoch ms: older counts as dead).
-- Removes the broker from both when its heartbeat is still at or before the cutoff and none
-- of its acks sets exists. Returns 1 if it was forgotten, else 0.
local beat = redis.call("zscore", KEYS[1], ARGV[1])
if not beat or tonumber(beat) > tonumber(ARGV[2]) then
    return 0
end
for i = 3, #KEYS do
    if redis.call("exists", KEYS[i]) > 0 then
        return 0
    end
end
redis.call("zrem", KEYS[1], ARGV[1])
redis.call("hdel", KEYS[2], ARGV[1])
return 1
