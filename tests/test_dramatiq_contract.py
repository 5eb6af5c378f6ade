"""The Dramatiq internals toolfleet relies on: fail loudly when an upgrade changes them.

``worker/messaging/broker.py`` subclasses ``dramatiq.brokers.redis._RedisConsumer`` and uses its
attributes; the producer, the catalog heartbeat and the supervisor's recovery drive
Dramatiq's ``dispatch.lua`` directly and read its keys. Everything here runs against a
real Redis.
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
from typing import Any

import dramatiq
import pytest
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.message import Message

from conftest import delete_namespace
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import actor_name_for, brokers_key, outcome_key
from toolfleet.shared.tenancy.lanes import TOKEN, lane_key, shard_for
from toolfleet.shared.wire import ToolCallRequest
from toolfleet.worker.messaging.broker import FleetRedisBroker, WaitingConsumer, make_broker
from toolfleet.worker.messaging.maintenance import record_broker_queues, run_maintenance
from toolfleet.worker.messaging.recovery import recover_dead_worker
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


def test_redis_consumer_internals_used_by_the_waiting_consumer(
    broker: FleetRedisBroker,
) -> None:
    """_RedisConsumer's constructor, attributes and the broker's do_* commands are as used."""
    init = list(inspect.signature(_RedisConsumer.__init__).parameters)
    assert init == ["self", "broker", "queue_name", "prefetch", "timeout"]
    consumer = broker.consume(QUEUE, prefetch=4, timeout=1000)
    assert isinstance(consumer, WaitingConsumer) and isinstance(consumer, _RedisConsumer)
    assert consumer.message_cache == []
    assert consumer.queued_message_ids == set()
    assert consumer.misses == 0
    assert consumer.prefetch == 4 and consumer.queue_name == QUEUE
    assert isinstance(inspect.getattr_static(_RedisConsumer, "outstanding_message_count"), property)
    consumer.message_cache = [b"x", b"y"]
    consumer.queued_message_ids.add("m")
    assert consumer.outstanding_message_count == 3
    consumer.message_cache = []
    for command in ("do_enqueue", "do_fetch", "do_ack", "do_nack", "do_requeue", "do_qsize"):
        assert callable(getattr(broker, command)), command
    for name in ("ack", "nack", "requeue", "close", "__next__"):
        assert callable(getattr(_RedisConsumer, name)), name
    for name in ("scripts", "heartbeat_timeout", "dead_message_ttl", "broker_id", "namespace"):
        assert hasattr(broker, name), name
    assert "dispatch" in broker.scripts
    assert isinstance(broker._max_unpack_size(), int)
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


def test_redis_consumer_reports_a_lost_connection_as_connection_closed(tmp_path: Path) -> None:
    """_RedisConsumer.ack raises ConnectionClosed on a lost Redis and forgets the message id."""
    unreachable = make_broker(f"unix://{tmp_path / 'none.sock'}", "tfcontract")
    consumer = _RedisConsumer(unreachable, QUEUE, 1, 1000)
    message = Message(queue_name=QUEUE, actor_name="a", args=(), kwargs={},
                      options={"redis_message_id": "r1"})  # fmt: skip
    consumer.queued_message_ids.add(message.message_id)
    with pytest.raises(ConnectionClosed):
        consumer.ack(MessageProxy(message))
    assert consumer.queued_message_ids == set()


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


def test_waiting_consumer_delivers_and_dead_letters_poison(
    broker: FleetRedisBroker, ns: str
) -> None:
    """The consumer hands out a good message, dead-letters poison, and waits on an empty queue."""
    r = broker.client
    dramatiq.actor(actor_name=actor_name_for(QUEUE), queue_name=QUEUE, broker=broker)(print)
    consumer = broker.consume(QUEUE, prefetch=4, timeout=1000)
    poison_id = str(uuid.uuid4())
    r.hset(f"{ns}:{QUEUE}.msgs", poison_id, b"\x00not a message")
    r.rpush(f"{ns}:{QUEUE}", poison_id)
    good = _publish(broker)
    proxy = next(consumer)
    assert isinstance(proxy, MessageProxy) and proxy.options["redis_message_id"] == good
    assert r.zscore(f"{ns}:{QUEUE}.XQ", poison_id) is not None
    started = time.monotonic()
    assert next(consumer) is None
    assert 0.5 < time.monotonic() - started < 3.0


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
    call is answered now or was answered already; then the consumer's ``ack`` (what
    Dramatiq's worker thread calls after the actor) makes no round trip of its own.
    """
    r = broker.client
    dramatiq.actor(actor_name=actor_name_for(QUEUE), queue_name=QUEUE, broker=broker)(print)
    consumer = broker.consume(QUEUE, prefetch=4, timeout=1000)
    acks_key, msgs_key = f"{ns}:__acks__.{broker.broker_id}.{QUEUE}", f"{ns}:{QUEUE}.msgs"
    for answered_before in (False, True):
        request = _request()
        message_id = _publish(broker, request)
        proxy = next(consumer)
        assert isinstance(proxy, MessageProxy) and proxy.options["redis_message_id"] == message_id
        assert r.smembers(acks_key) == {message_id.encode()}
        assert consumer.queued_message_ids == {proxy.message_id}
        ack = broker.inline_ack(proxy)
        assert ack is not None and (ack.acks_key, ack.msgs_key) == (acks_key, msgs_key)
        if answered_before:
            r.set(outcome_key(ns, request.id), b"answered")
        posted = post_outcome(
            r, ns, "w1", request.id, "tfcontract-replies", b"{}", 60, 60, [], 100, ack
        )
        assert posted == (Posted.ALREADY_ANSWERED if answered_before else Posted.POSTED)
        assert ack.done
        assert not r.smembers(acks_key) and r.hget(msgs_key, message_id) is None
        beats = r.zscore(f"{ns}:__heartbeats__", broker.broker_id)
        r.zrem(f"{ns}:__heartbeats__", broker.broker_id)
        consumer.ack(proxy)  # no dispatch call: Dramatiq's would write a heartbeat
        assert r.zscore(f"{ns}:__heartbeats__", broker.broker_id) is None
        assert consumer.queued_message_ids == set()
        r.zadd(f"{ns}:__heartbeats__", {broker.broker_id: beats or 1})
    r.delete("tfcontract-replies")


def test_an_unfinished_inline_ack_leaves_acking_to_dramatiq(
    broker: FleetRedisBroker, ns: str
) -> None:
    """An inline ack the answer script never made: the consumer acks or nacks as Dramatiq."""
    r = broker.client
    dramatiq.actor(actor_name=actor_name_for(QUEUE), queue_name=QUEUE, broker=broker)(print)
    consumer = broker.consume(QUEUE, prefetch=4, timeout=1000)
    acks_key, msgs_key = f"{ns}:__acks__.{broker.broker_id}.{QUEUE}", f"{ns}:{QUEUE}.msgs"
    acked, nacked = _publish(broker), _publish(broker)
    first, second = next(consumer), next(consumer)
    assert isinstance(first, MessageProxy) and isinstance(second, MessageProxy)
    assert broker.inline_ack(first) is not None and broker.inline_ack(second) is not None
    consumer.ack(first)
    consumer.nack(second)
    assert not r.smembers(acks_key)
    assert r.hget(msgs_key, acked) is None and r.hget(msgs_key, nacked) is None
    assert r.zscore(f"{ns}:{QUEUE}.XQ", nacked) is not None
    assert broker.take_inline_ack(first) is None and broker.take_inline_ack(second) is None


def test_worker_thread_acks_through_the_consumer_with_the_current_message(
    broker: FleetRedisBroker, ns: str
) -> None:
    """Dramatiq's worker: the actor sees its MessageProxy as CurrentMessage; then consumer.ack.

    The inline ack relies on both: the actor body reads the message being handled from
    ``CurrentMessage`` and the worker thread settles it through the consumer's
    ``ack``/``nack`` afterwards (``ConsumerThread.post_process_message``).
    """
    from dramatiq import Worker
    from dramatiq.middleware import CurrentMessage

    seen: list[Any] = []

    def body(raw: Any) -> None:
        current = CurrentMessage.get_current_message()
        ack = broker.inline_ack(current) if current is not None else None
        seen.append((current, ack))

    dramatiq.actor(actor_name=actor_name_for(QUEUE), queue_name=QUEUE, broker=broker)(body)
    message_id = _publish(broker)
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and broker.client.hget(f"{ns}:{QUEUE}.msgs", message_id):
            time.sleep(0.05)
    finally:
        worker.stop()
    assert len(seen) == 1
    current, ack = seen[0]
    assert isinstance(current, MessageProxy) and current.options["redis_message_id"] == message_id
    assert ack is not None and not ack.done
    assert broker.client.hget(f"{ns}:{QUEUE}.msgs", message_id) is None  # acked by Dramatiq
    assert broker.take_inline_ack(current) is None  # the consumer's ack took it
