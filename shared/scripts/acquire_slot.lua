-- A concurrency slot of a tool (toolfleet.worker.tenancy.concurrency).
--
-- KEYS: the slots sorted set. ARGV: holder, now (ms), lease end (ms), limit. Drops
-- expired leases; takes a slot when fewer than ``limit`` are held, or renews the lease of
-- a holder that holds one already (a call takes its slot before its claim, and its run
-- asks again). Returns 1 or 0.
redis.call("zremrangebyscore", KEYS[1], "-inf", ARGV[2])
if not redis.call("zscore", KEYS[1], ARGV[1])
    and redis.call("zcard", KEYS[1]) >= tonumber(ARGV[4]) then
    return 0
end
redis.call("zadd", KEYS[1], ARGV[3], ARGV[1])
local ttl = tonumber(ARGV[3]) - tonumber(ARGV[2]) + 1000
if redis.call("pttl", KEYS[1]) < ttl then redis.call("pexpire", KEYS[1], ttl) end
return 1
