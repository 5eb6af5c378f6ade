"""A private Redis Cluster for tests: ``redis-server --cluster-enabled yes`` on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.cluster

from conftest import TEST_QUEUE, TESTS, toolfleet_command, unavailable
from private_redis import Server, free_port, start_server
from toolfleet.shared.naming import fleet_namespace, group_namespace, workers_key

#: A model the cluster fleet counts by name in its quality aggregates: calls that carry it
#: (``context.llmclient``) are told apart from every other test's, which count as ``other``.
QUALITY_MODEL = "test/quality-on-a-cluster"

#: The queue of the BFCL tools (the second group's).
BFCL_QUEUE = "tools.bfcl"


@dataclass
class Cluster:
    """``masters`` (+ ``replicas`` per master) redis-server processes joined into one cluster."""

    servers: list[Server]
    ports: list[int]
    folder: Path
    masters: int
    stopped: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis+cluster://`` naming every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self) -> redis.cluster.RedisCluster:
        """A fresh cluster client (the caller closes it)."""
        live = [s for s in self.servers if s.process.poll() is None]
        nodes = [redis.cluster.ClusterNode("127.0.0.1", int(s.url.rsplit(":", 1)[1])) for s in live]
        return redis.cluster.RedisCluster(startup_nodes=nodes)

    def master_of(self, key: str) -> int:
        """The port of the master that serves ``key``'s slot."""
        client = self.client()
        try:
            node = client.get_node_from_key(key)
            return int(node.port)
        finally:
            client.close()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _replicas_synced(ports: list[int], masters: int) -> bool:
    """Every node past the masters is a replica whose link to its master is up.

    A replica that never synced refuses to fail over (``cluster-replica-validity-factor``).
    """
    replicas = 0
    for port in ports:
        info = redis.Redis(port=port).info("replication")
        if info.get("role") == "slave":
            if info.get("master_link_status") != "up":
                return False
            replicas += 1
    return replicas == len(ports) - masters


def start_cluster(folder: Path, *, masters: int = 3, replicas: int = 0) -> Cluster:
    """Start and join a cluster; wait until every slot is served (``cluster_state:ok``)."""
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if not cli:
        unavailable("redis-cli is not on PATH")
    count = masters * (1 + replicas)
    ports = [free_port() for _ in range(count)]
    servers: list[Server] = []
    try:
        for port in ports:
            node = folder / f"node-{port}"
            node.mkdir()
            # the bus port is given: the default (port + 10000) may be taken or too high
            args = ["--port", str(port), "--cluster-port", str(free_port()),
                    "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-config-file", str(node / "nodes.conf"),
                    "--cluster-node-timeout", "2000",
                    "--save", "", "--appendonly", "no"]  # fmt: skip
            servers.append(start_server(node, args, f"redis://127.0.0.1:{port}", name="redis"))
        create = [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                  "--cluster-replicas", str(replicas), "--cluster-yes"]  # fmt: skip
        done = subprocess.run(create, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [redis.Redis(port=p).cluster("info").get("cluster_state") for p in ports]
            if all(state == "ok" for state in states) and _replicas_synced(ports, masters):
                return Cluster(servers, ports, folder, masters)
            time.sleep(0.1)
        raise AssertionError(f"the cluster did not reach cluster_state:ok: {states}")
    except BaseException:
        for server in servers:
            server.stop()
        raise


@dataclass
class Group:
    """A ``toolfleet worker`` serving one queue group."""

    name: str
    queue: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_group(
    cluster: Cluster,
    ns: str,
    group: str,
    queue: str,
    folder: Path,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
    *,
    processes: int = 1,
    threads: int = 2,
    extension: str = "fleet_tools:extension",
) -> Group:
    """``toolfleet worker --queue-group GROUP -Q QUEUE`` (``processes`` × ``threads``, 1 × 2 by
    default) on ``cluster``; ``env`` adds to or overrides its environment
    (``TOOLFLEET_CLAIM_REPLICAS``...), ``extra`` adds to its arguments
    (``--extension once_tools:extension -Q tools.once``)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": cluster.url,
        "TOOLFLEET_NAMESPACE": ns,
        "TOOLFLEET_HEARTBEAT_INTERVAL_S": "0.5",
        "TOOLFLEET_WORKER_TTL_S": "3",
        "TOOLFLEET_SHUTDOWN_GRACE_S": "5",
        "TOOLFLEET_HEALTH_DIR": str(folder / f"health-{group}"),
        "TOOLFLEET_METRICS_PORT": "0",
        **(env or {}),
    }
    argv = [toolfleet_command(), "worker", "-p", str(processes), "-t", str(threads),
            "--queue-group", group, "--extension", extension, "-Q", queue,
            *(extra or [])]  # fmt: skip
    log_path = folder / f"worker-{group}-{len(list(folder.glob(f'worker-{group}*.log')))}.log"
    process = subprocess.Popen(argv, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    return Group(group, queue, process, log_path)


def wait_live(client: redis.cluster.RedisCluster, ns: str, groups: list[Group]) -> None:
    """Wait until a worker of every group beats on its queue (3 minutes: a loaded machine)."""
    deadline = time.monotonic() + 180
    fleet = fleet_namespace(ns, cluster=True)
    while time.monotonic() < deadline:
        for group in groups:
            if group.process.poll() is not None:
                raise AssertionError(f"worker of {group.name} exited:\n{group.log()}")
        live = [client.zcount(workers_key(fleet, g.queue), time.time() - 3, "+inf") for g in groups]
        if all(live):
            return
        time.sleep(0.1)
    raise AssertionError("workers not live:\n" + "\n".join(g.log() for g in groups))


def groups_on_two_masters(cluster: Cluster) -> tuple[str, str]:
    """Two group names whose hash tags are served by different masters."""
    first = "alpha"
    home = cluster.master_of(group_namespace("tf", first, cluster=True))
    for i in range(100):
        other = f"beta{i}"
        if cluster.master_of(group_namespace("tf", other, cluster=True)) != home:
            return first, other
    raise AssertionError("no second group name on another master")


@dataclass
class ClusterFleet:
    """The cluster, its namespace and the two groups' workers."""

    cluster: Cluster
    namespace: str
    test_group: Group
    bfcl_group: Group

    @property
    def url(self) -> str:
        return self.cluster.url

    def prefix(self, group: Group) -> str:
        return group_namespace(self.namespace, group.name, cluster=True)

    def env(self) -> dict[str, str]:
        """The environment of a CLI command or producer process on this fleet."""
        return {**os.environ, "TOOLFLEET_REDIS_URL": self.url,
                "TOOLFLEET_NAMESPACE": self.namespace}  # fmt: skip


def stop_groups(groups: list[Group]) -> None:
    """Stop worker processes (SIGTERM, then SIGKILL after 30 s) and wait for them."""
    for group in groups:
        if group.process.poll() is None:
            group.process.terminate()
    for group in groups:
        try:
            group.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            group.process.kill()
            group.process.wait()


@contextlib.contextmanager
def cluster_fleet(folder: Path) -> Iterator[ClusterFleet]:
    """A 3-master cluster with two queue groups on two masters: the test queue, the BFCL one.

    Everything is stopped on exit: the workers, then every redis-server.
    """
    cluster = start_cluster(folder, masters=3)
    groups: list[Group] = []
    try:
        first, second = groups_on_two_masters(cluster)
        ns = f"tfc-{uuid.uuid4().hex[:6]}"
        env = {"TOOLFLEET_QUALITY_MODELS": json.dumps([QUALITY_MODEL])}
        groups = [
            start_group(cluster, ns, first, TEST_QUEUE, folder, env),
            start_group(cluster, ns, second, BFCL_QUEUE, folder, env),
        ]
        client = cluster.client()
        try:
            wait_live(client, ns, groups)
        finally:
            client.close()
        yield ClusterFleet(cluster, ns, groups[0], groups[1])
    finally:
        stop_groups(groups)
        cluster.stop()
