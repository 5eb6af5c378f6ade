"""toolfleet's Dramatiq maintenance: dead brokers' messages back, old dead letters gone, no KEYS.

Real Redis (the session's, a private one for command counts, a private cluster), real
brokers: a dead broker is one that fetched messages and whose heartbeat is older than the
timeout, as one killed mid-batch leaves them; a plain Dramatiq ``RedisBroker`` stands for
a worker that wrote no record of its queues.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.message import Message
from private_cluster import start_cluster

from conftest import TEST_QUEUE, delete_namespace, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status
from toolfleet.shared.naming import (
    acks_key,
    broker_heartbeats_key,
    broker_queues_key,
    dead_letters_key,
    queue_key,
    queue_msgs_key,
)
from toolfleet.shared.wire import ToolCallRequest
from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis
from toolfleet.worker.messaging.broker import FleetRedisBroker, make_broker
from toolfleet.worker.messaging.maintenance import (
    DEAD_LETTER_BATCH,
    consumed_queues,
    record_broker_queues,
    run_maintenance,
)

SERVED = "tools.maint-a"
OTHER = "tools.maint-b"
UNSERVED = "tools.maint-c"


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    """A namespace of its own, deleted afterwards."""
    namespace = f"tfmaint-{uuid.uuid4().hex[:8]}"
    yield namespace
    delete_namespace(redis_url, namespace)


@pytest.fixture
def broker(redis_url: str, ns: str) -> Iterator[FleetRedisBroker]:
    """The maintaining worker's broker."""
    made = make_broker(redis_url, ns)
    yield made
    made.client.close()


def _request() -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()), function="ext_maint_tool", arguments={}, reply_to="nowhere",
        deadline=now + 30, timeout_s=30.0, sent_at=now,
    )  # fmt: skip


def _publish(client: redis.Redis, namespace: str, queue: str, count: int = 1) -> None:
    publisher = Publisher(client, namespace)
    for _ in range(count):
        publisher.publish(queue, _request())


def _enqueue(broker: RedisBroker, queue: str, count: int = 1) -> None:
    """Enqueue with Dramatiq's own ``enqueue`` (plain ids on the queue list, no lanes)."""
    for _ in range(count):
        broker.enqueue(Message(queue_name=queue, actor_name="a", args=(), kwargs={}, options={}))


def _fetch(dead: RedisBroker, queue: str, count: int) -> list[str]:
    """Fetch ``count`` messages of ``queue`` as the dead broker did before it died."""
    if isinstance(dead, FleetRedisBroker):
        return [redis_id for redis_id, _ in dead.fetch_with_ids(queue, count)]
    bodies = dead.do_fetch(queue, count)  # Dramatiq's own fetch
    return [Message.decode(body).options["redis_message_id"] for body in bodies]


def _kill(dead: RedisBroker) -> None:
    """Make ``dead``'s heartbeat older than any timeout (it fetched, then stopped beating)."""
    dead.client.zadd(broker_heartbeats_key(dead.namespace), {dead.broker_id: 1})


def _ids(client: redis.Redis, key: str) -> list[str]:
    return [raw.decode() for raw in client.lrange(key, 0, -1)]


def test_consumed_queues_add_the_delay_queues() -> None:
    assert consumed_queues(["b", "a", "a.DQ"]) == ["a", "a.DQ", "b", "b.DQ"]


def test_the_broker_never_runs_dramatiqs_maintenance(broker: FleetRedisBroker) -> None:
    """make_broker's broker: maintenance_chance 0, and no dispatch command ever asks for it."""
    assert broker.maintenance_chance == 0
    broker.maintenance_chance = 1_000_000  # even when told to, it does not
    assert {broker._should_do_maintenance(c) for c in ("fetch", "enqueue", "requeue")} == {0}


def test_a_recorded_dead_broker_is_requeued_on_every_queue_and_forgotten(
    broker: FleetRedisBroker, redis_url: str, ns: str
) -> None:
    """A dead broker's unacked messages of two queues go back (at the head); its heartbeat
    and record go once no acks set is left, though the maintainer serves one of the queues."""
    r = broker.client
    dead = make_broker(redis_url, ns)
    try:
        record_broker_queues(r, ns, dead.broker_id, [SERVED, OTHER])
        _publish(r, ns, SERVED, 2)
        _publish(r, ns, OTHER, 3)
        held_a, held_b = _fetch(dead, SERVED, 2), _fetch(dead, OTHER, 3)
        _publish(r, ns, SERVED)  # published after the dead broker fetched
        _kill(dead)
        done = run_maintenance(broker, [SERVED])
        assert (done.dead_brokers, done.requeued, done.forgotten) == (1, 5, 1)
        # at the head, in the order of the acks set (which Redis < 7.2 does not keep)
        assert sorted(_ids(r, queue_key(ns, SERVED))[:2]) == sorted(held_a)
        assert sorted(_ids(r, queue_key(ns, OTHER))) == sorted(held_b)
        assert not r.exists(*(acks_key(ns, dead.broker_id, q) for q in (SERVED, OTHER)))
        assert r.zscore(broker_heartbeats_key(ns), dead.broker_id) is None
        assert r.hget(broker_queues_key(ns), dead.broker_id) is None
        fetched = [i for i, _ in broker.fetch_with_ids(SERVED, 3)]
        assert sorted(fetched[:2]) == sorted(held_a) and len(fetched) == 3
        assert run_maintenance(broker, [SERVED]).dead_brokers == 0
    finally:
        dead.client.close()


def test_a_live_broker_and_the_maintainer_itself_are_left_alone(
    broker: FleetRedisBroker, redis_url: str, ns: str
) -> None:
    r = broker.client
    live = make_broker(redis_url, ns)
    try:
        record_broker_queues(r, ns, live.broker_id, [SERVED])
        _publish(r, ns, SERVED)
        held = _fetch(live, SERVED, 1)
        now_ms = int(time.time() * 1000)
        r.zadd(broker_heartbeats_key(ns), {live.broker_id: now_ms, broker.broker_id: 1})
        assert run_maintenance(broker, [SERVED], now_ms=now_ms).requeued == 0
        assert r.smembers(acks_key(ns, live.broker_id, SERVED)) == {held[0].encode()}
        assert r.zscore(broker_heartbeats_key(ns), broker.broker_id) == 1
    finally:
        live.client.close()


def test_an_unrecorded_plain_dramatiq_broker_loses_nothing(
    broker: FleetRedisBroker, redis_url: str, ns: str
) -> None:
    """A plain Dramatiq broker writes no record: its acks set of a served queue goes back;
    its set of a queue the maintainer does not serve stays, with its heartbeat, until a
    worker serving that queue runs maintenance; the heartbeat stays even then (unsure)."""
    r = broker.client
    plain = RedisBroker(client=redis.Redis.from_url(redis_url), namespace=ns, maintenance_chance=0)
    other = make_broker(redis_url, ns)
    try:
        _enqueue(plain, SERVED)  # Dramatiq's own enqueue and fetch: the same key layout
        _enqueue(plain, UNSERVED, 2)
        held_a, held_c = _fetch(plain, SERVED, 1), _fetch(plain, UNSERVED, 2)
        assert r.scard(acks_key(ns, plain.broker_id, UNSERVED)) == 2
        _kill(plain)
        done = run_maintenance(broker, [SERVED])
        assert (done.requeued, done.forgotten) == (1, 0)
        assert _ids(r, queue_key(ns, SERVED)) == held_a
        assert r.smembers(acks_key(ns, plain.broker_id, UNSERVED)) == {i.encode() for i in held_c}
        assert r.zscore(broker_heartbeats_key(ns), plain.broker_id) == 1
        done = run_maintenance(other, [UNSERVED])  # a worker serving the other queue
        assert (done.requeued, done.forgotten) == (2, 0)
        assert sorted(_ids(r, queue_key(ns, UNSERVED))) == sorted(held_c)
        assert not r.exists(acks_key(ns, plain.broker_id, UNSERVED))
        assert r.zscore(broker_heartbeats_key(ns), plain.broker_id) == 1
    finally:
        plain.client.close()
        other.client.close()


def test_dead_letters_older_than_the_ttl_are_dropped_newer_kept(
    broker: FleetRedisBroker, ns: str
) -> None:
    """More old letters than one batch, on a queue and its delay queue's shared .XQ."""
    r = broker.client
    broker.dead_message_ttl = 60_000
    now_ms = int(time.time() * 1000)
    letters, bodies = dead_letters_key(ns, SERVED), queue_msgs_key(ns, f"{SERVED}.XQ")
    old = [f"old-{i}" for i in range(DEAD_LETTER_BATCH * 2 + 7)]
    new = [f"new-{i}" for i in range(5)]
    r.zadd(letters, {i: now_ms - 60_001 - n for n, i in enumerate(old)})
    r.zadd(letters, {i: now_ms - 59_000 for i in new})
    r.hset(bodies, mapping={i: b"body" for i in old + new})
    done = run_maintenance(broker, [f"{SERVED}.DQ"], now_ms=now_ms)
    assert done.expired == len(old)
    assert sorted(m.decode() for m in r.zrange(letters, 0, -1)) == sorted(new)
    assert sorted(m.decode() for m in r.hkeys(bodies)) == sorted(new)


def _command_calls(client: redis.Redis, *names: str) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)


def test_maintenance_sends_no_keys_or_scan() -> None:
    """On a private Redis with dead brokers, recorded or not: no KEYS, no SCAN in a pass.

    The same setup under Dramatiq's forced maintenance counts a KEYS call (the measure
    sees one when there is one)."""
    with EmbeddedRedis() as server:
        ns = "tfmaint"
        broker = make_broker(server.url, ns)
        dead = make_broker(server.url, ns)
        plain = RedisBroker(client=redis.Redis.from_url(server.url), namespace=ns)
        r = broker.client
        try:
            record_broker_queues(r, ns, dead.broker_id, [SERVED])
            _publish(r, ns, SERVED, 3)
            _fetch(dead, SERVED, 2)
            r.zadd(broker_heartbeats_key(ns), {plain.broker_id: 1})
            _kill(dead)
            r.zadd(dead_letters_key(ns, SERVED), {"x": 1})
            r.config_resetstat()
            done = run_maintenance(broker, [SERVED])
            assert (done.dead_brokers, done.requeued, done.expired) == (2, 2, 1)
            broker.do_requeue(SERVED, "nothing")  # Dramatiq's dispatch: no maintenance either
            broker.do_fetch(f"{SERVED}.DQ", 1)
            assert _command_calls(r, "keys", "scan") == 0
            broker.scripts["dispatch"](
                keys=[ns],
                args=["qsize", int(time.time() * 1000), SERVED, broker.broker_id,
                      broker.heartbeat_timeout, broker.dead_message_ttl, 1,
                      broker._max_unpack_size()],
            )  # fmt: skip
            assert _command_calls(r, "keys") >= 1
        finally:
            for made in (broker, dead, plain):
                made.client.close()


def test_maintenance_on_a_cluster_group_namespace(tmp_path: Path) -> None:
    """On a Redis Cluster every key of a pass is in the group's slot and declared: a dead
    broker of the group is requeued and forgotten, its dead letters expired."""
    cluster = start_cluster(tmp_path)
    try:
        broker = make_broker(cluster.url, "tfmaint", group="alpha")
        dead = make_broker(cluster.url, "tfmaint", group="alpha")
        ns = broker.namespace
        assert ns == "tfmaint:{g.alpha}"
        r = broker.client
        record_broker_queues(r, ns, dead.broker_id, [SERVED, OTHER])
        _enqueue(broker, SERVED, 2)
        _enqueue(broker, OTHER, 1)
        held = _fetch(dead, SERVED, 2) + _fetch(dead, OTHER, 1)
        _kill(dead)
        broker.dead_message_ttl = 1000
        r.zadd(dead_letters_key(ns, SERVED), {"old": 1, "new": int(time.time() * 1000)})
        r.hset(queue_msgs_key(ns, f"{SERVED}.XQ"), mapping={"old": b"b", "new": b"b"})
        done = run_maintenance(broker, [SERVED])
        assert (done.requeued, done.forgotten, done.expired) == (3, 1, 1)
        back = _ids(r, queue_key(ns, SERVED)) + _ids(r, queue_key(ns, OTHER))
        assert set(held) <= set(back)
        assert r.zscore(broker_heartbeats_key(ns), dead.broker_id) is None
        assert r.zrange(dead_letters_key(ns, SERVED), 0, -1) == [b"new"]
        broker.client.close()
        dead.client.close()
    finally:
        cluster.stop()


def test_a_running_fleet_answers_the_calls_a_dead_broker_held(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Real worker processes: calls fetched by a broker that then died (heartbeat stale,
    record written as a worker writes it) are requeued by the fleet's maintenance and
    answered, and the dead broker is forgotten. The fleet is paused (SIGSTOP) while the
    doomed broker takes the calls, so that it takes them all."""
    ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(redis_url)
    dead = make_broker(redis_url, ns)
    record_broker_queues(r, ns, dead.broker_id, [TEST_QUEUE])
    env = {"TOOLFLEET_HEARTBEAT_INTERVAL_S": "0.2", "TOOLFLEET_BROKER_HEARTBEAT_TIMEOUT_S": "2"}
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1, env=env)
    pids = fleet.worker_pids()
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            futures = [client.submit("ext_fleet_test_add", {"a": i, "b": 1}) for i in range(3)]
            held: list[str] = []
            deadline = time.monotonic() + 30  # the client's publisher thread sends them
            while len(held) < 3 and time.monotonic() < deadline:
                held += [i for i, _ in dead.fetch_with_ids(TEST_QUEUE, 3 - len(held))]
                time.sleep(0.01)  # leave the GIL to that thread on a loaded machine
            assert len(held) == 3, (held, [f.result(timeout=0) for f in futures if f.done()])
            _kill(dead)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            results = [future.result(timeout=30) for future in futures]
            assert [res.status for res in results] == [Status.OK] * 3
            assert [res.content for res in results] == [1, 2, 3]
            deadline = time.monotonic() + 10
            while r.zscore(broker_heartbeats_key(ns), dead.broker_id) is not None:
                assert time.monotonic() < deadline, "the dead broker's heartbeat stayed"
                time.sleep(0.1)
            assert r.hget(broker_queues_key(ns), dead.broker_id) is None
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        fleet.stop()
        dead.client.close()
        r.close()
        delete_namespace(redis_url, ns)
