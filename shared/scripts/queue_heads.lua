-- The waiting calls of one queue: how many wait in each lane, and when the oldest was sent.
-- KEYS: the queue list, its messages hash, then its lanes (none for a queue without lanes).
-- Returns {queue list length, message timestamp (ms) of the oldest waiting call or -1,
--          depth of lane 0, depth of lane 1, ...}.
-- A read of at most 2 + 2 * #lanes commands, whatever the queue holds: the head of each
-- list is its oldest entry (pushes go to the tail), and only heads are read.
local out = {redis.call("llen", KEYS[1]), -1}
local oldest = -1
local function consider(id)
    if not id or id == "*" then return end
    local body = redis.call("hget", KEYS[2], id)
    if not body then return end
    local ok, message = pcall(cjson.decode, body)
    if not ok or type(message) ~= "table" then return end
    local sent = tonumber(message["message_timestamp"])
    if sent and (oldest < 0 or sent < oldest) then oldest = sent end
end
consider(redis.call("lindex", KEYS[1], 0))
for i = 3, #KEYS do
    local depth = redis.call("llen", KEYS[i])
    out[#out + 1] = depth
    if depth > 0 then consider(redis.call("lindex", KEYS[i], 0)) end
end
out[2] = oldest
return out
