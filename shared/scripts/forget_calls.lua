-- Free a dead worker's concurrency leases (toolfleet.worker.messaging.recovery).
--
-- KEYS: the dead worker's in-flight hash, then the slot set of each call of ARGV (in order).
-- ARGV: the call ids. Removes each call's lease from its tool's slot set (a tool without a
-- concurrency limit has no such set: a no-op), deletes the in-flight hash, and returns how
-- many leases it removed.
local freed = 0
for i = 1, #ARGV do
    freed = freed + redis.call("zrem", KEYS[i + 1], ARGV[i])
end
redis.call("del", KEYS[1])
return freed
