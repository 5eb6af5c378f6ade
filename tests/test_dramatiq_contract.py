"""The Dramatiq internals toolfleet relies on: fail loudly when an upgrade changes them.

The worker's own loop (``worker/pipeline/fetch.py``, ``loop.py``) keeps Dramatiq's message
format and keys and drives ``RedisBroker``'s ``dispatch.lua`` (ack, nack, requeue,
enqueue); the producer, the catalog heartbeat and the supervisor's recovery read its keys
too. Everything here runs against a real Redis.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import SimpleQueue

import dramatiq
import pytest
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import DecodeError
from dramatiq.message import Message

from conftest import delete_namespace
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import actor_name_for, brokers_key, outcome_key
from toolfleet.shared.tenancy.lanes import TOKEN, lane_key, shard_for
from toolfleet.shared.wire import ToolCallRequest
from toolfleet.worker.messaging.broker import FleetRedisBroker, make_broker
from toolfleet.worker.messaging.maintenance import record_broker_queues, run_maintenance
from toolfleet.worker.messaging.recovery import recover_dead_worker
from toolfleet.worker.pipeline.fetch import Delivery, QueueFetcher, Slots
from toolfleet.worker.pipeline.ledger import Posted, post_outcome

PINNED = "2.2.1"
QUEUE = "tools.contract"


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    """A namespace of its own, deleted afterwards."""
    namespace = f"tfcontract-{uuid.uuid4().hex[:8]}"
    yield namespace
    delete_namespace(redis_url, namespace)


@pytest.fixture
def broker(redis_url: str, ns: str) -> Iterator[FleetRedisBroker]:
    made = make_broker(redis_url, ns)
    yield made
    made.client.close()


def _request(function: str = "ext_contract_tool") -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()),
        function=function,
        arguments={"a": 1},
        reply_to="nowhere",
        deadline=now + 30,
        timeout_s=30.0,
        sent_at=now,
    )


def _lanes(ns: str) -> list[str]:
    """The two lanes of an account-less call on the contract queue."""
    return [lane_key(ns, QUEUE, lane) for lane in shard_for(None)]


def _publish(broker: RedisBroker, request: ToolCallRequest | None = None) -> str:
    """Publish one request through the producer's Publisher; return its Redis message id."""
    request = request or _request()
    lanes = _lanes(broker.namespace)
    before = {redis_id for lane in lanes for redis_id in broker.client.lrange(lane, 0, -1)}
    Publisher(broker.client, broker.namespace).publish(QUEUE, request)
    added = {redis_id for lane in lanes for redis_id in broker.client.lrange(lane, 0, -1)}
    added -= before
    if len(added) != 1:
        raise AssertionError("the request is on neither of its lanes")
    return str(added.pop().decode())


def test_dramatiq_is_the_pinned_version() -> None:
    """toolfleet is built against Dramatiq 2.2.1; a different version must be re-checked."""
    assert dramatiq.__version__ == PINNED
    assert importlib.metadata.version("dramatiq") == PINNED
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"dramatiq[redis]=={PINNED}"' in pyproject


def test_broker_commands_and_attributes_used_by_the_loop(broker: FleetRedisBroker) -> None:
    """The broker's do_* commands and the attributes the loop and maintenance read exist."""
    for command in ("do_enqueue", "do_fetch", "do_ack", "do_nack", "do_requeue", "do_qsize"):
        assert callable(getattr(broker, command)), command
    for name in ("scripts", "heartbeat_timeout", "dead_message_ttl", "broker_id", "namespace"):
        assert hasattr(broker, name), name
    assert "dispatch" in broker.scripts
    assert isinstance(broker._max_unpack_size(), int)
    assert broker.middleware == []  # no Dramatiq worker runs it
    # the dispatch script's maintenance is asked for through this method (0: never)
    assert "self._should_do_maintenance(command)" in inspect.getsource(RedisBroker._dispatch)
    assert broker._should_do_maintenance("fetch") == 0


def test_dispatch_script_reads_only_its_first_key_and_is_called_with_keywords(
    broker: FleetRedisBroker,
) -> None:
    """On a cluster the broker adds a key to ``dispatch.lua``'s declared keys
    (:func:`~toolfleet.worker.messaging.broker.hold_dispatch_through_migrations`): the
    script must read ``KEYS[1]`` only, and Dramatiq must call it as ``(args=, keys=)``."""
    source = (Path(dramatiq.brokers.redis.__file__).parent / "redis" / "dispatch.lua").read_text()
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    assert re.findall(r"KEYS\[(\w+)\]", code) == ["1"]
    assert "#KEYS" not in code and "unpack(KEYS" not in code
    body = inspect.getsource(RedisBroker._dispatch)
    assert "dispatch(args=args, keys=keys)" in body


def test_message_format_and_decode() -> None:
    """Message's fields and Message.decode (raising DecodeError) are as the consumer expects."""
    names = [f.name for f in dataclasses.fields(Message)]
    assert names == [
        "queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp",
    ]  # fmt: skip
    message = Message(queue_name=QUEUE, actor_name="a", args=("x",), kwargs={}, options={})
    decoded = Message.decode(message.encode())
    assert decoded == message and isinstance(decoded.args, tuple)
    assert MessageProxy(decoded).message_id == message.message_id
    for poison in (b"", b"\xff\xfe", b"[]", b'{"queue_name": "q"}'):
        with pytest.raises(DecodeError):
            Message.decode(poison)


def test_dispatch_commands_and_key_layout(broker: FleetRedisBroker, ns: str) -> None:
    """enqueue, fetch, requeue, ack and nack move ids between the keys toolfleet reads."""
    r = broker.client
    request = _request()
    message_id = _publish(broker, request)
    queue_key, msgs_key = f"{ns}:{QUEUE}", f"{ns}:{QUEUE}.msgs"
    acks_key = f"{ns}:__acks__.{broker.broker_id}.{QUEUE}"
    # the queue list holds a lane token, the id waits on one of the account's lanes
    assert r.lrange(queue_key, 0, -1) == [TOKEN.encode()]
    assert sum(r.llen(lane) for lane in _lanes(ns)) == 1
    body = r.hget(msgs_key, message_id)
    message = Message.decode(body)
    assert message.message_id == request.id
    assert message.options == {"redis_message_id": message_id}
    assert message.queue_name == QUEUE and message.actor_name == actor_name_for(QUEUE)
    assert ToolCallRequest.decode(message.args[0]) == request

    # fetch: token and lane → this broker's acks set
    assert broker.fetch_with_ids(QUEUE, 10) == [(message_id, body)]
    assert r.llen(queue_key) == 0 and r.smembers(acks_key) == {message_id.encode()}
    assert sum(r.llen(lane) for lane in _lanes(ns)) == 0

    broker.do_requeue(QUEUE, message_id)  # requeue: acks → back on the queue list itself
    assert r.lrange(queue_key, 0, -1) == [message_id.encode()] and not r.smembers(acks_key)

    assert broker.fetch_with_ids(QUEUE, 10) == [(message_id, body)]  # a plain id is taken too
    broker.do_nack(QUEUE, message_id)  # nack: → dead-letter set, body moved
    assert r.zscore(f"{ns}:{QUEUE}.XQ", message_id) is not None
    assert r.hget(f"{ns}:{QUEUE}.XQ.msgs", message_id) == body
    assert r.hget(msgs_key, message_id) is None and not r.smembers(acks_key)

    second = _publish(broker)
    assert broker.do_qsize(QUEUE) == 1
    broker.fetch_with_ids(QUEUE, 10)
    broker.do_ack(QUEUE, second)  # ack: acks and body gone
    assert r.hget(msgs_key, second) is None and not r.smembers(acks_key)
    assert broker.do_qsize(QUEUE) == 0


def test_forced_maintenance_returns_a_dead_brokers_messages(
    broker: FleetRedisBroker, redis_url: str, ns: str
) -> None:
    """Maintenance requeues a dead broker's unacked messages and forgets it (its acks layout)."""
    r = broker.client
    dead = make_broker(redis_url, ns)
    try:
        message_id = _publish(broker)
        assert dead.fetch_with_ids(QUEUE, 10)
        dead_acks = f"{ns}:__acks__.{dead.broker_id}.{QUEUE}"
        assert r.smembers(dead_acks) == {message_id.encode()}
        record_broker_queues(r, ns, dead.broker_id, [QUEUE])  # as a worker does at start
        r.zadd(f"{ns}:__heartbeats__", {dead.broker_id: 1})  # long dead
        run_maintenance(broker, [QUEUE])
        assert r.lrange(f"{ns}:{QUEUE}", 0, -1) == [message_id.encode()]
        assert not r.exists(dead_acks)
        assert r.zscore(f"{ns}:__heartbeats__", dead.broker_id) is None
    finally:
        dead.client.close()


def test_recovery_reads_the_acks_layout(broker: FleetRedisBroker, redis_url: str, ns: str) -> None:
    """Recovery finds a dead process's acks via <ns>:brokers and requeues at the queue's head."""
    r = broker.client
    dead = make_broker(redis_url, ns)
    try:
        held = _publish(broker)
        assert dead.fetch_with_ids(QUEUE, 1)
        waiting = _publish(broker)
        r.hset(brokers_key(ns), "host:1", dead.broker_id)
        record_broker_queues(r, ns, dead.broker_id, [QUEUE])
        assert recover_dead_worker(r, ns, "host:1") == 1
        assert r.hget(f"{ns}:__broker_queues__", dead.broker_id) is None
        assert r.lrange(f"{ns}:{QUEUE}", 0, -1) == [held.encode(), TOKEN.encode()]
        fetched = [redis_id for redis_id, _ in broker.fetch_with_ids(QUEUE, 2)]
        assert fetched == [held, waiting]  # the held one first
        assert not r.exists(f"{ns}:__acks__.{dead.broker_id}.{QUEUE}")
        assert r.hget(brokers_key(ns), "host:1") is None
    finally:
        dead.client.close()


def test_the_fetcher_delivers_and_dead_letters_poison(
    broker: FleetRedisBroker, redis_url: str, ns: str
) -> None:
    """The fetcher hands out a good message, dead-letters poison, and takes no more than
    the free slots."""
    r = broker.client
    poison_id = str(uuid.uuid4())
    r.hset(f"{ns}:{QUEUE}.msgs", poison_id, b"\x00not a message")
    r.rpush(f"{ns}:{QUEUE}", poison_id)
    good = _publish(broker)
    third = _publish(broker)
    slots = Slots(1)
    inbox: SimpleQueue[Delivery | None] = SimpleQueue()
    fetcher = QueueFetcher(
        broker, QUEUE, QUEUE, slots, inbox, frozenset({actor_name_for(QUEUE)}),
        lambda: make_broker(redis_url, ns).client,
    )  # fmt: skip
    fetcher.start()
    try:
        delivery = inbox.get(timeout=10)
        assert isinstance(delivery, Delivery) and delivery.redis_id in (good, third)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and r.zscore(f"{ns}:{QUEUE}.XQ", poison_id) is None:
            time.sleep(0.05)
        assert r.zscore(f"{ns}:{QUEUE}.XQ", poison_id) is not None
        time.sleep(0.5)
        assert inbox.empty()  # one slot: nothing more is taken until it is free
        slots.give(1)
        assert inbox.get(timeout=10).redis_id in (good, third)
    finally:
        fetcher.stop()
        fetcher.join(5)


def test_script_calls_survive_a_flushed_script_cache() -> None:
    """Explicit and pipelined script calls survive a lost script cache (SCRIPT FLUSH, restart)."""
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        ns = "tfcontract"
        broker = make_broker(server.url, ns)
        r = broker.client
        publisher = Publisher(r, ns)
        publisher.publish(QUEUE, _request())
        r.script_flush()
        publisher.publish(QUEUE, _request())  # explicit EVALSHA → NOSCRIPT → reloaded
        assert broker.do_qsize(QUEUE) == 2
        r.script_flush()
        assert len(broker.fetch_with_ids(QUEUE, 1)) == 1
        r.script_flush()
        run_maintenance(broker, [QUEUE])
        size = broker.do_qsize(QUEUE)  # 2 messages, 1 of them also in the acks set
        pipe = r.pipeline(transaction=False)
        broker.scripts["dispatch"](
            keys=[ns],
            args=["qsize", int(time.time() * 1000), QUEUE, broker.broker_id,
                  broker.heartbeat_timeout, broker.dead_message_ttl, 0, broker._max_unpack_size()],
            client=pipe,
        )  # fmt: skip
        r.script_flush()
        assert pipe.execute() == [size] == [3]  # the pipeline loads missing scripts first
        r.script_flush()
        r.hset(brokers_key(ns), "host:1", broker.broker_id)
        assert recover_dead_worker(r, ns, "host:1") == 1
        server.restart()  # a restarted Redis has no scripts either
        publisher.publish(QUEUE, _request())
        assert broker.do_qsize(QUEUE) == 1
        broker.client.close()


def test_inline_ack_leaves_the_keys_as_dramatiqs_ack_does(
    broker: FleetRedisBroker, ns: str
) -> None:
    """The answer script's acknowledgement has the effect of Dramatiq's ``ack``.

    It drops the id from this broker's acks set and the body from ``.msgs``, whether the
    call is answered now or was answered already, with no dispatch call (Dramatiq's would
    write a heartbeat).
    """
    r = broker.client
    acks_key, msgs_key = f"{ns}:__acks__.{broker.broker_id}.{QUEUE}", f"{ns}:{QUEUE}.msgs"
    for answered_before in (False, True):
        request = _request()
        message_id = _publish(broker, request)
        assert [i for i, _ in broker.fetch_with_ids(QUEUE, 4)] == [message_id]
        assert r.smembers(acks_key) == {message_id.encode()}
        ack = broker.inline_ack(QUEUE, message_id)
        assert (ack.acks_key, ack.msgs_key) == (acks_key, msgs_key)
        if answered_before:
            r.set(outcome_key(ns, request.id), b"answered")
        r.zrem(f"{ns}:__heartbeats__", broker.broker_id)
        posted = post_outcome(
            r, ns, "w1", request.id, "tfcontract-replies", b"{}", 60, 60, [], 100, ack
        )
        assert posted == (Posted.ALREADY_ANSWERED if answered_before else Posted.POSTED)
        assert ack.done
        assert not r.smembers(acks_key) and r.hget(msgs_key, message_id) is None
        assert r.zscore(f"{ns}:__heartbeats__", broker.broker_id) is None
    r.delete("tfcontract-replies")


def test_settle_acks_or_dead_letters_as_dramatiq(broker: FleetRedisBroker, ns: str) -> None:
    """A call ended without an inline ack: the loop acks or nacks as Dramatiq's consumer."""
    r = broker.client
    acks_key, msgs_key = f"{ns}:__acks__.{broker.broker_id}.{QUEUE}", f"{ns}:{QUEUE}.msgs"
    acked, nacked = _publish(broker), _publish(broker)
    assert len(broker.fetch_with_ids(QUEUE, 4)) == 2
    broker.settle(QUEUE, acked)
    broker.settle(QUEUE, nacked, failed=True)
    assert not r.smembers(acks_key)
    assert r.hget(msgs_key, acked) is None and r.hget(msgs_key, nacked) is None
    assert r.zscore(f"{ns}:{QUEUE}.XQ", nacked) is not None
