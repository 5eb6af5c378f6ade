"""What any client of a namespace can do: cancel any call by id, read current extension errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path

import redis

from conftest import sandbox_reason, start_fleet, toolfleet_command, without_unserved_python
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared.extension_errors import WorkerErrors
from toolfleet.shared.naming import extension_errors_key

BROKEN = "import a_module_that_does_not_exist  # noqa: F401\n\ntools: list[object] = []\n"
FIXED = '''from pydantic import BaseModel

from toolfleet.shared import ExtensionContext, Tool


class Nothing(BaseModel):
    pass


class Hello(Tool):
    """Say hello."""

    name = "hello"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        return "hello"


tools = [Hello]
'''


def _check(redis_url: str, namespace: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env |= {"TOOLFLEET_REDIS_URL": redis_url, "TOOLFLEET_NAMESPACE": namespace}
    return subprocess.run(
        [toolfleet_command(), "extensions", "check", "--no-entry-points"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_extension_errors_describe_the_fleet_now(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A broken extension is reported by `extensions check` (exit 1) and by
    client.extension_errors(); after fixing it and restarting the fleet, both are clean
    (exit 0, {}; on a host without the python sandbox, only that is reported) and the fixed
    tool serves."""
    ns = f"{namespace}-exterr-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / "extensions" / "fixable"
    folder.mkdir(parents=True)
    (folder / "extension.toml").write_text(
        'slug = "fixable"\nversion = "1.0.0"\nentry = "fixable_tools:tools"\n'
    )
    (folder / "fixable_tools.py").write_text(BROKEN)
    env = {"TOOLFLEET_EXTENSION_PATHS": str(tmp_path / "extensions")}
    fleet = start_fleet(redis_url, ns, tmp_path / "w1.log", processes=1, env=env)
    try:
        before = _check(redis_url, ns)
        with ToolClient(redis_url, namespace=ns) as client:
            errors = client.extension_errors()
    finally:
        fleet.stop()
    assert before.returncode == 1, before.stdout + before.stderr
    assert "a_module_that_does_not_exist" in before.stdout
    assert any("a_module_that_does_not_exist" in why for why in errors.values()), errors
    (folder / "fixable_tools.py").write_text(FIXED)
    fleet = start_fleet(redis_url, ns, tmp_path / "w2.log", processes=1, env=env)
    try:
        after = _check(redis_url, ns)
        with ToolClient(redis_url, namespace=ns) as client:
            assert without_unserved_python(client.extension_errors()) == {}
            assert client.call("ext_fixable_hello", {}).content == "hello"
    finally:
        fleet.stop()
    problems = [line for line in after.stdout.splitlines() if line.startswith("problem")]
    if sandbox_reason() is None:
        assert after.returncode == 0 and not problems, after.stdout + after.stderr
    else:  # the fleet's one problem is the host's: no sandbox for the python tool
        assert after.returncode == 1 and len(problems) == 1, after.stdout
        assert problems[0].startswith("problem worker: entry point python"), after.stdout


def test_async_client_reads_extension_errors(redis_url: str, namespace: str) -> None:
    """AsyncToolClient.extension_errors() reads the same reports as ToolClient's."""
    ns = f"{namespace}-aerr-{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(redis_url)
    fresh = WorkerErrors(at=time.time(), errors={"a:b": "boom"}).model_dump_json()
    stale = WorkerErrors(at=time.time() - 3600, errors={"c:d": "old"}).model_dump_json()
    r.hset(extension_errors_key(ns), mapping={"w1": fresh, "w2": stale, "w3": "legacy text"})

    async def read() -> dict[str, str]:
        async with AsyncToolClient(redis_url, namespace=ns) as client:
            return await client.extension_errors()

    try:
        assert asyncio.run(read()) == {"a:b": "boom"}
        with ToolClient(redis_url, namespace=ns) as client:
            assert client.extension_errors() == {"a:b": "boom"}
    finally:
        r.delete(extension_errors_key(ns))
        r.close()
