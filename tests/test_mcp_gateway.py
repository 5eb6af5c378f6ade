"""`toolfleet mcp serve` against the official MCP SDK client, over stdio and stateless HTTP.

Real fleet (worker processes through the CLI), real gateway processes through the CLI,
real Redis; the client is the SDK's own (`mcp.Client`), in both protocol eras: the
2026-07-28 per-request one (the SDK's default, `mode="auto"`) and the handshake era
(`mode="legacy"`, what most clients in the field speak).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import TESTS, Fleet, start_fleet, toolfleet_command
from private_redis import stop_process
from toolfleet.producer.mcp import STATUS_META_KEY, TIMEOUT_META_KEY, token_digest
from toolfleet.shared import codec
from toolfleet.shared.naming import switches_key

pytestmark = pytest.mark.slow

ACME_TOKEN = "tf-acme-" + uuid.uuid4().hex
OTHER_TOKEN = "tf-other-" + uuid.uuid4().hex
MODES = ["auto", "legacy"]


@pytest.fixture(scope="module")
def mcp_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process serving the test tools and the `guarded` extension (acme only)."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-mcp-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("mcp") / "worker.log",
        processes=1,
        extra=["--extension", "guarded_ext:extension"],
        env={"TFTEST_GUARDED_API_KEY": "sk-" + uuid.uuid4().hex},
    )
    yield fleet
    fleet.stop()


def _env(fleet: Fleet) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": fleet.redis_url,
        "TOOLFLEET_NAMESPACE": fleet.namespace,
        "TOOLFLEET_CATALOG_CACHE_S": "0.2",
    }


def stdio_params(fleet: Fleet, *args: str) -> StdioServerParameters:
    """How an MCP client starts the gateway over stdio (the real CLI)."""
    return StdioServerParameters(
        command=toolfleet_command(), args=["mcp", "serve", *args], env=_env(fleet)
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    """One `toolfleet mcp serve --transport http` process."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    namespace: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        stop_process(self.process)


def start_replica(
    fleet: Fleet, log_path: Path, *args: str, env: dict[str, str] | None = None
) -> Replica:
    """Start an HTTP gateway replica and wait until /livez answers."""
    port = _free_port()
    argv = [toolfleet_command(), "mcp", "serve", "--transport", "http", "--port", str(port)]
    log = log_path.open("wb")
    process = subprocess.Popen(
        [*argv, *args], env={**_env(fleet), **(env or {})}, stdout=log, stderr=subprocess.STDOUT
    )
    replica = Replica(process, port, log_path, fleet.namespace)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gateway exited:\n{log_path.read_text()}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/livez", timeout=1).status_code == 200:
                return replica
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    replica.stop()
    raise AssertionError(f"gateway not up in 30 s:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokens file holding only digests: ACME_TOKEN → acme, OTHER_TOKEN → other."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.toml"
    path.write_text(
        "[[tokens]]\n"
        f'sha256 = "{token_digest(ACME_TOKEN)}"\naccount = "acme"\nuser = "acme-bot"\n'
        "[[tokens]]\n"
        f'sha256 = "{token_digest(OTHER_TOKEN)}"\naccount = "other"\n'
    )
    return path


@pytest.fixture(scope="module")
def replicas(
    mcp_fleet: Fleet, tokens_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Replica]]:
    """Two HTTP gateway replicas with bearer tokens, as behind a load balancer."""
    folder = tmp_path_factory.mktemp("replicas")
    started = [
        start_replica(mcp_fleet, folder / f"gateway-{i}.log", "--tokens-file", str(tokens_file))
        for i in range(2)
    ]
    yield started
    for replica in started:
        replica.stop()


@dataclass
class RoundRobin(httpx2.AsyncBaseTransport):
    """A load balancer in front of the replicas: each HTTP request goes to the next one."""

    ports: list[int]
    served: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._next = itertools.cycle(self.ports)
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self._next)
        self.served[port] = self.served.get(port, 0) + 1
        request.url = request.url.copy_with(port=port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def http_client(
    replicas: list[Replica], token: str | None, mode: str, balancer: RoundRobin | None = None
) -> AsyncIterator[Client]:
    """The SDK client over Streamable HTTP through a round-robin balancer."""
    balancer = balancer or RoundRobin([r.port for r in replicas])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(
        transport=balancer, headers=headers, timeout=httpx2.Timeout(30, read=60)
    ) as http:
        transport = streamable_http_client(replicas[0].url, http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def _text(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def _names(listed: types.ListToolsResult) -> set[str]:
    return {tool.name for tool in listed.tools}


def give_up_and_see_the_cancel(
    connect: Callable[[], AbstractAsyncContextManager[Client]], r: redis.Redis, namespace: str
) -> None:
    """Call a 20 s tool, give up after 1 s (read timeout), then wait up to 5 s, still
    connected, for a cancel mark of a call in Redis; fail when none appears by then (closing
    the connection afterwards must not be what cancels it)."""
    pattern = f"{namespace}:cancel:*"
    before = set(r.scan_iter(match=pattern))

    async def scenario() -> None:
        async with connect() as client:
            with pytest.raises(Exception, match="(?i)timed out|timeout"):
                await client.call_tool(
                    "ext_fleet_test_slow", {"seconds": 20}, read_timeout_seconds=1.0
                )
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not set(r.scan_iter(match=pattern)) - before:
                await anyio.sleep(0.05)
            assert set(r.scan_iter(match=pattern)) - before, "no call was canceled in the fleet"

    anyio.run(scenario)


# -- stdio -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stdio_lists_the_accounts_catalog_and_maps_results(mcp_fleet: Fleet, mode: str) -> None:
    """Over stdio: tools/list is the account's catalog with schemas; ok → content +
    structuredContent; a tool error and an unknown tool → isError with the error JSON."""

    async def scenario() -> None:
        async with Client(stdio_params(mcp_fleet, "--account", "acme"), mode=mode) as client:
            listed = await client.list_tools()
            by_name = {tool.name: tool for tool in listed.tools}
            assert {"ext_fleet_test_echo", "ext_guarded_mode"} <= set(by_name)
            assert by_name["ext_fleet_test_echo"].input_schema["required"] == ["text"]
            ok = await client.call_tool("ext_fleet_test_echo", {"text": "ab", "times": 2})
            assert not ok.is_error
            assert ok.structured_content == {"text": "abab", "account": "acme"}
            assert codec.loads(_text(ok)) == {"text": "abab", "account": "acme"}
            assert (ok.meta or {})[STATUS_META_KEY] == "ok"
            failed = await client.call_tool("ext_fleet_test_fail", {"reason": "no such city"})
            assert failed.is_error and codec.loads(_text(failed)) == {"error": "no such city"}
            assert (failed.meta or {})[STATUS_META_KEY] == "tool_error"
            bad = await client.call_tool("ext_fleet_test_add", {"a": "x", "b": 1})
            assert bad.is_error and (bad.meta or {})[STATUS_META_KEY] == "invalid_arguments"
            assert "a" in codec.loads(_text(bad))["error"]
            unknown = await client.call_tool("ext_nope_nothing", {})
            assert unknown.is_error and (unknown.meta or {})[STATUS_META_KEY] == "unknown_function"

    anyio.run(scenario)


def test_stdio_progress_reaches_the_client_with_a_progress_token(mcp_fleet: Fleet) -> None:
    """A call with a progressToken gets the tool's running and progress events, in order,
    as notifications/progress with increasing progress values, before the result."""
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async def scenario() -> types.CallToolResult:
        async with Client(stdio_params(mcp_fleet), mode="legacy") as client:
            return await client.call_tool(
                "ext_fleet_test_progress",
                {"steps": 3, "pause_s": 0.35},
                progress_callback=on_progress,
            )

    result = anyio.run(scenario)
    assert not result.is_error and result.structured_content in (3, None)
    assert _text(result) == "3"
    messages = [m for _, m in seen]
    assert messages == ["Counting to 3…", "step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert [p for p, _ in seen] == sorted({p for p, _ in seen})


def test_stdio_request_budget_is_the_calls_deadline(mcp_fleet: Fleet) -> None:
    """_meta toolfleet/timeout_s is the call's budget: a 20 s tool asked for 1 s is answered
    isError timeout by 1 s + a margin."""

    async def scenario() -> tuple[types.CallToolResult, float]:
        async with Client(stdio_params(mcp_fleet), mode="legacy") as client:
            started = time.monotonic()
            result = await client.call_tool(
                "ext_fleet_test_slow", {"seconds": 20}, meta={TIMEOUT_META_KEY: 1.0}
            )
            return result, time.monotonic() - started

    result, elapsed = anyio.run(scenario)
    assert result.is_error and (result.meta or {})[STATUS_META_KEY] == "timeout"
    assert elapsed < 1.0 + 1.5


@pytest.mark.parametrize("mode", MODES)
def test_stdio_cancelled_request_cancels_the_call_in_the_fleet(
    mcp_fleet: Fleet, r: redis.Redis, mode: str
) -> None:
    """When the client gives up on a request (its read timeout sends notifications/cancelled),
    the gateway cancels the call in the fleet: a cancel mark for it appears in Redis."""
    give_up_and_see_the_cancel(
        lambda: Client(stdio_params(mcp_fleet), mode=mode), r, mcp_fleet.namespace
    )


def test_calls_over_max_in_flight_are_rejected_by_their_deadline(mcp_fleet: Fleet) -> None:
    """With --max-in-flight 1 and one call running, a second call waits for a slot within its
    budget, then comes back isError rejected (backpressure), never a protocol error."""

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, float]:
        params = stdio_params(mcp_fleet, "--max-in-flight", "1")
        async with Client(params, mode="legacy") as client:
            results: dict[str, types.CallToolResult] = {}

            async def slow() -> None:
                results["slow"] = await client.call_tool(
                    "ext_fleet_test_slow", {"seconds": 3}, meta={TIMEOUT_META_KEY: 6.0}
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(0.5)
                started = time.monotonic()
                second = await client.call_tool(
                    "ext_fleet_test_echo", {"text": "x"}, meta={TIMEOUT_META_KEY: 1.0}
                )
                elapsed = time.monotonic() - started
            return results["slow"], second, elapsed

    slow, second, elapsed = anyio.run(scenario)
    assert not slow.is_error
    assert second.is_error and (second.meta or {})[STATUS_META_KEY] == "rejected"
    assert "in flight" in _text(second)
    assert elapsed < 1.0 + 1.5


def test_stdio_list_changed_when_a_switch_flips(mcp_fleet: Fleet, r: redis.Redis) -> None:
    """A handshake-era stdio client that listed tools gets notifications/tools/list_changed
    when a switch takes a tool away, and the new list lacks it."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def scenario() -> set[str]:
        params = stdio_params(mcp_fleet, "--watch-interval", "0.2")
        async with Client(params, mode="legacy", message_handler=on_message) as client:
            assert client.server_capabilities.tools is not None
            assert client.server_capabilities.tools.list_changed
            assert "ext_fleet_test_mark" in _names(await client.list_tools())
            r.hset(switches_key(mcp_fleet.namespace), "ext_fleet_test_mark", "off")
            with anyio.fail_after(10):
                await changed.wait()
            return _names(await client.list_tools())

    try:
        after = anyio.run(scenario)
    finally:
        r.hdel(switches_key(mcp_fleet.namespace), "ext_fleet_test_mark")
    assert "ext_fleet_test_mark" not in after and "ext_fleet_test_echo" in after


def test_modern_listen_stream_gets_list_changed(mcp_fleet: Fleet, r: redis.Redis) -> None:
    """A 2026-07-28 client's subscriptions/listen stream carries tools/list_changed when a
    switch flips."""

    async def scenario() -> None:
        params = stdio_params(mcp_fleet, "--watch-interval", "0.2")
        async with Client(params) as client:
            async with client.listen(tools_list_changed=True) as subscription:
                r.hset(switches_key(mcp_fleet.namespace), "ext_fleet_test_sleep", "off")
                with anyio.fail_after(10):
                    event = await subscription.__anext__()
                assert type(event).__name__ == "ToolsListChanged"
            assert "ext_fleet_test_sleep" not in _names(await client.list_tools())

    try:
        anyio.run(scenario)
    finally:
        r.hdel(switches_key(mcp_fleet.namespace), "ext_fleet_test_sleep")


def test_redis_outage_is_a_one_line_error_never_a_traceback(
    mcp_fleet: Fleet, tmp_path: Path
) -> None:
    """With the fleet's Redis unreachable, tools/list is a JSON-RPC error saying so and a
    call is isError not_available; the gateway keeps serving and logs no traceback."""
    errlog = (tmp_path / "gateway.err").open("w+")
    params = stdio_params(mcp_fleet)
    params.env = {**(params.env or {}), "TOOLFLEET_REDIS_URL": "redis://127.0.0.1:1/0"}

    async def scenario() -> types.CallToolResult:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
            with pytest.raises(MCPError, match="catalog is unreachable"):
                await client.list_tools()
            return await client.call_tool("ext_fleet_test_echo", {"text": "x"})

    result = anyio.run(scenario)
    assert result.is_error and (result.meta or {})[STATUS_META_KEY] == "not_available"
    errlog.seek(0)
    assert "Traceback" not in errlog.read()


# -- HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_two_replicas_answer_one_client_interchangeably(replicas: list[Replica], mode: str) -> None:
    """Stateless HTTP: one client behind a round-robin balancer over two replicas lists and
    calls tools, every request landing on the other replica than the one before."""
    balancer = RoundRobin([r.port for r in replicas])

    async def scenario() -> list[Any]:
        async with http_client(replicas, ACME_TOKEN, mode, balancer) as client:
            assert "ext_fleet_test_add" in _names(await client.list_tools())
            results = []
            for n in range(6):
                result = await client.call_tool("ext_fleet_test_add", {"a": n, "b": 10**30})
                assert not result.is_error, _text(result)
                results.append(codec.loads(_text(result)))
            return results

    assert anyio.run(scenario) == [n + 10**30 for n in range(6)]
    assert set(balancer.served) == {r.port for r in replicas}
    assert min(balancer.served.values()) >= 3


def test_http_without_a_valid_token_is_401(replicas: list[Replica]) -> None:
    """No bearer token, or an unknown one, gets 401 with a WWW-Authenticate challenge."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for extra in ({}, {"Authorization": "Bearer not-a-token"}):
        response = httpx2.post(replicas[0].url, json=body, headers={**headers, **extra})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("mode", MODES)
def test_an_account_sees_and_calls_only_its_tools(replicas: list[Replica], mode: str) -> None:
    """The token's account decides: acme lists and calls ext_guarded_mode (as acme); other
    does not see it, and calling it anyway is isError not_available."""

    async def as_account(token: str) -> tuple[set[str], types.CallToolResult]:
        async with http_client(replicas, token, mode) as client:
            names = _names(await client.list_tools())
            return names, await client.call_tool("ext_guarded_mode", {})

    acme_names, acme_call = anyio.run(as_account, ACME_TOKEN)
    other_names, other_call = anyio.run(as_account, OTHER_TOKEN)
    assert "ext_guarded_mode" in acme_names and "ext_fleet_test_echo" in acme_names
    assert not acme_call.is_error and codec.loads(_text(acme_call))["account"] == "acme"
    assert "ext_guarded_mode" not in other_names and "ext_fleet_test_echo" in other_names
    assert other_call.is_error and (other_call.meta or {})[STATUS_META_KEY] == "not_available"


def test_http_progress_and_timeout(replicas: list[Replica]) -> None:
    """Over HTTP (2026-07-28): progress notifications reach the caller; the request's
    budget makes a slow tool isError timeout by the budget + a margin."""
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    async def scenario() -> tuple[types.CallToolResult, float]:
        async with http_client(replicas, ACME_TOKEN, "auto") as client:
            done = await client.call_tool(
                "ext_fleet_test_progress",
                {"steps": 2, "pause_s": 0.35},
                progress_callback=on_progress,
            )
            assert not done.is_error
            started = time.monotonic()
            slow = await client.call_tool(
                "ext_fleet_test_slow", {"seconds": 20}, meta={TIMEOUT_META_KEY: 1.0}
            )
            return slow, time.monotonic() - started

    slow, elapsed = anyio.run(scenario)
    assert messages == ["Counting to 2…", "step 1 of 2", "step 2 of 2"]
    assert slow.is_error and (slow.meta or {})[STATUS_META_KEY] == "timeout"
    assert elapsed < 1.0 + 1.5


@pytest.mark.parametrize("mode", MODES)
def test_http_cancelled_request_cancels_the_call_in_the_fleet(
    replicas: list[Replica], r: redis.Redis, mode: str
) -> None:
    """Over HTTP, a request the client gives up on (read timeout) cancels its call in the
    fleet: a cancel mark for it appears in Redis."""
    give_up_and_see_the_cancel(
        lambda: http_client(replicas, ACME_TOKEN, mode), r, replicas[0].namespace
    )


def test_http_probes(replicas: list[Replica]) -> None:
    """/livez answers 200; /readyz answers 200 with the fleet's Redis reachable."""
    base = f"http://127.0.0.1:{replicas[0].port}"
    assert httpx2.get(f"{base}/livez").status_code == 200
    ready = httpx2.get(f"{base}/readyz")
    assert ready.status_code == 200 and ready.json() == {"ready": True}


def test_http_readyz_fails_while_redis_is_unreachable(mcp_fleet: Fleet, tmp_path: Path) -> None:
    """With Redis unreachable the replica stays live (/livez 200) but not ready (/readyz 503,
    saying why), and logs no traceback."""
    replica = start_replica(
        mcp_fleet,
        tmp_path / "down.log",
        "--no-auth",
        env={"TOOLFLEET_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    try:
        base = f"http://127.0.0.1:{replica.port}"
        assert httpx2.get(f"{base}/livez").status_code == 200
        ready = httpx2.get(f"{base}/readyz", timeout=10)
    finally:
        replica.stop()
    assert ready.status_code == 503 and ready.json()["ready"] is False
    assert "Traceback" not in replica.log_path.read_text()


def test_http_takes_a_pluggable_token_verifier(mcp_fleet: Fleet, tmp_path: Path) -> None:
    """--token-verifier MODULE:ATTR plugs in any SDK TokenVerifier: its tokens' accounts
    apply (acme sees and calls its tool) and a token it refuses gets 401."""
    replica = start_replica(
        mcp_fleet, tmp_path / "custom.log", "--token-verifier", "mcp_verifier:verifier"
    )
    try:

        async def scenario() -> tuple[set[str], types.CallToolResult]:
            async with http_client([replica], "acme-42", "auto") as client:
                names = _names(await client.list_tools())
                return names, await client.call_tool("ext_guarded_mode", {})

        names, result = anyio.run(scenario)
        refused = httpx2.post(
            replica.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={"Authorization": "Bearer other-42"},
        )
    finally:
        replica.stop()
    assert "ext_guarded_mode" in names
    assert not result.is_error and codec.loads(_text(result))["account"] == "acme"
    assert refused.status_code == 401


def test_http_refuses_to_start_without_auth_or_an_explicit_no_auth(mcp_fleet: Fleet) -> None:
    """`--transport http` with neither tokens nor --no-auth exits 2 with a one-line reason."""
    out = subprocess.run(
        [toolfleet_command(), "mcp", "serve", "--transport", "http", "--port", "1"],
        env=_env(mcp_fleet),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "--no-auth" in out.stderr and "Traceback" not in out.stderr


def test_http_run_open_with_no_auth(mcp_fleet: Fleet, tmp_path: Path) -> None:
    """--no-auth serves without tokens, every caller as --account."""
    replica = start_replica(mcp_fleet, tmp_path / "open.log", "--no-auth", "--account", "acme")
    try:

        async def scenario() -> types.CallToolResult:
            async with http_client([replica], None, "auto") as client:
                return await client.call_tool("ext_guarded_mode", {})

        result = anyio.run(scenario)
    finally:
        replica.stop()
    assert not result.is_error and codec.loads(_text(result))["account"] == "acme"
