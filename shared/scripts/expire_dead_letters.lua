-- Drop one batch of a queue's dead letters older than their TTL
-- (toolfleet.worker.messaging.maintenance).
--
-- KEYS: [1] the queue's dead-letter sorted set (Dramatiq's .XQ, score: when dead-lettered,
-- epoch ms), [2] its messages hash (.XQ.msgs).
-- ARGV: [1] the cutoff (epoch ms: a letter at or before it is expired), [2] the most ids
-- to drop.
-- Returns how many ids were dropped (fewer than ARGV[2]: none older is left).
local ids = redis.call("zrangebyscore", KEYS[1], 0, ARGV[1], "LIMIT", 0, tonumber(ARGV[2]))
if #ids > 0 then
    redis.call("zrem", KEYS[1], unpack(ids))
    redis.call("hdel", KEYS[2], unpack(ids))
end
return #ids
