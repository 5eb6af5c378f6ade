-- Record a call's outcome and post its reply (toolfleet.worker.pipeline.ledger).
--
-- KEYS: outcome, reply list, cancel marker, in-flight hash, events stream, and optionally
-- the message's Dramatiq acks set and messages hash. ARGV: reply envelope, outcome ttl (s),
-- reply ttl (s), call id, events maxlen, the message's Redis id (or ""), events...
-- With the two Dramatiq keys the message is acknowledged first, as Dramatiq's own ``ack``
-- does it (drop the id from the acks set; if it was there, drop the body), whatever the
-- outcome: the delivery is over once its call is answered, by this worker or another.
-- Returns 0 when an outcome existed (nothing written), 1 when recorded and posted, 2 when
-- recorded but not posted (a cancel marker other than REQUESTED: the producer resolved
-- the call itself).
if #KEYS == 7 and redis.call("srem", KEYS[6], ARGV[6]) > 0 then
    redis.call("hdel", KEYS[7], ARGV[6])
end
redis.call("hdel", KEYS[4], ARGV[4])
if not redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then return 0 end
for i = 7, #ARGV do
    redis.call("xadd", KEYS[5], "MAXLEN", "~", ARGV[5], "*", "event", ARGV[i])
end
local cancel = redis.call("get", KEYS[3])
if cancel and cancel ~= "${REQUESTED}" then return 2 end
redis.call("rpush", KEYS[2], ARGV[1])
redis.call("expire", KEYS[2], ARGV[3])
return 1
