"""Producer methods raise toolfleet's own errors, never bare redis-py ones; a call's outcome
stays a status."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from private_redis import free_port
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import ClientError, ConfigurationError, Settings, Status
from toolfleet.shared.errors import ConnectionFailed

PASSWORD = "pw-never-printed"
TURN = [{"id": "c1", "type": "function", "function": {"name": "ext_x_y", "arguments": "{}"}}]


@pytest.fixture
def dead_url() -> str:
    """A password-protected URL on a loopback port where nothing listens."""
    return f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"


def _quick() -> Settings:
    return Settings(redis_timeout_s=0.5, catalog_cache_s=0)


def test_sync_tools_raises_connection_failed_without_the_password(dead_url: str) -> None:
    """ToolClient.tools() with nothing listening raises ConnectionFailed (not a redis error),
    naming the Redis with its password masked."""
    with (
        ToolClient(dead_url, settings=_quick()) as client,
        pytest.raises(ConnectionFailed) as caught,
    ):
        client.tools()
    assert not isinstance(caught.value, redis.RedisError)
    assert PASSWORD not in str(caught.value) and PASSWORD not in caught.value.url
    assert "127.0.0.1" in str(caught.value) and "***" in caught.value.url


def test_async_tools_raises_connection_failed_without_the_password(dead_url: str) -> None:
    """AsyncToolClient.tools() with nothing listening raises ConnectionFailed."""

    async def run() -> ConnectionFailed:
        async with AsyncToolClient(dead_url, settings=_quick()) as client:
            with pytest.raises(ConnectionFailed) as caught:
                await client.tools()
        return caught.value

    error = asyncio.run(run())
    assert PASSWORD not in str(error) and "***" in error.url


def test_calls_to_an_unreachable_redis_are_statuses_not_exceptions(dead_url: str) -> None:
    """call, submit and dispatch with nothing listening answer ``not_available``; close()
    does not raise."""
    with ToolClient(dead_url, settings=_quick()) as client:
        result = client.call("ext_x_y", {}, timeout_s=5)
        future = client.submit("ext_x_y", {}, timeout_s=5)
        messages = client.dispatch(TURN, timeout_s=5)
        assert client.cancel(future.call_id) is False
    assert result.status is Status.NOT_AVAILABLE
    assert future.result(timeout=5).status is Status.NOT_AVAILABLE
    assert "Redis unreachable" in messages[0]["content"]
    assert PASSWORD not in messages[0]["content"]

    async def run() -> list[Status]:
        async with AsyncToolClient(dead_url, settings=_quick()) as client:
            one = await client.call("ext_x_y", {}, timeout_s=5)
            turn = await client.dispatch(TURN, timeout_s=5)
        assert "Redis unreachable" in turn[0]["content"]
        return [one.status]

    assert asyncio.run(run()) == [Status.NOT_AVAILABLE]


@pytest.mark.parametrize("client_class", [ToolClient, AsyncToolClient])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:6379", "not a Redis URL"),
        ("http://127.0.0.1:6379", "not a Redis URL"),
        ("redis+sentinel://:pw@host:26379/mymaster", "redis_client="),
    ],
)
def test_a_url_redis_cannot_use_is_a_configuration_error(
    client_class: type, url: str, says: str
) -> None:
    """A URL without a Redis scheme, or a Sentinel URL, is refused at construction with a
    ConfigurationError saying what to do (and no password)."""
    with pytest.raises(ConfigurationError, match=says) as caught:
        client_class(url)
    assert ":pw@" not in str(caught.value)


def test_a_callers_client_of_the_wrong_kind_is_misuse(redis_url: str) -> None:
    """A sync client handed to AsyncToolClient (or the reverse), both a client and a pool,
    or a client decoding responses, is refused with ClientError at construction."""
    sync_client = redis.Redis.from_url(redis_url)
    async_client = redis.asyncio.Redis.from_url(redis_url)
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ClientError, match=r"redis\.asyncio"):
        AsyncToolClient(redis_client=sync_client)  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="sync"):
        ToolClient(redis_client=async_client)  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="not both"):
        ToolClient(redis_client=sync_client, connection_pool=sync_client.connection_pool)
    with pytest.raises(ClientError, match="decode_responses"):
        ToolClient(redis_client=decoding)
    with pytest.raises(ClientError, match="not both"):
        ToolClient(redis_url, redis_client=sync_client)
    for client in (sync_client, decoding):
        client.close()


def test_preparing_raises_connection_failed(dead_url: str) -> None:
    """preparing() (both clients) with nothing listening raises ConnectionFailed."""
    with (
        ToolClient(dead_url, settings=_quick()) as client,
        pytest.raises(ConnectionFailed),
    ):
        client.preparing("ext_x_y", "{")

    async def run() -> None:
        async with AsyncToolClient(dead_url, settings=_quick()) as client:
            with pytest.raises(ConnectionFailed):
                await client.preparing("ext_x_y", "{")

    asyncio.run(run())
