"""A private Redis Cluster for tests: ``redis-server --cluster-enabled yes`` on loopback."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.cluster

from conftest import unavailable
from private_redis import Server, free_port, start_server


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
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0])

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
            if all(state == "ok" for state in states):
                return Cluster(servers, ports, folder, masters)
            time.sleep(0.1)
        raise AssertionError(f"the cluster did not reach cluster_state:ok: {states}")
    except BaseException:
        for server in servers:
            server.stop()
        raise
