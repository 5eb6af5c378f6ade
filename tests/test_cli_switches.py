"""Global options in either position; switch names checked against the catalog; switch timing."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from conftest import TESTS, Fleet, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import switches_key
from toolfleet.shared.settings import Settings
from toolfleet.worker.cli.main import cli

ADD = "ext_fleet_test_add"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The real CLI with no TOOLFLEET_* variable: options are the only configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return subprocess.run(
        [toolfleet_command(), *args],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(TESTS)},
        timeout=120,
        check=False,
    )


def _states(fleet: Fleet) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        return client.hgetall(switches_key(fleet.namespace))  # type: ignore[return-value]
    finally:
        client.close()


@pytest.fixture
def clean_switches(fleet: Fleet) -> Iterator[Fleet]:
    """The module's fleet, with every switch removed after the test."""
    yield fleet
    client = redis.Redis.from_url(fleet.redis_url)
    client.delete(switches_key(fleet.namespace))
    client.close()


def test_global_options_work_before_and_after_the_subcommand(clean_switches: Fleet) -> None:
    """--redis-url/--namespace are honoured before the subcommand and after it."""
    fleet = clean_switches
    where = ["--redis-url", fleet.redis_url, "--namespace", fleet.namespace]
    before = _run([*where, "switch", "off", ADD])
    assert before.returncode == 0, before.stderr
    assert _states(fleet) == {ADD.encode(): b"off"}
    after = _run(["switch", "on", ADD, *where])
    assert after.returncode == 0, after.stderr
    assert _states(fleet) == {ADD.encode(): b"on"}
    listed = _run(["switch", "list", *where[:2], "--namespace", f"{fleet.namespace}-other"])
    assert listed.returncode == 0 and ADD not in listed.stdout  # --namespace took effect
    mixed = _run(["--namespace", fleet.namespace, "switch", "list", "--redis-url", fleet.redis_url])
    assert mixed.returncode == 0 and ADD in mixed.stdout


def test_unknown_switch_name_is_refused_with_the_nearest_names(clean_switches: Fleet) -> None:
    """A typo'd switch name is an error listing the nearest catalogued names; nothing is set."""
    fleet = clean_switches
    where = ["--redis-url", fleet.redis_url, "--namespace", fleet.namespace]
    out = _run(["switch", "off", "ext_fleet_test_ad", *where])
    assert out.returncode == 1
    assert "ext_fleet_test_ad" in out.stderr and ADD in out.stderr.split("nearest:")[1]
    assert len(out.stderr.strip().splitlines()) <= 3
    assert _states(fleet) == {}
    extension = _run(["switch", "off", "ext_fleet_test", *where])  # a whole extension
    assert extension.returncode == 0, extension.stderr


def test_switch_delete_removes_a_set_switch(clean_switches: Fleet) -> None:
    """`switch delete NAME` removes a switch (even one set with --force); deleting a switch
    that is not set is an error."""
    fleet = clean_switches
    where = ["--redis-url", fleet.redis_url, "--namespace", fleet.namespace]
    forced = _run(["switch", "off", "ext_not_deployed_yet", "--force", *where])
    assert forced.returncode == 0, forced.stderr
    assert _states(fleet) == {b"ext_not_deployed_yet": b"off"}
    deleted = _run(["switch", "delete", "ext_not_deployed_yet", *where])
    assert deleted.returncode == 0, deleted.stderr
    assert _states(fleet) == {}
    again = _run(["switch", "delete", "ext_not_deployed_yet", *where])
    assert again.returncode == 1 and "no switch is set named" in again.stderr


def test_switch_on_an_empty_catalog_asks_for_force(redis_url: str) -> None:
    """With no worker ever seen in the namespace, a switch needs --force (nothing to check)."""
    namespace = f"tfsw-{uuid.uuid4().hex[:8]}"
    out = _run(["switch", "on", ADD, "--redis-url", redis_url, "--namespace", namespace])
    assert out.returncode == 1 and "--force" in out.stderr


def _switch(url: str, namespace: str, state: str, name: str = ADD) -> None:
    """Run `toolfleet switch STATE NAME` (the real command, in this process for speed)."""
    args = ["switch", state, name, "--redis-url", url, "--namespace", namespace]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_a_switch_change_applies_to_the_next_call(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Right after `switch off`/`switch on` returns, the next call sees the new state, even
    with workers heartbeating every 5 s and producers caching the catalog for 30 s."""
    ns = f"{namespace}-sw{uuid.uuid4().hex[:6]}"
    slow = {"TOOLFLEET_HEARTBEAT_INTERVAL_S": "5", "TOOLFLEET_WORKER_TTL_S": "60"}
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1, env=slow)
    settings = Settings(redis_url=redis_url, namespace=ns, catalog_cache_s=30, worker_ttl_s=60)
    try:
        with ToolClient(redis_url, settings=settings) as warm:
            assert warm.call(ADD, {"a": 1, "b": 2}).content == 3  # caches "on"
            for _ in range(3):
                _switch(redis_url, ns, "off")
                refused = warm.call(ADD, {"a": 1, "b": 2})
                assert refused.status.value == "not_available", refused
                assert "switched off" in str(refused.content)
                _switch(redis_url, ns, "on")
                assert warm.call(ADD, {"a": 1, "b": 2}).content == 3
        _switch(redis_url, ns, "off", name="ext_fleet_test")
        with ToolClient(redis_url, settings=settings) as cold:
            assert cold.call(ADD, {"a": 1, "b": 2}).status.value == "not_available"  # caches off
            _switch(redis_url, ns, "on", name="ext_fleet_test")
            assert cold.call(ADD, {"a": 1, "b": 2}).content == 3
    finally:
        fleet.stop()
