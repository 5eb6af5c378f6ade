"""Recovery guarantees through real workers and real Redis.

A SIGKILLed worker process, bad arguments and poison messages, a Redis restart, and a
SIGTERM under load: every call gets exactly one terminal reply and no process crashes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status, codec
from toolfleet.shared.naming import actor_name_for, brokers_key, claim_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult, new_call_id
from toolfleet.worker.pipeline.ledger import owner_of

#: The thread tools of tests/guarantee_tools.py without its process tools (no tool child
#: processes to start, so a fleet is up in seconds).
G = "ext_recovery_"
QUEUE = "tools.recovery"
TOOLS = ["--extension", "guarantee_tools:recovery_extension"]


# -- helpers ----------------------------------------------------------------------------


def _ns(namespace: str, what: str) -> str:
    return f"{namespace}-{what}-{uuid.uuid4().hex[:6]}"


def _record_replies(
    client: ToolClient, into: dict[str, list[ToolCallResult]] | None = None
) -> dict[str, list[ToolCallResult]]:
    """Record every terminal reply the client's listener receives, duplicates included."""
    seen: dict[str, list[ToolCallResult]] = {} if into is None else into
    listener = client._listener
    deliver = listener._deliver

    def recording(batch: list[bytes]) -> None:
        for data in batch:
            try:
                envelope = ReplyEnvelope.decode(data)
            except Exception:  # noqa: BLE001 - the listener logs it; nothing to record
                continue
            if envelope.type == "result" and envelope.result is not None:
                seen.setdefault(envelope.result.id, []).append(envelope.result)
        deliver(batch)

    listener._deliver = recording  # type: ignore[method-assign]
    return seen


def _track(futures: list[Future[ToolCallResult]]) -> dict[int, float]:
    """Monotonic time at which each future resolved, by index."""
    done_at: dict[int, float] = {}
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _f, i=i: done_at.setdefault(i, time.monotonic()))
    return done_at


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return sorted(int(p) for p in out.stdout.split())


def _worker_children(fleet: Fleet) -> list[int]:
    """The supervisor's worker processes (its direct children)."""
    return _children(fleet.process.pid)


def _freeze_a_holder(fleet: Fleet, r: redis.Redis, namespace: str) -> tuple[int, list[bytes]]:
    """SIGSTOP a worker process of ``fleet`` that holds calls: its pid and their Redis ids.

    What a frozen process holds is exactly its acks set. On a loaded machine a process may
    be between fetches the moment it is frozen, holding nothing: it is let go and the other
    one tried, up to 40 times. The caller SIGKILLs (or SIGCONTs) the returned pid.
    """
    for tries in range(1, 41):
        victim = _worker_children(fleet)[tries % 2]
        broker_id = r.hget(brokers_key(namespace), f"{socket.gethostname()}:{victim}")
        assert broker_id is not None
        os.kill(victim, signal.SIGSTOP)
        time.sleep(0.1)
        held = list(r.smembers(f"{namespace}:__acks__.{broker_id.decode()}.{QUEUE}"))
        if held:
            return victim, held
        os.kill(victim, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("no process held calls when frozen, 40 tries: not mid-run")


def _assert_no_thread_died(fleet: Fleet) -> None:
    log = fleet.log()
    assert "Consumer encountered an unexpected error" not in log, log[-4000:]
    assert "Exception in thread" not in log, log[-4000:]


def _push_raw(r: redis.Redis, namespace: str, body: bytes, message_id: str | None = None) -> str:
    """Put ``body`` on the queue as a whole Dramatiq message, as dispatch.lua's enqueue does
    (HSET ``<ns>:<queue>.msgs`` id body, RPUSH ``<ns>:<queue>`` id); return the id."""
    message_id = message_id or str(uuid.uuid4())
    pipe = r.pipeline(transaction=True)
    pipe.hset(f"{namespace}:{QUEUE}.msgs", message_id, body)
    pipe.rpush(f"{namespace}:{QUEUE}", message_id)
    pipe.execute()
    return message_id


def _message(request: Any, **fields: Any) -> dict[str, Any]:
    """A Dramatiq message body for the test queue carrying ``request`` as its argument."""
    body: dict[str, Any] = {
        "queue_name": QUEUE,
        "actor_name": actor_name_for(QUEUE),
        "args": [request],
        "kwargs": {},
        "options": {},
        "message_id": str(uuid.uuid4()),
        "message_timestamp": int(time.time() * 1000),
    }
    body.update(fields)
    return body


def _push_message(r: redis.Redis, namespace: str, body: dict[str, Any]) -> str:
    """Enqueue a message body, filling in its ``redis_message_id`` like the producer does."""
    message_id = str(uuid.uuid4())
    if isinstance(body.get("options"), dict) and "redis_message_id" not in body["options"]:
        body = {**body, "options": {**body["options"], "redis_message_id": message_id}}
    return _push_raw(r, namespace, json.dumps(body).encode(), message_id=message_id)


def _request(reply_to: str, **fields: Any) -> dict[str, Any]:
    now = time.time()
    request: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "tool_call_id": "call_0",
        "function": G + "quick",
        "arguments": {},
        "reply_to": reply_to,
        "deadline": now + 10,
        "timeout_s": 10.0,
        "sent_at": now,
    }
    request.update(fields)
    return request


def _replies(r: redis.Redis, key: str, want: int, timeout_s: float) -> list[ToolCallResult]:
    """Pop ``want`` results from reply list ``key`` (fewer if they do not come in time)."""
    results: list[ToolCallResult] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < want and time.monotonic() < deadline:
        item = r.blpop([key], timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        if item is not None:
            envelope = ReplyEnvelope.decode(item[1])
            if envelope.result is not None:
                results.append(envelope.result)
    return results


def _dead_lettered(r: redis.Redis, namespace: str, ids: list[str]) -> list[str]:
    xq = f"{namespace}:{QUEUE}.XQ"
    return [i for i in ids if r.zscore(xq, i) is not None]


# -- SIGKILL of one worker process under load (1,000 and 5,000 calls in flight) --------


def test_sigkill_mid_run_answers_every_call_once_and_never_reruns(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """SIGKILL mid-run under 1,000 calls: each resolves once, ok or crashed; nothing runs twice."""
    ns = _ns(namespace, "kill")
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=2, threads=8,
                        extra=TOOLS)  # fmt: skip
    r = redis.Redis.from_url(redis_url)
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            seen = _record_replies(client)
            keys = [f"{ns}:count:{i}" for i in range(1000)]
            started = time.monotonic()
            futures = [
                client.submit(G + "count", {"key": key, "seconds": 0.02}, timeout_s=60)
                for key in keys
            ]
            done_at = _track(futures)
            _wait_until(lambda: len(done_at) >= 250, 30, "250 calls answered")
            # Freeze a process that holds calls to read exactly what it holds, then kill it.
            victim, held_redis_ids = _freeze_a_holder(fleet, r, ns)
            worker_id = f"{socket.gethostname()}:{victim}"
            bodies = r.hmget(f"{ns}:{QUEUE}.msgs", held_redis_ids)
            held = {json.loads(b)["message_id"] for b in bodies if b is not None}
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            results = [f.result(timeout=90) for f in futures]
            finished = time.monotonic()
        assert held, "the killed process held no calls: not mid-run"
        index = {f.call_id: i for i, f in enumerate(futures)}  # type: ignore[attr-defined]
        statuses = [res.status for res in results]
        assert set(statuses) <= {Status.OK, Status.CRASHED}, sorted(set(statuses))
        for i, res in enumerate(results):
            assert res.id == futures[i].call_id  # type: ignore[attr-defined]
            replies = seen.get(res.id, [])
            assert replies, f"call {res.id} resolved without a reply"
            distinct = {(x.status, codec.dumps(x.content)) for x in replies}
            assert len(distinct) == 1, f"call {res.id} got different terminal replies: {distinct}"
        counts = [int(v or 0) for v in r.mget(keys)]
        for res, count in zip(results, counts, strict=True):
            if res.status is Status.OK:
                assert count == 1 and res.content == 1, (res, count)
            else:
                assert count <= 1, (res, count)
        crashed = [res for res in results if res.status is Status.CRASHED]
        assert crashed, "no call was running on the killed process"
        assert {res.id for res in crashed} <= held
        for res in crashed:
            assert owner_of(r.get(claim_key(ns, res.id)).decode()) == worker_id  # type: ignore[union-attr]
        recovered_at = max(done_at[index[call_id]] for call_id in held)
        recovery_s = recovered_at - killed_at
        print(
            f"\nSIGKILL recovery: {len(held)} calls held by the killed process "
            f"({len(crashed)} running → crashed, {len(held) - len(crashed)} prefetched → ok); "
            f"last of them answered {recovery_s:.2f} s after the kill; "
            f"all 1,000 answered {finished - started:.2f} s after submit "
            f"({finished - killed_at:.2f} s after the kill)"
        )
        assert recovery_s < 10.0
        _wait_until(lambda: len(_worker_children(fleet)) == 2, 30, "the process restarted")
        assert victim not in _worker_children(fleet)
    finally:
        fleet.stop()
        r.close()


def test_sigkill_under_5000_calls_posts_exactly_one_reply_per_call(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """5,000 calls of a non-idempotent tool through 2 processes, one SIGKILLed mid-run.

    The replies are read straight from the reply list (every message counted, so a second
    reply to any call would show), and afterwards the list stays empty: each call gets
    exactly one reply, ``ok`` (the tool ran once) or ``crashed`` (it was running on the
    killed process and is not run again), and no call runs twice.
    """
    ns = _ns(namespace, "kill5k")
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=2, threads=8,
                        extra=TOOLS)  # fmt: skip
    r = redis.Redis.from_url(redis_url)
    reply_to = f"{ns}:reply:bulk"
    total = 5000
    try:
        now = time.time()
        requests = [
            ToolCallRequest(
                id=new_call_id(),
                function=G + "count",
                arguments={"key": f"{ns}:count:{i}", "seconds": 0.01},
                reply_to=reply_to,
                deadline=now + 240,
                timeout_s=240.0,
                sent_at=now,
            )  # fmt: skip
            for i in range(total)
        ]
        keys = {request.id: request.arguments["key"] for request in requests}  # type: ignore[index]
        outcomes = Publisher(r, ns).publish_many([(QUEUE, request) for request in requests])
        assert all(outcome is None for outcome in outcomes)
        replies: dict[str, list[ToolCallResult]] = {}

        def drain(timeout_s: float) -> None:
            popped = r.blpop([reply_to], timeout=timeout_s)
            while popped is not None:
                envelope = ReplyEnvelope.decode(popped[1])
                assert envelope.type == "result" and envelope.result is not None
                replies.setdefault(envelope.result.id, []).append(envelope.result)
                raw = r.lpop(reply_to)
                popped = (reply_to.encode(), raw) if raw is not None else None

        # a tenth acknowledged (gone from the queue's messages): mid-run, read off Redis, so
        # that this process being slow to read the replies (a loaded machine) cannot let the
        # fleet finish first; the replies wait on their list
        messages = f"{ns}:{QUEUE}.msgs"
        deadline = time.monotonic() + 120
        while r.hlen(messages) > total - total // 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.hlen(messages) <= total - total // 10, "not a tenth answered before the kill"
        victim, held = _freeze_a_holder(fleet, r, ns)  # to read what it holds, then kill it
        worker_id = f"{socket.gethostname()}:{victim}"
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 240
        while len(replies) < total and time.monotonic() < deadline:
            drain(1.0)
        drain(3.0)  # a second reply to any call would arrive here
        assert len(replies) == total, f"{total - len(replies)} calls unanswered"
        twice = {call_id: len(got) for call_id, got in replies.items() if len(got) != 1}
        assert not twice, f"calls answered more than once: {list(twice.items())[:5]}"
        results = {call_id: got[0] for call_id, got in replies.items()}
        statuses = {result.status for result in results.values()}
        assert statuses <= {Status.OK, Status.CRASHED}, sorted(statuses)
        runs = dict(zip(keys, (int(v or 0) for v in r.mget(list(keys.values()))), strict=True))
        for call_id, result in results.items():
            if result.status is Status.OK:
                assert runs[call_id] == 1 and result.content == 1, (result, runs[call_id])
            else:
                assert runs[call_id] <= 1, (result, runs[call_id])
        crashed = [result for result in results.values() if result.status is Status.CRASHED]
        for result in crashed:
            assert owner_of(r.get(claim_key(ns, result.id)).decode()) == worker_id  # type: ignore[union-attr]
        print(f"\nSIGKILL under {total} calls: {len(held)} held by the killed process, "
              f"{len(crashed)} of them running → crashed; every call answered once")  # fmt: skip
    finally:
        fleet.stop()
        r.close()


# -- arbitrary arguments and poison messages through real workers ------------------------


@pytest.fixture(scope="module")
def arg_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes serving the recovery tools, for the arguments and poison tests."""
    fleet = start_fleet(
        redis_url,
        _ns(namespace, "args"),
        tmp_path_factory.mktemp("args") / "worker.log",
        processes=2,
        threads=4,
        extra=TOOLS,
    )
    yield fleet
    fleet.stop()


#: Every terminal reply the module's client received, by call id (duplicates included).
ACLIENT_REPLIES: dict[str, list[ToolCallResult]] = {}


@pytest.fixture(scope="module")
def aclient(arg_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(arg_fleet.redis_url, namespace=arg_fleet.namespace) as c:
        _record_replies(c, into=ACLIENT_REPLIES)
        yield c


@pytest.fixture(scope="module")
def ar(arg_fleet: Fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(arg_fleet.redis_url)
    yield client
    client.close()


# -- arbitrary arguments: property tests --------------------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ARGUMENT_NAMES = st.sampled_from(["a", "b", "n", "k", "p", "values", "key", "verbose"])
ARGUMENTS = st.one_of(
    st.none(),
    st.dictionaries(ARGUMENT_NAMES | st.text(max_size=8), JSON_VALUES, max_size=4),
    st.text(max_size=60),
    JSON_VALUES.map(json.dumps),
    JSON_VALUES.map(lambda v: json.dumps(json.dumps(v))),
)
FUNCTIONS = st.sampled_from([G + "quick", G + "gcd", G + "binomial", G + "total"])
ANSWERED = {Status.OK, Status.INVALID_ARGUMENTS, Status.TOOL_ERROR}
#: Examples per property test; raise it for a longer fuzzing run.
EXAMPLES = int(os.environ.get("TOOLFLEET_TEST_EXAMPLES", "60"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(calls=st.lists(st.tuples(FUNCTIONS, ARGUMENTS), min_size=1, max_size=4))
def test_arbitrary_arguments_get_exactly_one_answer(
    arg_fleet: Fleet, aclient: ToolClient, calls: list[tuple[str, Any]]
) -> None:
    """Any JSON value or string as arguments: exactly one answer of the enum; no worker crashes."""
    pids = _worker_children(arg_fleet)
    futures = [aclient.submit(function, arguments, timeout_s=10) for function, arguments in calls]
    for future in futures:
        result = future.result(timeout=15)
        assert result.status in ANSWERED, result
        assert len(ACLIENT_REPLIES[result.id]) == 1
    assert _worker_children(arg_fleet) == pids


@settings(
    max_examples=EXAMPLES * 2 // 3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(JSON_VALUES, min_size=1, max_size=4))
def test_any_json_value_as_arguments_gets_one_reply(
    arg_fleet: Fleet, ar: redis.Redis, values: list[Any]
) -> None:
    """Any JSON value as raw request arguments: exactly one reply (rejected if not a request)."""
    reply_to = f"{arg_fleet.namespace}:reply:raw-{uuid.uuid4().hex}"
    ids = []
    for value in values:
        request = _request(reply_to, function=G + "binomial", arguments=value)
        ids.append(request["id"])
        _push_message(ar, arg_fleet.namespace, _message(json.dumps(request)))
    results = _replies(ar, reply_to, len(ids), timeout_s=10)
    assert sorted(res.id for res in results) == sorted(ids)
    for res in results:
        value = values[ids.index(res.id)]
        if value is None or isinstance(value, (dict, str)):  # a request: answered by the tool
            assert res.status in ANSWERED, (value, res)
        else:  # arrays, numbers, booleans: not a request
            assert res.status is Status.REJECTED, (value, res)
    assert ar.llen(reply_to) == 0  # no second reply (so far)
    ar.delete(reply_to)


RMID = "\x00redis-message-id\x00"  # replaced by the id the message is stored under
MESSAGE_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "queue_name": st.just(QUEUE) | JSON_VALUES,
        "actor_name": st.just(actor_name_for(QUEUE)) | JSON_VALUES,
        "args": st.lists(JSON_VALUES, max_size=3) | JSON_VALUES,
        "kwargs": st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2) | JSON_VALUES,
        "options": JSON_VALUES
        | st.fixed_dictionaries(
            {},
            optional={
                "redis_message_id": st.just(RMID) | JSON_SCALARS,
                "eta": JSON_SCALARS,
                "throws": JSON_VALUES,
                "notify_shutdown": JSON_SCALARS,
            },
        ),
        "message_id": st.text(max_size=10) | JSON_VALUES,
        "message_timestamp": JSON_VALUES,
    },
)
POISON = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    MESSAGE_FIELDS.map(lambda m: json.dumps(m).encode()),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bodies=st.lists(POISON, min_size=1, max_size=4))
def test_poison_messages_are_dead_lettered_and_strand_nothing(
    arg_fleet: Fleet, aclient: ToolClient, ar: redis.Redis, bodies: list[bytes]
) -> None:
    """Arbitrary message bytes are dead-lettered, strand no call, and crash no process or thread."""
    ns = arg_fleet.namespace
    pids = _worker_children(arg_fleet)
    ids = []
    for body in bodies:
        message_id = str(uuid.uuid4())
        body = body.replace(json.dumps(RMID).encode(), json.dumps(message_id).encode())
        ids.append(_push_raw(ar, ns, body, message_id=message_id))
    normal = [aclient.submit(G + "quick", {}, timeout_s=10) for _ in range(3)]
    assert [f.result(timeout=15).status for f in normal] == [Status.OK] * 3
    _wait_until(lambda: len(_dead_lettered(ar, ns, ids)) == len(ids), 5, "poison dead-lettered")
    assert _worker_children(arg_fleet) == pids
    _assert_no_thread_died(arg_fleet)


def test_malformed_message_with_readable_reply_to_is_answered_rejected(
    arg_fleet: Fleet, ar: redis.Redis
) -> None:
    """A malformed message with a readable reply_to is answered rejected and dead-lettered."""
    ns = arg_fleet.namespace
    reply_to = f"{ns}:reply:poison-{uuid.uuid4().hex}"
    broken_request = _request(reply_to, deadline="tomorrow")  # not a ToolCallRequest
    no_actor = _request(reply_to)  # fine, inside an envelope Dramatiq cannot decode
    body = _message(json.dumps(no_actor))
    del body["actor_name"]
    bad_options = _request(reply_to)  # fine, inside an envelope with unusable options
    ids = [
        _push_message(ar, ns, _message(json.dumps(broken_request))),
        _push_message(ar, ns, body),
        _push_message(ar, ns, _message(json.dumps(bad_options), options=[])),
    ]
    results = _replies(ar, reply_to, 3, timeout_s=10)
    assert sorted(res.id for res in results) == sorted(
        [broken_request["id"], no_actor["id"], bad_options["id"]]
    )
    assert {res.status for res in results} == {Status.REJECTED}
    _wait_until(lambda: len(_dead_lettered(ar, ns, ids)) == 3, 5, "dead-lettered")
    _assert_no_thread_died(arg_fleet)
    ar.delete(reply_to)


def test_messages_dramatiq_would_choke_on_are_dead_lettered(
    arg_fleet: Fleet, aclient: ToolClient, ar: redis.Redis
) -> None:
    """Decodable messages that would crash Dramatiq's threads or pin a slot are dead-lettered."""
    ns = arg_fleet.namespace
    far = int(time.time() * 1000) + 86_400_000
    bodies = [
        _message("x", options={"throws": "not an exception class"}),  # kills a worker thread
        _message("x", message_id={"not": "hashable"}),  # crashes the consumer thread
        _message("x", queue_name="tools.elsewhere"),  # kills a worker thread
        _message("x", actor_name=["not", "hashable"]),  # crashes the consumer thread
        _message("x", options={"eta": far}),  # holds a prefetch slot for a day
        _message("x", kwargs=[]),
        _message("x", args=[]),
    ]
    ids = [_push_message(ar, ns, body) for body in bodies * 4]  # more than the threads
    ids.append(_push_raw(ar, ns, b'{"args": []}'))  # undecodable, with an empty args list
    normal = [aclient.submit(G + "quick", {}, timeout_s=10) for _ in range(20)]
    assert all(f.result(timeout=15).ok for f in normal)
    _wait_until(lambda: len(_dead_lettered(ar, ns, ids)) == len(ids), 5, "dead-lettered")
    _assert_no_thread_died(arg_fleet)


# -- Redis restarted with 500 calls in flight --------------------------------


@pytest.mark.parametrize("keep_data", [False, True], ids=["data-lost", "data-kept"])
def test_redis_restart_under_load(tmp_path: Path, keep_data: bool) -> None:
    """Redis restart under 500 calls: no process dies, none resolves late, service resumes."""
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        ns = f"tfrestart-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(server.url, ns, tmp_path / "worker.log", processes=2, threads=4,
                            extra=TOOLS)  # fmt: skip
        try:
            pids = _worker_children(fleet)
            with ToolClient(server.url, namespace=ns) as client:
                timeout_s = 6.0
                sent: list[float] = []
                futures = []
                for _ in range(500):
                    sent.append(time.monotonic())
                    futures.append(
                        client.submit(G + "sleep", {"seconds": 0.05}, timeout_s=timeout_s)
                    )
                done_at = _track(futures)
                _wait_until(lambda: len(done_at) >= 100, 20, "100 calls answered")
                server.restart(keep_data=keep_data)
                restarted_at = time.monotonic()
                # Service resumes: a call on another queue (not behind the backlog) succeeds.
                resumed_at = None
                while resumed_at is None and time.monotonic() < restarted_at + 20:
                    probe = client.call("ext_fleet_test_echo", {"text": "x"}, timeout_s=1)
                    if probe.ok:
                        resumed_at = time.monotonic()
                    else:
                        time.sleep(0.05)
                assert resumed_at is not None, fleet.log()[-4000:]
                results = [f.result(timeout=timeout_s + 5) for f in futures]
                statuses = {s: sum(r.status is s for r in results) for s in Status}
                assert {r.status for r in results} <= {Status.OK, Status.TIMEOUT}, statuses
                late = [done_at[i] - sent[i] - timeout_s for i in range(500)]
                assert max(late) <= 0.5, f"a call resolved {max(late):.2f} s after its deadline"
                batch = [client.submit(G + "quick", {}, timeout_s=5) for _ in range(50)]
                assert all(f.result().ok for f in batch)
            print(
                f"\nRedis restart ({'data kept' if keep_data else 'data lost'}): "
                f"{statuses[Status.OK]} ok, {statuses[Status.TIMEOUT]} timeout (none late); "
                f"a new call answered ok {resumed_at - restarted_at:.2f} s after the restart"
            )
            assert fleet.process.poll() is None, "the supervisor died"
            assert _worker_children(fleet) == pids, "a worker process died"
            assert "exited with" not in fleet.log()
            _assert_no_thread_died(fleet)
        finally:
            fleet.stop()


# -- SIGTERM under load --------------------------------------------------------


def test_sigterm_under_load_answers_every_call(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """SIGTERM to one of two fleets under 300 calls: every call is answered ok; none times out."""
    ns = _ns(namespace, "term")
    with ThreadPoolExecutor(2) as pool:
        starting = [
            pool.submit(
                start_fleet,
                redis_url,
                ns,
                tmp_path / f"{name}.log",
                processes=1,
                threads=4,
                extra=TOOLS,
            )  # fmt: skip
            for name in ("a", "b")
        ]
        fleet_a, fleet_b = (f.result() for f in starting)
    try:
        _wait_until(lambda: fleet_a.live_workers() >= 2, 60, "both fleets serving")
        a_ids = {f"{socket.gethostname()}:{pid}" for pid in _worker_children(fleet_a)}
        with ToolClient(redis_url, namespace=ns) as client:
            futures = [
                client.submit(G + "sleep", {"seconds": 0.05}, timeout_s=30) for _ in range(300)
            ]
            done_at = _track(futures)
            _wait_until(lambda: len(done_at) >= 50, 30, "50 calls answered")
            fleet_a.process.send_signal(signal.SIGTERM)
            termed_at = time.monotonic()
            assert fleet_a.process.wait(timeout=30) == 0
            stopped_s = time.monotonic() - termed_at
            results = [f.result(timeout=40) for f in futures]
        statuses = {r.status for r in results}
        assert statuses == {Status.OK}, [r for r in results if not r.ok][:3]
        by_a = [i for i, r in enumerate(results) if r.worker in a_ids]
        after = [i for i in by_a if done_at[i] > termed_at]
        assert by_a, "fleet A answered nothing"
        assert len(by_a) < len(results), "fleet B answered nothing"
        assert fleet_b.process.poll() is None
        print(
            f"\nSIGTERM under load: 300/300 ok; fleet A answered {len(by_a)} "
            f"({len(after)} while draining), fleet B {len(results) - len(by_a)}; "
            f"A exited {stopped_s:.2f} s after SIGTERM"
        )
    finally:
        fleet_a.stop()
        fleet_b.stop()
