"""The Redis commands a worker spends per call, counted by a private Redis (INFO commandstats)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from queue import SimpleQueue

import pytest
import redis

from conftest import Fleet
from private_redis import Server, command_counts
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared.cancels import REQUESTED, RESOLVED
from toolfleet.shared.naming import (
    actor_name_for,
    broker_heartbeats_key,
    brokers_key,
    cancel_key,
    inflight_key,
    outcome_key,
)
from toolfleet.shared.wire import Status, ToolCallRequest
from toolfleet.worker.messaging.broker import FleetRedisBroker, make_broker
from toolfleet.worker.pipeline import fetch as fetch_module
from toolfleet.worker.pipeline.fetch import Delivery, QueueFetcher, Slots
from toolfleet.worker.pipeline.ledger import INFLIGHT_TTL_S, InFlight, Ledger, Posted, post_outcome

QUEUE = "tools.commands"
NS = "tfcommands"


@pytest.fixture
def broker(counting_server: Server) -> Iterator[FleetRedisBroker]:
    """A fleet broker on the private server."""
    made = make_broker(counting_server.url, NS)
    yield made
    made.client.close()


def _request() -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()),
        function="ext_commands_tool",
        arguments={"a": 1},
        reply_to=f"{NS}:reply:test",
        deadline=now + 30,
        timeout_s=30.0,
        sent_at=now,
    )


def test_a_batch_of_bodies_is_read_with_one_hmget(broker: FleetRedisBroker) -> None:
    """One fetch of three messages reads their bodies with one HMGET and acks them with one SADD."""
    publisher = Publisher(broker.client, NS)
    for _ in range(3):
        publisher.publish(QUEUE, _request())
    broker.client.config_resetstat()
    pairs = broker.fetch_with_ids(QUEUE, 4)
    counts = command_counts(broker.client)
    assert len(pairs) == 3 and all(body is not None for _, body in pairs)
    assert counts.get("hmget") == 1
    assert "hget" not in counts
    assert counts.get("sadd") == 1
    assert broker.client.scard(f"{NS}:__acks__.{broker.broker_id}.{QUEUE}") == 3


def test_a_batch_comes_off_the_queue_list_with_one_lpop(broker: FleetRedisBroker) -> None:
    """A fetch asking for 4 of 3 queued messages pops the queue list once (LPOP with a count)."""
    for _ in range(3):
        broker.client.rpush(f"{NS}:{QUEUE}", str(uuid.uuid4()))
    broker.client.config_resetstat()
    pairs = broker.fetch_with_ids(QUEUE, 4)
    counts = command_counts(broker.client)
    assert len(pairs) == 3
    assert counts.get("lpop") == 1
    assert "zadd" not in counts  # no broker heartbeat: the periodic one writes it
    broker.client.config_resetstat()
    assert broker.fetch_with_ids(QUEUE, 4) == []  # an empty queue: one LPOP, nothing else
    assert command_counts(broker.client).get("lpop") == 1


def test_a_gone_body_is_still_fetched_as_none(broker: FleetRedisBroker) -> None:
    """A fetched id whose body is missing comes back paired with None, in queue order."""
    publisher = Publisher(broker.client, NS)
    for _ in range(2):
        publisher.publish(QUEUE, _request())
    broker.client.rpush(f"{NS}:{QUEUE}", "no-such-id")
    pairs = broker.fetch_with_ids(QUEUE, 4)
    assert [redis_id for redis_id, _ in pairs][-1] == "no-such-id"
    assert pairs[-1][1] is None and all(body is not None for _, body in pairs[:2])


def _fetcher(broker: FleetRedisBroker) -> tuple[QueueFetcher, SimpleQueue[Delivery | None]]:
    """A fetcher of the queue with 8 free slots, its wait on a connection of its own."""
    inbox: SimpleQueue[Delivery | None] = SimpleQueue()
    pool = broker.client.connection_pool
    fetcher = QueueFetcher(
        broker, QUEUE, QUEUE, Slots(8), inbox, frozenset({actor_name_for(QUEUE)}),
        lambda: redis.Redis(connection_pool=redis.ConnectionPool(**pool.connection_kwargs)),
    )  # fmt: skip
    return fetcher, inbox


def test_a_short_batch_is_followed_by_a_wait_not_a_fetch(
    broker: FleetRedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a fetch that took fewer messages than asked, the fetcher blocks rather than fetch."""
    monkeypatch.setattr(fetch_module, "WAIT_S", 1.0)
    fetcher, inbox = _fetcher(broker)
    Publisher(broker.client, NS).publish(QUEUE, _request())
    fetcher._step()
    assert isinstance(inbox.get_nowait(), Delivery)
    broker.client.config_resetstat()
    fetcher._step()  # the queue is empty: one blocking wait, timed out
    assert inbox.empty()
    counts = command_counts(broker.client)
    assert counts.get("blmove") == 1
    assert "evalsha" not in counts and "eval" not in counts
    fetcher.waiter.close()


def test_a_call_published_during_the_wait_is_fetched_next(broker: FleetRedisBroker) -> None:
    """The wait after a short batch ends on a push, and the same step fetches the pushed call."""
    fetcher, inbox = _fetcher(broker)
    publisher = Publisher(broker.client, NS)
    publisher.publish(QUEUE, _request())
    fetcher._step()
    assert isinstance(inbox.get_nowait(), Delivery)
    request = _request()
    publisher.publish(QUEUE, request)
    broker.client.config_resetstat()
    fetcher._step()  # the wait sees the non-empty queue; the fetch takes the call
    delivery = inbox.get_nowait()
    assert isinstance(delivery, Delivery)
    assert request.id in delivery.message.args[0]
    counts = command_counts(broker.client)
    assert counts.get("blmove") == 1 and counts.get("evalsha") == 1
    fetcher.waiter.close()


def test_the_finish_script_claims_the_outcome_with_one_set_nx(counting_server: Server) -> None:
    """Posting an outcome runs one SET NX, no EXISTS; a second post finds it and writes nothing."""
    client = redis.Redis.from_url(counting_server.url)
    try:
        call_id = str(uuid.uuid4())
        reply = f"{NS}:reply:{call_id}"
        client.config_resetstat()
        first = post_outcome(client, NS, "w:1", call_id, reply, b"first", 60, 60)
        counts = command_counts(client)
        assert first == Posted.POSTED
        assert counts.get("set") == 1 and "exists" not in counts
        second = post_outcome(client, NS, "w:1", call_id, reply, b"second", 60, 60)
        assert second == Posted.ALREADY_ANSWERED
        assert client.get(outcome_key(NS, call_id)) == b"first"
        assert client.lrange(reply, 0, -1) == [b"first"]
        assert 0 < client.ttl(outcome_key(NS, call_id)) <= 60
    finally:
        client.close()


def test_the_finish_script_keeps_the_resolved_marker_rule(counting_server: Server) -> None:
    """A requested cancel gets the reply; a producer-resolved call gets an outcome, no reply."""
    client = redis.Redis.from_url(counting_server.url)
    try:
        requested, resolved = str(uuid.uuid4()), str(uuid.uuid4())
        client.set(cancel_key(NS, requested), REQUESTED)
        client.set(cancel_key(NS, resolved), RESOLVED)
        for call_id, expected in (
            (requested, Posted.POSTED),
            (resolved, Posted.RESOLVED_BY_PRODUCER),
        ):
            reply = f"{NS}:reply:{call_id}"
            assert post_outcome(client, NS, "w:1", call_id, reply, b"env", 60, 60) == expected
            assert client.get(outcome_key(NS, call_id)) == b"env"
            assert client.llen(reply) == (1 if expected == Posted.POSTED else 0)
    finally:
        client.close()


def test_an_idle_fleet_keeps_its_broker_heartbeats_fresh(fleet: Fleet) -> None:
    """With no fetch writing it, each process's periodic heartbeat keeps its broker alive."""
    r = redis.Redis.from_url(fleet.redis_url)
    try:
        time.sleep(5.0)  # idle: the consumers block without fetching
        brokers = {v.decode() for v in r.hvals(brokers_key(fleet.namespace))}
        assert len(brokers) == fleet.processes
        now_ms = time.time() * 1000
        for broker_id in brokers:
            beat = r.zscore(broker_heartbeats_key(fleet.namespace), broker_id)
            # heartbeat_interval_s is 2 s by default; Dramatiq calls a broker dead after 15 s
            assert beat is not None and now_ms - beat < 10_000, (broker_id, beat)
    finally:
        r.close()


def test_a_claim_reads_outcome_and_cancel_with_one_mget_and_sets_no_ttl(
    counting_server: Server,
) -> None:
    """A claim costs one MGET (outcome, cancel marker), the SET NX and the record; no EXPIRE."""
    client = redis.Redis.from_url(counting_server.url)
    try:
        ledger = Ledger(client, NS, "w:1", reply_ttl_s=60, worker_ttl_s=10)
        request = _request()
        record = InFlight(id=request.id, function=request.function, reply_to=request.reply_to,
                          answer_by=time.time() + 30, limit_s=30)  # fmt: skip
        client.set(cancel_key(NS, request.id), REQUESTED)
        client.config_resetstat()
        claim = ledger.claim(request, QUEUE, ledger.new_token(), record)
        counts = command_counts(client)
        assert claim.acquired and claim.cancel == REQUESTED
        assert counts.get("mget") == 1 and "get" not in counts
        assert counts.get("set") == 1 and counts.get("hset") == 1
        assert "expire" not in counts
        assert client.hexists(inflight_key(NS, "w:1"), request.id)
        again = ledger.claim(request, QUEUE, ledger.new_token(), record)
        assert not again.acquired and again.owner == "w:1"
        client.set(outcome_key(NS, request.id), b"done")
        answered = ledger.claim(request, QUEUE, ledger.new_token(), record)
        assert answered.outcome == b"done" and answered.cancel == REQUESTED
    finally:
        client.delete(inflight_key(NS, "w:1"), cancel_key(NS, request.id))
        client.close()


def test_a_running_call_s_in_flight_hash_gets_its_ttl_from_the_heartbeat(
    fleet: Fleet,
) -> None:
    """While a call runs across a heartbeat, its process's in-flight hash has a TTL."""
    r = redis.Redis.from_url(fleet.redis_url)
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            future = client.submit("ext_fleet_test_sleep", {"seconds": 0.9}, timeout_s=20)
            ttls: list[int] = []
            while not future.done() and not any(ttl > 0 for ttl in ttls):
                # heartbeats come every 0.5 s in tests: at least one during the call
                workers = [w.decode() for w in r.hkeys(brokers_key(fleet.namespace))]
                keys = [inflight_key(fleet.namespace, worker) for worker in workers]
                ttls += [r.ttl(key) for key in keys if r.hlen(key)]
                time.sleep(0.02)
            assert future.result().status == Status.OK
        assert any(0 < ttl <= INFLIGHT_TTL_S for ttl in ttls), ttls
    finally:
        r.close()


def test_stop_ends_a_blocking_wait_at_once(broker: FleetRedisBroker) -> None:
    """A stopping process ends its fetcher's blocking wait with CLIENT UNBLOCK, not at its end."""
    fetcher, inbox = _fetcher(broker)
    fetcher.start()  # the queue is empty: fetch, then a wait of up to 4.5 s
    deadline = time.monotonic() + 20
    while broker.client.info("clients")["blocked_clients"] < 1:
        assert time.monotonic() < deadline, "the fetcher never blocked"
        time.sleep(0.02)
    assert fetcher.waiter.wait_s > 2.0
    started = time.monotonic()
    fetcher.stop()
    fetcher.thread.join(2.0)
    assert not fetcher.thread.is_alive(), "the wait was not ended"
    assert time.monotonic() - started < 2.0
    assert inbox.empty()
    fetcher.join(1.0)
