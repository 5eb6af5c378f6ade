"""The one Redis script that admits a call under its quotas and enqueues it on its lane.

It does what Dramatiq's ``dispatch.lua`` ``enqueue`` command does (``HSET <queue>.msgs
id body``; ``RPUSH <queue> id``), with two differences: a call whose account is over a
quota (:mod:`.quotas`), or whose tool's breaker is open (:mod:`.breakers`: the producer
refuses fast, reading the state workers keep), is refused and nothing is written, and a
call to a queue with
lanes (:mod:`.lanes`) puts its id on the shorter of its account's two lanes and a
:data:`~.lanes.TOKEN` on the queue list (and the lane's number on the queue's lane
rotation when the lane was empty). Checking and enqueuing in one script makes the
quotas exact across any number of producer processes: no call is counted that was not
published, and none is published that was not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from toolfleet.shared.naming import outcome_key, queue_key, queue_msgs_key, quota_key
from toolfleet.shared.settings import Settings
from toolfleet.shared.tenancy.breakers import breaker_key, unavailable_content
from toolfleet.shared.tenancy.lanes import TOKEN, lane_key, lanes_active_key, shard_for, uses_lanes
from toolfleet.shared.tenancy.quotas import limits_key, over_quota_content, quota_scopes
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult

__all__ = ["ENQUEUE_SCRIPT", "QuotaDefaults", "Refused", "enqueue_call", "refused"]


#: KEYS: queue list, messages hash, limits hash, the function's breaker hash, then the
#: account's two lanes and the queue's lane rotation (none: no lanes). ARGV: redis message
#: id, body, now (ms), deadline (ms), call id, quota key prefix, outcome key prefix,
#: default in_flight, per_s and burst (0: none), whether to read the breaker (``1``/``0``),
#: the numbers of the two lanes (``""``: no lanes), then the call's scopes, the account's
#: first. A push that makes its lane non-empty appends the lane's number to the rotation
#: (the invariant of :mod:`.lanes`). Returns 0 when enqueued, else ``{reason, scope,
#: limit, retry after (ms)}`` (reason ``in_flight``, ``per_s`` or ``breaker``) and writes
#: nothing.
#:
#: What it reads costs nothing when a feature is off: no breaker read for a tool without
#: one, one ``HMGET`` for all of a call's quota scopes (none without an account), and the
#: second lane's length only when the first lane is not empty.
ENQUEUE_SCRIPT = """
local now = tonumber(ARGV[3])
local deadline = tonumber(ARGV[4])
if ARGV[11] == "1" then
    local breaker = redis.call("hmget", KEYS[4], "state", "until")
    if breaker[1] == "open" or breaker[1] == "half_open" then
        local reopen = tonumber(breaker[2] or "0")
        if now < reopen then return {"breaker", "", "", math.ceil(reopen - now)} end
    end
end
local function number(value)
    if value == nil or value == cjson.null then return 0 end
    return tonumber(value) or 0
end
local taken = {}
local raws = {}
if #ARGV >= 14 then
    local fields = {}
    for i = 14, #ARGV do fields[#fields + 1] = ARGV[i] end
    fields[#fields + 1] = "*"
    raws = redis.call("hmget", KEYS[3], unpack(fields))
end
for i = 14, #ARGV do
    local scope = ARGV[i]
    local raw = raws[i - 13]
    local quota = nil
    if raw then
        quota = cjson.decode(raw)
    elseif i == 14 then
        raw = raws[#raws]
        if raw then
            quota = cjson.decode(raw)
        else
            quota = {in_flight = ARGV[8], per_s = ARGV[9], burst = ARGV[10]}
        end
    end
    if quota then
        local in_flight = number(quota["in_flight"])
        if in_flight > 0 then
            local key = ARGV[6] .. "inflight:" .. scope
            redis.call("zremrangebyscore", key, "-inf", now)
            if redis.call("zcard", key) >= in_flight then
                for _, id in ipairs(redis.call("zrange", key, 0, -1)) do
                    if redis.call("exists", ARGV[7] .. id) == 1 then
                        redis.call("zrem", key, id)
                    end
                end
            end
            if redis.call("zcard", key) >= in_flight then
                local first = redis.call("zrange", key, 0, 0, "WITHSCORES")
                local wait = math.min(tonumber(first[2]) - now, 1000)
                return {"in_flight", scope, tostring(in_flight), math.max(math.ceil(wait), 1)}
            end
            taken[#taken + 1] = {"in_flight", key}
        end
        local per_s = number(quota["per_s"])
        if per_s > 0 then
            local burst = number(quota["burst"])
            if burst <= 0 then burst = math.max(1, math.ceil(per_s)) end
            local interval = 1000 / per_s
            local key = ARGV[6] .. "rate:" .. scope
            local tat = math.max(tonumber(redis.call("get", key) or "0"), now)
            local allow_at = tat + interval - burst * interval
            if allow_at > now then
                return {"per_s", scope, tostring(per_s), math.max(math.ceil(allow_at - now), 1)}
            end
            taken[#taken + 1] = {"per_s", key, tat + interval}
        end
    end
end
for _, t in ipairs(taken) do
    if t[1] == "in_flight" then
        redis.call("zadd", t[2], deadline, ARGV[5])
        local ttl = math.ceil(deadline - now) + 1000
        if redis.call("pttl", t[2]) < ttl then redis.call("pexpire", t[2], ttl) end
    else
        redis.call("set", t[2], string.format("%.3f", t[3]), "PX", math.ceil(t[3] - now) + 1)
    end
end
redis.call("hset", KEYS[2], ARGV[1], ARGV[2])
if #KEYS >= 7 then
    local lane, number = KEYS[5], ARGV[12]
    local first = redis.call("llen", KEYS[5])
    if first > 0 and redis.call("llen", KEYS[6]) < first then lane, number = KEYS[6], ARGV[13] end
    if redis.call("rpush", lane, ARGV[1]) == 1 then redis.call("rpush", KEYS[7], number) end
    redis.call("rpush", KEYS[1], "%(token)s")
else
    redis.call("rpush", KEYS[1], ARGV[1])
end
return 0
""".replace("%(token)s", TOKEN)


@dataclass(frozen=True, slots=True)
class QuotaDefaults:
    """The quota of an account with none of its own in Redis (``None``: no limit).

    Attributes:
        in_flight: most calls in flight at once.
        per_s: calls per second.
        burst: calls at once above the rate (``None``: ``per_s`` rounded up).
    """

    in_flight: int | None = None
    per_s: float | None = None
    burst: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> QuotaDefaults:
        """The defaults ``settings`` set (``quota_in_flight``, ``quota_per_s``, ``quota_burst``)."""
        return cls(settings.quota_in_flight, settings.quota_per_s, settings.quota_burst)


@dataclass(frozen=True, slots=True)
class Refused:
    """A call the enqueue script refused: nothing was published.

    Attributes:
        message: why, in words a model can act on.
        retry_after_s: seconds after which the call may succeed.
        reason: ``in_flight`` or ``per_s`` (a quota: ``rejected``), or ``breaker`` (the
            tool's open breaker: ``not_available``).
    """

    message: str
    retry_after_s: float
    reason: str = "in_flight"

    @property
    def breaker(self) -> bool:
        """Whether the tool's open breaker refused it (not a quota)."""
        return self.reason == "breaker"

    def result(self, request: ToolCallRequest) -> ToolCallResult:
        """The producer's own ``rejected`` answer to ``request`` (with ``retry_after_s``)."""
        if self.breaker:
            status, content = (
                Status.NOT_AVAILABLE,
                unavailable_content(request.function, self.retry_after_s),
            )
        else:
            status, content = Status.REJECTED, over_quota_content(self.message, self.retry_after_s)
        return ToolCallResult.answering(request, status, content, queued_s=0.0)


def enqueue_call(
    namespace: str,
    queue: str,
    *,
    redis_message_id: str,
    body: bytes,
    call_id: str,
    account: str | None,
    function: str,
    deadline: float,
    defaults: QuotaDefaults,
    now: float,
    breaker: bool = True,
) -> tuple[list[str], list[Any]]:
    """The ``(keys, args)`` of :data:`ENQUEUE_SCRIPT` for one call.

    Args:
        namespace: key prefix.
        queue: the queue to publish on.
        redis_message_id: Dramatiq's id of the message (the ``.msgs`` field).
        body: the encoded Dramatiq message.
        call_id: the request id (what the in-flight quota counts).
        account: the call's account (``None``: no quota).
        function: the function called.
        deadline: the call's deadline, Unix epoch seconds.
        defaults: quotas of accounts without their own.
        now: the current Unix epoch time, seconds.
        breaker: whether the function may have a breaker (its state is read); ``False``
            only for a tool whose catalog entry declares none.
    """
    keys = [
        queue_key(namespace, queue),
        queue_msgs_key(namespace, queue),
        limits_key(namespace),
        breaker_key(namespace, function),
    ]
    lanes: list[Any] = ["", ""]
    if uses_lanes(queue):
        lanes = list(shard_for(account))
        keys += [lane_key(namespace, queue, lane) for lane in lanes]
        keys.append(lanes_active_key(namespace, queue))
    args: list[Any] = [
        redis_message_id,
        body,
        int(now * 1000),
        int(deadline * 1000),
        call_id,
        quota_key(namespace, ""),
        outcome_key(namespace, ""),
        defaults.in_flight or 0,
        defaults.per_s or 0,
        defaults.burst or 0,
        1 if breaker else 0,
        *lanes,
        *quota_scopes(account, function),
    ]
    return keys, args


def refused(reply: Any) -> Refused | None:
    """The refusal :data:`ENQUEUE_SCRIPT` answered, or ``None`` when it enqueued the call."""
    if not isinstance(reply, list) or len(reply) != 4:
        return None
    reason, scope, limit, wait_ms = (_text(part) for part in reply)
    retry_after = max(math.ceil(float(wait_ms)) / 1000, 0.001)
    if reason == "breaker":
        return Refused("the tool's circuit breaker is open", retry_after, "breaker")
    account, _, function = scope.partition("/")
    who = f"account {account!r}" + (f" calling {function}" if function else "")
    if reason == "in_flight":
        what = f"{who} has {limit} calls in flight, its limit"
    else:
        what = f"{who} is over its limit of {float(limit):g} calls per second"
    return Refused(what, retry_after, reason)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
