"""A Sentinel failover heals without restarting a worker: a master, a replica and three
sentinels on private loopback ports; the master is SIGKILLed under load from a ToolClient
and an AsyncToolClient, and calls are served again soon after Sentinel promotes the
replica, by the same worker processes."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
from redis.sentinel import Sentinel

from conftest import Either, Fleet, start_fleet
from private_redis import Server, free_port, start_server, start_tcp_server
from toolfleet.shared import Status

ECHO = "ext_fleet_test_echo"
SERVICE = "tffailover"
#: Seconds after Sentinel names the new master by which calls are served again.
HEAL_S = 2.0


@dataclass
class Setup:
    master: Server
    replica: Server
    replica_port: int
    sentinels: list[Server]
    sentinel_ports: list[int]


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


@pytest.fixture
def failover_setup(tmp_path: Path) -> Iterator[Setup]:
    """A master, its replica and three sentinels (quorum 2, master down after 1 s)."""
    started: list[Server] = []
    try:
        (tmp_path / "m").mkdir()
        master = start_tcp_server(tmp_path / "m")
        started.append(master)
        master_port = int(master.url.rsplit(":", 1)[1].split("/")[0])
        replica_port = free_port()
        (tmp_path / "r").mkdir()
        replica = start_server(
            tmp_path / "r",
            ["--port", str(replica_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--replicaof", "127.0.0.1", str(master_port)],
            f"redis://127.0.0.1:{replica_port}/0", name="replica",
        )  # fmt: skip
        started.append(replica)
        _wait(
            lambda: redis.Redis(port=replica_port).info("replication")["master_link_status"]
            == "up",
            30, "the replica in sync",
        )  # fmt: skip
        ports = [free_port() for _ in range(3)]
        sentinels = []
        for i, port in enumerate(ports):
            folder = tmp_path / f"s{i}"
            folder.mkdir()
            config = folder / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
            )
            watcher = start_server(folder, [str(config), "--sentinel"],
                                   f"redis://127.0.0.1:{port}/0", name="sentinel")  # fmt: skip
            started.append(watcher)
            sentinels.append(watcher)

        def ready() -> bool:
            for port in ports:
                s = redis.Redis(port=port)
                fields = s.sentinel_master(SERVICE)
                if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                    return False
            return True

        _wait(ready, 30, "three sentinels that know each other and the replica")
        yield Setup(master, replica, replica_port, sentinels, ports)
    finally:
        for server in reversed(started):
            server.stop()


@dataclass
class Load:
    """Calls one client sends every 50 ms: (sent at, answered at, status), monotonic."""

    kind: str
    client: Either
    answers: list[tuple[float, float, Status]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            future = self.client.submit(ECHO, {"text": "x"}, timeout_s=30)

            def done(result: Any, sent: float = sent) -> None:
                self.answers.append((sent, time.monotonic(), result.status))

            threading.Thread(
                target=lambda f=future, d=done: d(self.client.result(f, 60)), daemon=True
            ).start()
            time.sleep(0.05)


def test_master_sigkill_heals_within_the_failover_without_restarting_workers(
    failover_setup: Setup, tmp_path: Path
) -> None:
    """Calls from both clients are served again within 2 s of Sentinel naming the new
    master, by the worker processes that served before the failover."""
    setup = failover_setup
    ns = f"tftest-failover-{uuid.uuid4().hex[:6]}"
    env = {
        "TOOLFLEET_REDIS_URL": "",
        "TOOLFLEET_HEALTH_DIR": str(tmp_path / "health"),
        "TFTEST_SENTINEL_PORT": str(setup.sentinel_ports[0]),
        "TFTEST_SENTINEL_SERVICE": SERVICE,
    }
    fleet: Fleet = start_fleet(setup.master.url, ns, tmp_path / "worker.log", processes=2,
                               threads=4, extra=["--redis-client", "sentinel_factory:master"],
                               env=env)  # fmt: skip
    addresses = [("127.0.0.1", p) for p in setup.sentinel_ports]
    sync_master = Sentinel(addresses, socket_timeout=5).master_for(SERVICE)
    async_master = redis.asyncio.sentinel.Sentinel(addresses, socket_timeout=5).master_for(SERVICE)
    loads = [
        Load("sync", Either("sync", redis_client=sync_master, namespace=ns)),
        Load("async", Either("async", redis_client=async_master, namespace=ns)),
    ]
    threads = [threading.Thread(target=load.run, daemon=True) for load in loads]
    try:
        pids = sorted(fleet.worker_pids())
        assert len(pids) == 2
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        os.kill(setup.master.process.pid, signal.SIGKILL)
        setup.master.process.wait()
        killed = time.monotonic()
        watcher = Sentinel([addresses[1]], socket_timeout=1)
        _wait(lambda: watcher.discover_master(SERVICE)[1] == setup.replica_port, 60,
              "Sentinel naming the replica master")  # fmt: skip
        promoted = time.monotonic()
        time.sleep(HEAL_S + 6.0)
        for load in loads:
            load.stop.set()
        for thread in threads:
            thread.join(10)
        time.sleep(1.0)
        for load in loads:
            before = [s for sent, _, s in load.answers if sent < killed - 1.0]
            assert before and all(s is Status.OK for s in before), (load.kind, before)
            healed = [at for sent, at, s in load.answers if sent >= promoted and s is Status.OK]
            assert healed, (load.kind, "no ok answer after the failover")
            first = min(healed) - promoted
            assert first <= HEAL_S, (load.kind, f"first ok answer {first:.1f} s after promotion")
            late = [(round(sent - promoted, 1), s.value) for sent, _, s in load.answers
                    if sent >= promoted + HEAL_S and s is not Status.OK]  # fmt: skip
            assert not late, (load.kind, late)
        assert sorted(fleet.worker_pids()) == pids, "a worker process was restarted"
        assert "restarting" not in fleet.log(), fleet.log()[-3000:]
    finally:
        for load in loads:
            load.stop.set()
            load.client.close(wait=False)
        fleet.stop()
