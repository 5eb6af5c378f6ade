"""Breakers, the ops page and catalog recovery on a real Redis Cluster.

One 3-master loopback cluster for the module: the test tools' group and the limit-test
tools' group each on its own master, and the fleet-wide slot (catalog, epoch, heartbeats)
on the third, so that one master can lose the fleet's data and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import redis.cluster
from private_cluster import Cluster, Group, start_cluster, start_group, stop_groups, wait_live
from tenancy_tools import FLAKY_COOLDOWN_S, record_key, wait_out_the_cooldown
from ui_support import UiProcess, csrf_of, start_ui

from conftest import TEST_QUEUE, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import encode_message
from toolfleet.shared.naming import (
    broker_heartbeats_key,
    catalog_key,
    catalog_recovering_key,
    dead_letters_key,
    fleet_namespace,
    group_namespace,
    limits_key,
    reply_key,
    switches_key,
)
from toolfleet.shared.tenancy.breakers import breaker_key
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, new_call_id

ADD = "ext_fleet_test_add"
FLAKY = "ext_tenancy_test_flaky"
LIMITED = "ext_tenancy_test_limited"
NOBODY = "ext_nobody_serves_this"
#: The queue of the limit-test tools (their extension's slug, ``tenancy-test``).
TENANCY_QUEUE = "tools.tenancy-test"
#: The workers' TTL, seconds: also the recovery window's length, long enough for a new
#: producer process (``toolfleet call``) to start within it.
WORKER_TTL_S = 10.0
ENV = {"TOOLFLEET_WORKER_TTL_S": str(WORKER_TTL_S)}


@dataclass
class LimitsFleet:
    """The cluster, the namespace, the two groups and the master of the fleet-wide slot."""

    cluster: Cluster
    namespace: str
    test_group: Group
    tenancy_group: Group
    fleet_port: int

    @property
    def url(self) -> str:
        """The fleet's ``redis+cluster://`` URL."""
        return self.cluster.url

    @property
    def fleet(self) -> str:
        """The prefix of the fleet-wide keys (``<ns>:{fleet}``)."""
        return fleet_namespace(self.namespace, cluster=True)

    def prefix(self, group: Group) -> str:
        """The prefix of ``group``'s keys (``<ns>:{g.<group>}``)."""
        return group_namespace(self.namespace, group.name, cluster=True)


def _groups_off_the_fleet_master(cluster: Cluster, ns: str) -> tuple[str, str, int]:
    """Two group names on two masters, neither the fleet slot's; and that master's port."""
    fleet_port = cluster.master_of(catalog_key(fleet_namespace(ns, cluster=True)))
    names: dict[int, str] = {}
    for i in range(200):
        name = f"lim{i}"
        port = cluster.master_of(group_namespace(ns, name, cluster=True))
        if port != fleet_port:
            names.setdefault(port, name)
        if len(names) == 2:
            first, second = sorted(names.values())
            return first, second, fleet_port
    raise AssertionError("no two group names on the two masters without the fleet slot")


@pytest.fixture(scope="module")
def lfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimitsFleet]:
    """A 3-master cluster: the test tools' group, the limit-test tools' group, the fleet slot,
    each on its own master. Everything is stopped on exit: workers, then every server."""
    folder = tmp_path_factory.mktemp("climits")
    cluster = start_cluster(folder, masters=3)
    groups: list[Group] = []
    try:
        ns = f"tfl-{uuid.uuid4().hex[:6]}"
        first, second, fleet_port = _groups_off_the_fleet_master(cluster, ns)
        groups = [
            start_group(cluster, ns, first, TEST_QUEUE, folder, ENV),
            start_group(cluster, ns, second, TENANCY_QUEUE, folder, ENV, threads=4,
                        extension="tenancy_tools:extension"),
        ]  # fmt: skip
        client = cluster.client()
        try:
            wait_live(client, ns, groups)
        finally:
            client.close()
        yield LimitsFleet(cluster, ns, groups[0], groups[1], fleet_port)
    finally:
        stop_groups(groups)
        cluster.stop()


@pytest.fixture
def rc(lfleet: LimitsFleet) -> Iterator[redis.cluster.RedisCluster]:
    client = lfleet.cluster.client()
    yield client
    client.close()


@pytest.fixture
def tc(lfleet: LimitsFleet) -> Iterator[ToolClient]:
    with ToolClient(lfleet.url, namespace=lfleet.namespace) as client:
        yield client


def _eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_a_failing_tool_opens_its_breaker_in_its_groups_slot_then_a_probe_closes_it(
    lfleet: LimitsFleet, rc: redis.cluster.RedisCluster, tc: ToolClient
) -> None:
    """5 crashes in a row open FLAKY's breaker, a hash on its group's master; the next call
    is refused unrun with a retry_after_s within the cool-down; after it a probe's success
    closes the breaker."""
    ns, prefix = lfleet.namespace, lfleet.prefix(lfleet.tenancy_group)
    runs_key, fail_key = record_key(ns, "flaky_runs"), record_key(ns, "flaky_fail")
    key = breaker_key(prefix, FLAKY)
    rc.delete(runs_key, key)
    rc.set(fail_key, 1)
    # Given 5 failures in a row
    for _ in range(5):
        assert tc.call(FLAKY, {"seconds": 0.0}).status is Status.CRASHED
    # Then the breaker is open, in the group's slot, on the group's master
    assert rc.hget(key, "state") == b"open"
    home = lfleet.cluster.master_of(key)
    assert home == lfleet.cluster.master_of(broker_heartbeats_key(prefix))
    assert home != lfleet.fleet_port
    node = redis.Redis(port=home)  # a plain client: the hash must be on this very node
    try:
        assert node.hget(key, "state") == b"open"
    finally:
        node.close()
    # And the next call is answered at once, without running
    refused = tc.call(FLAKY, {"seconds": 0.0})
    assert refused.status is Status.NOT_AVAILABLE, refused
    assert 0 < refused.content["retry_after_s"] <= FLAKY_COOLDOWN_S
    assert "temporarily unavailable" in refused.content["error"]
    assert not refused.run_s
    assert int(rc.get(runs_key)) == 5  # type: ignore[arg-type]
    # When the cool-down passes and the backend is back, a probe runs and succeeds
    rc.delete(fail_key)
    wait_out_the_cooldown(rc, key)
    probe = tc.call(FLAKY, {"seconds": 0.0})
    assert probe.status is Status.OK, probe
    # Then the breaker is closed and calls run again
    assert rc.hget(key, "state") == b"closed"
    assert tc.call(FLAKY, {"seconds": 0.0}).status is Status.OK
    assert int(rc.get(runs_key)) == 7  # type: ignore[arg-type]


def _group_pids(group: Group) -> list[int]:
    """The supervisor of ``group`` and its worker processes."""
    out = subprocess.run(["pgrep", "-P", str(group.process.pid)], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return [group.process.pid, *(int(p) for p in out.stdout.split())]


def _page(url: str) -> str:
    """The HTML ``GET url`` answers (200)."""
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (a loopback URL)
        assert answer.status == 200, url
        return str(answer.read().decode())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _post(url: str, form: dict[str, str]) -> int:
    """The status ``POST url`` with ``form`` answers (a redirect is not followed)."""
    data = urllib.parse.urlencode(form).encode()
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=data, method="POST"), timeout=10) as ok:
            return int(ok.status)
    except urllib.error.HTTPError as answered:
        return int(answered.code)


def _cell(html: str, function: str, column: str) -> int | None:
    """The number in ``column`` (``total`` or a status) of ``function``'s overview row."""
    row = re.search(rf'<tr data-tool="{re.escape(function)}">(.*?)</tr>', html, re.S)
    if row is None:
        return None
    attribute = "data-total" if column == "total" else f'data-status="{column}"'
    cell = re.search(rf"<td class=\"n\" {attribute}>(\d+)</td>", row.group(1))
    return None if cell is None else int(cell.group(1))


def _live_workers(html: str, queue: str) -> int | None:
    """The live workers the overview shows for ``queue`` (None: no row)."""
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', html, re.S)
    if row is None:
        return None
    return int(re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))[-1])


@pytest.fixture(scope="module")
def ops(lfleet: LimitsFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiProcess]:
    """``toolfleet ui --redis-url redis+cluster://... --no-auth`` on loopback (an operator)."""
    folder = tmp_path_factory.mktemp("cui")
    started = start_ui(lfleet.url, lfleet.namespace, folder, "--redis-url", lfleet.url,
                       "--no-auth", "--interval", "0.5")  # fmt: skip
    yield started
    started.stop()


def test_the_ops_page_on_a_cluster_url_shows_both_groups_and_flips_a_switch(
    lfleet: LimitsFleet, rc: redis.cluster.RedisCluster, tc: ToolClient, ops: UiProcess
) -> None:
    """``toolfleet ui`` on a cluster URL shows both groups' queues, tools, calls by status
    and worker processes; an operator's switch through the page refuses the next call, in
    the producer and in the group's copy the worker reads."""
    try:
        assert [tc.call(ADD, {"a": i, "b": 1}).content for i in range(3)] == [1, 2, 3]
        assert tc.call(ADD, {"a": "x", "b": 1}).status is Status.INVALID_ARGUMENTS
        assert [tc.call(LIMITED, {"seconds": 0.0}).status for _ in range(2)] == [Status.OK] * 2

        def counted() -> bool:
            html = _page(ops.url + "/")
            return (
                _cell(html, ADD, "ok") == 3
                and _cell(html, ADD, "invalid_arguments") == 1
                and _cell(html, LIMITED, "ok") == 2
            )

        _eventually(counted, 20, "the overview counts both groups' calls")
        overview = _page(ops.url + "/")
        assert _live_workers(overview, TEST_QUEUE) == 1, overview
        assert _live_workers(overview, TENANCY_QUEUE) == 1, overview
        workers = _page(ops.url + "/workers")
        for group in (lfleet.test_group, lfleet.tenancy_group):
            pid = _group_pids(group)[1]
            assert re.search(rf'<tr data-worker="[^"]*:{pid}"', workers), (group.name, workers)
        # When an operator turns ADD off through the page
        page = _page(ops.url + "/switches")
        assert f'data-switch="{ADD}"' in page and f'data-switch="{LIMITED}"' in page
        form = {"name": ADD, "state": "off", "csrf": csrf_of(page)}
        assert _post(ops.url + "/switches", form) == 303
        # Then the next call is refused, and the group's copy (the worker's) says off too
        refused = tc.call(ADD, {"a": 1, "b": 1})
        assert refused.status is Status.NOT_AVAILABLE, refused
        assert rc.hget(switches_key(lfleet.prefix(lfleet.test_group)), ADD) == b"off"
        assert tc.call(LIMITED, {"seconds": 0.0}).status is Status.OK  # the other group's
        assert _post(ops.url + "/switches", {**form, "state": "on"}) == 303
        assert tc.call(ADD, {"a": 1, "b": 1}).content == 2
    finally:
        groups = (lfleet.test_group, lfleet.tenancy_group)
        for prefix in (lfleet.fleet, *(lfleet.prefix(g) for g in groups)):
            rc.hdel(switches_key(prefix), ADD)


def test_a_dead_letter_in_a_groups_slot_is_listed_and_retried_through_the_page(
    lfleet: LimitsFleet, rc: redis.cluster.RedisCluster, ops: UiProcess
) -> None:
    """A dead letter of the limit-test queue (in its group's slot) is on the failures page;
    retrying it there runs it again as a new call, answered on the original reply list,
    whose outcome the page finds by its id."""
    prefix = lfleet.prefix(lfleet.tenancy_group)
    reply_to = reply_key(prefix, f"ghost-{uuid.uuid4().hex[:6]}")
    now = time.time()
    request = ToolCallRequest(id=new_call_id(), function=LIMITED, arguments={"seconds": 0.0},
                              reply_to=reply_to, deadline=now - 1, timeout_s=20.0,
                              sent_at=now - 21)  # fmt: skip
    redis_id, body = encode_message(TENANCY_QUEUE, request, redis_message_id=request.id)
    dead = dead_letters_key(prefix, TENANCY_QUEUE)
    rc.hset(dead + ".msgs", redis_id, body)
    rc.zadd(dead, {redis_id: int(now * 1000)})
    _eventually(lambda: f'data-dead="{redis_id}"' in _page(ops.url + "/failures"), 10,
                "the dead letter is listed")  # fmt: skip
    page = _page(ops.url + "/failures")
    form = {"queue": TENANCY_QUEUE, "id": redis_id, "csrf": csrf_of(page)}
    assert _post(ops.url + "/dead-letters/retry", form) == 303
    assert rc.zscore(dead, redis_id) is None and not rc.hexists(dead + ".msgs", redis_id)
    popped = rc.blpop([reply_to], timeout=15)
    assert popped is not None, "no reply on the original reply list"
    result = ReplyEnvelope.decode(popped[1]).result
    assert result is not None and result.status is Status.OK, result
    assert result.id != request.id and result.function == LIMITED
    rc.delete(reply_to)
    # And the new call's outcome, in its group's slot, is found by its id on the page
    found = _page(ops.url + "/failures?" + urllib.parse.urlencode({"q": result.id}))
    assert "<strong data-lookup-status>ok</strong>" in found, found


def _status_of_a_fresh_producer(lfleet: LimitsFleet, function: str) -> str:
    """The status ``toolfleet call`` answers (a new process: it has seen no catalog)."""
    env = {**os.environ, "TOOLFLEET_REDIS_URL": lfleet.url, "TOOLFLEET_NAMESPACE": lfleet.namespace}
    argv = [toolfleet_command(), "call", function, "{}", "--timeout", "5"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return str(json.loads(out.stdout)["status"])


def test_the_catalog_is_republished_after_the_fleet_slots_master_lost_its_data(
    lfleet: LimitsFleet, rc: redis.cluster.RedisCluster
) -> None:
    """FLUSHALL on the master of the fleet-wide slot while the limit-test group is frozen:
    once the test group's worker beats, the recovery window is open; a tool the producer
    saw and nobody republished yet is not_available ("republished"), also to a new producer
    process, a name never served is unknown_function, the republished group's tool is ok;
    when the frozen group runs again its tool is ok too."""
    ns, fleet = lfleet.namespace, lfleet.fleet
    rc.delete(record_key(ns, "flaky_fail"))
    with ToolClient(lfleet.url, namespace=ns) as client:  # this process sees both tools
        assert client.call(ADD, {"a": 1, "b": 2}).content == 3
        assert client.call(FLAKY, {"seconds": 0.0}).status is Status.OK
    assert rc.exists(catalog_key(fleet))
    # Given the limit-test group frozen, so that it cannot republish
    frozen = _group_pids(lfleet.tenancy_group)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        # When the master of the fleet-wide slot loses its data
        node = redis.Redis(port=lfleet.fleet_port)
        try:
            node.flushall()
            assert not node.exists(catalog_key(fleet))
        finally:
            node.close()
        # Then the test group's next heartbeat republishes its tools and opens the window
        _eventually(lambda: bool(rc.hexists(catalog_key(fleet), ADD)), 10, "add republished")
        assert rc.exists(catalog_recovering_key(fleet)), "no recovery window after the loss"
        assert not rc.hexists(catalog_key(fleet), FLAKY)
        with ToolClient(lfleet.url, namespace=ns) as client:  # a fresh snapshot, same process
            missing = client.call(FLAKY, {"seconds": 0.0}, timeout_s=5)
            assert missing.status is Status.NOT_AVAILABLE, missing
            assert "republished" in missing.content["error"]
            assert client.call(NOBODY, {}).status is Status.UNKNOWN_FUNCTION
            assert client.call(ADD, {"a": 2, "b": 2}).content == 4
        assert _status_of_a_fresh_producer(lfleet, FLAKY) == "not_available"
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    # And once the frozen group beats again, its tool is served again
    with ToolClient(lfleet.url, namespace=ns) as client:
        _eventually(lambda: client.call(FLAKY, {"seconds": 0.0}).ok, 15, "flaky is back")
        assert client.call(NOBODY, {}).status is Status.UNKNOWN_FUNCTION


def _limits(lfleet: LimitsFleet, *args: str) -> None:
    env = {**os.environ, "TOOLFLEET_REDIS_URL": lfleet.url, "TOOLFLEET_NAMESPACE": lfleet.namespace}
    done = subprocess.run([toolfleet_command(), "limits", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_groups_master_that_lost_its_data_gets_its_quotas_back(
    lfleet: LimitsFleet, rc: redis.cluster.RedisCluster
) -> None:
    """FLUSHALL on the test group's master: within a few heartbeats its worker writes the
    fleet's quotas into the group's copy again, and an account over its quota is refused
    again (its usage went with the data: one call passes first)."""
    prefix = lfleet.prefix(lfleet.test_group)
    scope = f"acme-{uuid.uuid4().hex[:6]}/{ADD}"
    context = {"account": scope.split("/")[0]}
    _limits(lfleet, "set", scope, "--per-s", "0.01", "--burst", "1")
    try:
        with ToolClient(lfleet.url, namespace=lfleet.namespace) as client:
            assert client.call(ADD, {"a": 1, "b": 1}, context=context).content == 2
            refused = client.call(ADD, {"a": 1, "b": 1}, context=context)
            assert refused.status is Status.REJECTED, refused
        # When the group's master loses its data (its copy of the quotas with it)
        node = redis.Redis(port=lfleet.cluster.master_of(limits_key(prefix)))
        try:
            assert node.hexists(limits_key(prefix), scope)  # the copy is on that very node
            node.flushall()
        finally:
            node.close()
        # Then its worker copies the fleet's again (every 5th heartbeat: 2.5 s here)
        _eventually(lambda: bool(rc.hexists(limits_key(prefix), scope)), 30, "quotas copied")
        with ToolClient(lfleet.url, namespace=lfleet.namespace) as client:
            first = client.call(ADD, {"a": 2, "b": 2}, context=context, timeout_s=30)
            second = client.call(ADD, {"a": 2, "b": 2}, context=context, timeout_s=30)
        assert (first.status, first.content) == (Status.OK, 4), first
        assert second.status is Status.REJECTED, second
    finally:
        _limits(lfleet, "delete", scope)
