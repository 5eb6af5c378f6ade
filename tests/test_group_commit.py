"""Group commit through real workers and a private Redis: calls finished together are
written together, a lone call waits for nothing, and a Redis restart while a batch is
being written loses no call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from conftest import start_fleet
from private_redis import command_counts
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import encode_message
from toolfleet.shared import Status
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult, new_call_id
from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

RECOVERY = ["--extension", "guarantee_tools:recovery_extension"]
RECOVERY_QUEUE = "tools.recovery"


def _requests(function: str, arguments: dict[str, object], reply_to: str, count: int,
              deadline_s: float) -> list[ToolCallRequest]:  # fmt: skip
    now = time.time()
    return [
        ToolCallRequest(
            id=new_call_id(),
            function=function,
            arguments=arguments,
            reply_to=reply_to,
            deadline=now + deadline_s,
            timeout_s=deadline_s,
            sent_at=now,
        )
        for _ in range(count)
    ]


def _publish_plain(r: redis.Redis, ns: str, queue: str, requests: list[ToolCallRequest]) -> None:
    """Enqueue as plain Dramatiq does (HSET + RPUSH, no script): no EVALSHA of the producer."""
    pipe = r.pipeline(transaction=False)
    for request in requests:
        redis_id, body = encode_message(queue, request, redis_message_id=request.id)
        pipe.hset(f"{ns}:{queue}.msgs", redis_id, body)
        pipe.rpush(f"{ns}:{queue}", redis_id)
    pipe.execute()


def _drain(
    r: redis.Redis, reply_to: str, into: dict[str, list[ToolCallResult]], until: Callable[[], bool],
    timeout_s: float,
) -> None:  # fmt: skip
    """Pop every reply of ``reply_to`` into ``into`` (by call id) until ``until()`` or timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until():
        try:
            popped = r.blpop([reply_to], timeout=0.5)
        except redis.ConnectionError:  # the server is restarting
            time.sleep(0.05)
            continue
        if popped is None:
            continue
        envelope = ReplyEnvelope.decode(popped[1])
        assert envelope.type == "result" and envelope.result is not None
        into.setdefault(envelope.result.id, []).append(envelope.result)


def test_a_burst_of_2000_calls_is_answered_once_each_with_fewer_finish_scripts_than_calls(
    tmp_path: Path,
) -> None:
    """2,000 calls at once on 2 processes of 8 threads: one reply each, and the finish
    scripts Redis ran (its commandstats) are fewer than the calls.

    Every finish script runs one SREM per call (its acknowledgement) and one HDEL per
    acknowledged call (the body), plus one HDEL per script (the in-flight records), so
    HDEL − SREM counts the scripts. Nothing else on this path runs HDEL or SREM.
    """
    total = 2000
    with EmbeddedRedis() as server:
        ns = f"tfgroup-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(server.url, ns, tmp_path / "worker.log", processes=2, threads=8,
                            extra=RECOVERY, ready_queue=RECOVERY_QUEUE)  # fmt: skip
        r = redis.Redis.from_url(server.url)
        try:
            reply_to = f"{ns}:reply:burst"
            requests = _requests("ext_recovery_quick", {}, reply_to, total, 120)
            r.config_resetstat()
            _publish_plain(r, ns, RECOVERY_QUEUE, requests)
            replies: dict[str, list[ToolCallResult]] = {}
            _drain(r, reply_to, replies, lambda: len(replies) >= total, 120)
            counts = command_counts(r)
            _drain(r, reply_to, replies, lambda: False, 2.0)  # a second reply would show here
            assert len(replies) == total, f"{total - len(replies)} calls unanswered"
            assert {call_id for call_id in replies} == {request.id for request in requests}
            twice = [call_id for call_id, got in replies.items() if len(got) != 1]
            assert not twice, f"{len(twice)} calls answered more than once"
            assert {got[0].status for got in replies.values()} == {Status.OK}
            assert r.hlen(f"{ns}:{RECOVERY_QUEUE}.msgs") == 0, "a message stayed unacknowledged"
            scripts = counts.get("hdel", 0) - counts.get("srem", 0)
            evalsha, commands = counts.get("evalsha", 0), sum(counts.values())
            print(f"\n{total} calls: {scripts} finish scripts "
                  f"({total / max(scripts, 1):.2f} calls per script), "
                  f"{evalsha} EVALSHA, {commands} commands")  # fmt: skip
            assert counts.get("srem", 0) >= total  # every call acknowledged in its script
            assert 0 < scripts < total, counts
        finally:
            r.close()
            fleet.stop()


def test_a_lone_call_is_not_held_back_by_a_call_still_running(tmp_path: Path) -> None:
    """A quick call finishing while a 6 s call runs in the same process is answered at once,
    not when the long one ends (and an idle process answers a lone call at once too)."""
    with EmbeddedRedis() as server:
        ns = f"tflone-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(server.url, ns, tmp_path / "worker.log", processes=1, threads=2,
                            extra=RECOVERY, ready_queue=RECOVERY_QUEUE)  # fmt: skip
        try:
            with ToolClient(server.url, namespace=ns) as client:
                started = time.monotonic()
                assert client.call("ext_recovery_quick", {}, timeout_s=10).ok
                idle_s = time.monotonic() - started
                slow = client.submit(
                    "ext_recovery_count", {"key": f"{ns}:runs", "seconds": 6.0}, timeout_s=20
                )
                time.sleep(0.5)  # the slow call is running on one of the 2 threads
                started = time.monotonic()
                quick = client.call("ext_recovery_quick", {}, timeout_s=10)
                beside_s = time.monotonic() - started
                assert quick.ok, quick
                assert not slow.done(), "the slow call ended first: nothing was shown"
                assert slow.result(timeout=20).ok
            print(f"\nlone call: {idle_s:.3f} s idle, {beside_s:.3f} s beside a running call")
            # generous: a completer that waited for the running call would take ~5.5 s
            assert idle_s < 3.0 and beside_s < 3.0, (idle_s, beside_s)
        finally:
            fleet.stop()


def test_a_redis_restart_during_a_batch_write_loses_no_call(tmp_path: Path) -> None:
    """Writes held (``CLIENT PAUSE WRITE``) while the calls' tools end, so their finish
    scripts wait in flight; Redis restarts (its data saved) under them: each call is still
    answered once, ``ok``, by its deadline."""
    total = 64
    with EmbeddedRedis() as server:
        ns = f"tfrestartbatch-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(server.url, ns, tmp_path / "worker.log", processes=1, threads=8,
                            extra=RECOVERY, ready_queue=RECOVERY_QUEUE)  # fmt: skip
        r = redis.Redis.from_url(server.url)
        try:
            reply_to = f"{ns}:reply:restart"
            requests = _requests("ext_recovery_sleep", {"seconds": 0.3}, reply_to, total, 60)
            _publish_plain(r, ns, RECOVERY_QUEUE, requests)
            replies: dict[str, list[ToolCallResult]] = {}
            _drain(r, reply_to, replies, lambda: len(replies) >= 8, 30)
            assert 8 <= len(replies) < total, len(replies)
            r.client_pause(30_000, all=False)  # writes wait; reads go on
            answered = r.llen(reply_to) + len(replies)
            time.sleep(1.0)  # every running tool (0.3 s) has ended: its write waits
            waiting: list[str] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "evalsha" not in waiting:
                waiting = [c["cmd"] for c in r.client_list() if "b" in c["flags"]]
                time.sleep(0.1)
            assert "evalsha" in waiting, f"no script waits on the paused server: {waiting}"
            assert r.llen(reply_to) + len(replies) == answered, "a write went through the pause"
            server.restart(keep_data=True)  # the waiting scripts die with their connections
            r = redis.Redis.from_url(server.url)
            _drain(r, reply_to, replies, lambda: len(replies) >= total, 60)
            _drain(r, reply_to, replies, lambda: False, 2.0)  # a second reply would show here
            missing = [q.id for q in requests if q.id not in replies]
            assert not missing, f"{len(missing)} calls lost: {fleet.log()[-3000:]}"
            twice = [call_id for call_id, got in replies.items() if len(got) != 1]
            assert not twice, f"{len(twice)} calls answered more than once"
            statuses = {got[0].status for got in replies.values()}
            assert statuses == {Status.OK}, statuses
            assert fleet.process.poll() is None, "the supervisor died"
        finally:
            r.close()
            fleet.stop()


def test_a_call_whose_reply_list_is_not_a_list_fails_alone_in_its_batch() -> None:
    """Three calls in one finish script, the middle one's reply key a string: that call gets
    its WRONGTYPE error; the other two are recorded and answered as if alone."""
    from toolfleet.shared.naming import outcome_key
    from toolfleet.worker.pipeline.completer import Outcome, Posted, post_outcomes

    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url)
        ns = "tfwrongtype"
        ids = [new_call_id() for _ in range(3)]
        replies = [f"{ns}:reply:a", f"{ns}:reply:taken", f"{ns}:reply:a"]
        r.set(replies[1], "not a list")
        outcomes = [
            Outcome(call_id, reply_to, f"envelope {i}".encode(), 60, 60, [b"{}"])
            for i, (call_id, reply_to) in enumerate(zip(ids, replies, strict=True))
        ]
        posted = post_outcomes(r, ns, "w:1", outcomes)
        assert posted[0] == Posted.POSTED and posted[2] == Posted.POSTED
        assert isinstance(posted[1], redis.ResponseError) and "WRONGTYPE" in str(posted[1])
        assert r.lrange(replies[0], 0, -1) == [b"envelope 0", b"envelope 2"]
        assert 0 < r.ttl(replies[0]) <= 60
        assert r.get(replies[1]) == b"not a list"
        assert [r.get(outcome_key(ns, call_id)) for call_id in ids] == [
            b"envelope 0",
            b"envelope 1",
            b"envelope 2",
        ]
        r.close()
