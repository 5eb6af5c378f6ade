"""``ToolClient``: publish tool calls to the fleet and wait for their results."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import redis

from toolfleet.producer.catalog import CatalogReader
from toolfleet.producer.listener import ReplyListener
from toolfleet.producer.publish import Publisher
from toolfleet.shared import codec
from toolfleet.shared.errors import ClientClosedError, ClientError, ConfigurationError
from toolfleet.shared.export import export_tools
from toolfleet.shared.naming import cancel_channel, cancel_key, reply_key
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import (
    CallContext,
    Status,
    ToolCallRequest,
    ToolCallResult,
    new_call_id,
)

__all__ = ["CallFuture", "ToolClient"]

log = logging.getLogger("toolfleet.producer")

Arguments = dict[str, Any] | str | None


class CallFuture(Future[ToolCallResult]):
    """The future of one call; ``call_id`` is the request id (for :meth:`ToolClient.cancel`)."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id


class ToolClient:
    """A thread-safe client of the tool fleet.

    One reply connection and one listener thread serve every call in flight, however
    many. ``call``/``submit`` never raise for a wire status: a result with
    ``status != "ok"`` is returned (use ``result.raise_for_status()``). They raise only
    for misuse (:class:`ClientError`) or after :meth:`close` (:class:`ClientClosedError`).

    Args:
        redis_url: Redis URL; ``None`` reads ``TOOLFLEET_REDIS_URL``.
        namespace: key prefix; ``None`` reads ``TOOLFLEET_NAMESPACE`` (default ``toolfleet``).
        settings: a :class:`Settings` object instead of the environment.

    Raises:
        ConfigurationError: no Redis URL was given or configured.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        namespace: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url, namespace=namespace)
        url = redis_url or self.settings.redis_url
        if not url:
            raise ConfigurationError("no Redis URL: pass redis_url= or set TOOLFLEET_REDIS_URL")
        self.redis_url = url
        self.namespace = namespace or self.settings.namespace
        self.client_id = uuid.uuid4().hex
        self.reply_to = reply_key(self.namespace, self.client_id)
        self._redis = redis.Redis.from_url(
            url,
            client_name=f"toolfleet-producer-{self.client_id}",
            socket_timeout=self.settings.redis_timeout_s,
            socket_connect_timeout=self.settings.redis_timeout_s,
        )
        self._catalog = CatalogReader(
            self._redis, self.namespace, self.settings.catalog_cache_s, self.settings.worker_ttl_s
        )
        self._publisher = Publisher(self._redis, self.namespace)
        self._listener = ReplyListener(
            self._listener_connection, self.reply_to, on_timeout=self._cancel_in_fleet
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._listener.start()

    def _listener_connection(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.redis_url,
            client_name=f"toolfleet-reply-{self.client_id}",
            single_connection_client=True,
        )

    # -- calls ---------------------------------------------------------------

    def submit(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> CallFuture:
        """Publish one tool call; return a future that resolves by ``timeout_s`` at the latest.

        Args:
            function: the function name, e.g. ``ext_bfcl_math_factorial``.
            arguments: a JSON object, or the raw JSON string the model produced.
            tool_call_id: the model's id for the call, carried through untouched.
            context: a :class:`CallContext` or a dict of its fields.
            timeout_s: seconds until the deadline; no reply by then → ``timeout``.

        Returns:
            A :class:`CallFuture` (a ``Future[ToolCallResult]`` with ``call_id``, the id
            :meth:`cancel` takes). A function absent from the catalog resolves
            ``unknown_function`` at once, one without a live worker ``not_available``;
            nothing is published for either.

        Raises:
            ClientClosedError: the client is closed.
            ClientError: bad arguments to this method.
        """
        request = self._request(function, arguments, tool_call_id, context, timeout_s)
        future: CallFuture = CallFuture(request.id)
        try:
            size = _arguments_size(arguments)
        except codec.EncodeError as exc:
            raise ClientError(f"arguments are not JSON: {exc}") from None
        if size > self.settings.max_arguments_bytes:
            message = (
                f"the arguments are {size} bytes, over the limit of "
                f"{self.settings.max_arguments_bytes} bytes"
            )
            return _done(future, _local(request, Status.REJECTED, message))
        try:
            catalog = self._catalog.get(function)
        except redis.RedisError as exc:
            return _done(future, _local(request, Status.NOT_AVAILABLE, f"Redis unreachable: {exc}"))
        entry = catalog.entries.get(function)
        if entry is None:
            message = f"unknown function {function!r}"
            return _done(future, _local(request, Status.UNKNOWN_FUNCTION, message))
        refusal = catalog.refusal(function, request.context.account)
        if refusal:
            return _done(future, _local(request, Status.NOT_AVAILABLE, refusal))
        try:
            self._listener.expect(request, future)
        except RuntimeError:
            raise ClientClosedError("the client is closed") from None
        try:
            self._publisher.publish(str(entry["queue"]), request)
        except redis.ConnectionError as exc:
            if _never_sent(exc):
                self._listener.forget(request.id)
                message = f"Redis unreachable: {exc}"
                return _done(future, _local(request, Status.NOT_AVAILABLE, message))
            # the request may have reached Redis: its reply may still come; the deadline
            # resolves it otherwise (never report "not sent" for a call that may run)
            log.warning("publishing call %s may have failed: %s", request.id, exc)
        except redis.RedisError as exc:
            log.warning("publishing call %s may have failed: %s", request.id, exc)
        except Exception:
            self._listener.forget(request.id)
            if self._closed:
                raise ClientClosedError("the client is closed") from None
            raise
        return future

    def call(
        self,
        function: str,
        arguments: Arguments = None,
        *,
        tool_call_id: str | None = None,
        context: CallContext | dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> ToolCallResult:
        """Make one tool call and wait for its result (at most ``timeout_s`` seconds).

        Same arguments and errors as :meth:`submit`.
        """
        future = self.submit(
            function, arguments, tool_call_id=tool_call_id, context=context, timeout_s=timeout_s
        )
        return future.result()

    def tools(
        self,
        *,
        account: str | None = None,
        format: str = "openai",  # noqa: A002
        include_unavailable: bool = False,
    ) -> list[dict[str, Any]]:
        """The fleet's tools as a model API tool list.

        Args:
            account: list only what this account may call (enabled, switched on,
                available to it); ``None`` lists what is open to every account.
            format: ``openai`` (Chat Completions), ``openai-strict``, ``responses``,
                ``anthropic`` or ``mcp``.
            include_unavailable: list every catalogued function regardless.

        Raises:
            ValueError: unknown format.
            redis.RedisError: Redis unreachable.
        """
        catalog = self._catalog.get()
        entries = [
            e
            for name, e in sorted(catalog.entries.items())
            if include_unavailable or not catalog.refusal(name, account)
        ]
        return export_tools(entries, format)

    def cancel(self, call_id: str) -> bool:
        """Cancel a call made by this client.

        The call resolves ``canceled`` at once. In the fleet, a queued call never runs; a
        running ``async`` or ``process`` tool is stopped; a running ``thread`` tool sees
        ``context.canceled`` become true.

        Args:
            call_id: the call's ``id``: ``future.call_id`` of the future :meth:`submit`
                returned (also ``ToolCallResult.id``).

        Returns:
            False when the call had already resolved.
        """
        resolved = self._listener.resolve(
            call_id,
            lambda request: ToolCallResult.failure(
                request, Status.CANCELED, "the call was canceled"
            ),
        )
        if resolved:
            with contextlib.suppress(redis.RedisError):
                self._cancel_in_fleet([call_id])
        return resolved

    def _cancel_in_fleet(self, call_ids: list[str]) -> None:
        ttl = self.settings.reply_ttl_s
        pipe = self._redis.pipeline(transaction=False)
        for call_id in call_ids:
            pipe.set(cancel_key(self.namespace, call_id), b"1", ex=ttl)
            pipe.publish(cancel_channel(self.namespace), call_id)
        pipe.execute()

    @property
    def in_flight(self) -> int:
        """Calls published and not yet resolved."""
        return self._listener.in_flight

    @property
    def late_replies(self) -> int:
        """Replies that came after their call was resolved (dropped)."""
        return self._listener.late_replies

    # -- lifecycle -----------------------------------------------------------

    def close(self, *, wait: bool = True) -> None:
        """Stop the client; idempotent.

        With ``wait``, calls in flight resolve first (each by its deadline at the
        latest); without, they resolve ``timeout`` now.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        while wait and self._listener.in_flight:
            time.sleep(0.01)
        self._listener.stop()
        with contextlib.suppress(redis.RedisError):
            self._redis.delete(self.reply_to)
        self._redis.close()

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------

    def _request(
        self,
        function: str,
        arguments: Arguments,
        tool_call_id: str | None,
        context: CallContext | dict[str, Any] | None,
        timeout_s: float,
    ) -> ToolCallRequest:
        if self._closed:
            raise ClientClosedError("the client is closed")
        if not isinstance(function, str) or not function:
            raise ClientError("function must be a non-empty string")
        if arguments is not None and not isinstance(arguments, (dict, str)):
            raise ClientError("arguments must be a dict, a JSON string or None")
        if (
            not isinstance(timeout_s, (int, float))
            or not math.isfinite(timeout_s)
            or not timeout_s > 0
        ):
            raise ClientError("timeout_s must be a positive, finite number of seconds")
        if tool_call_id is not None and not isinstance(tool_call_id, str):
            raise ClientError("tool_call_id must be a string")
        try:
            ctx = context if isinstance(context, CallContext) else CallContext(**(context or {}))
        except Exception as exc:
            raise ClientError(f"bad context: {exc}") from exc
        now = time.time()
        try:
            return ToolCallRequest(
                id=new_call_id(),
                tool_call_id=tool_call_id,
                function=function,
                arguments=arguments,
                context=ctx,
                reply_to=self.reply_to,
                deadline=now + float(timeout_s),
                timeout_s=float(timeout_s),
                sent_at=now,
            )
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ClientError(f"bad call: {exc}") from None


def _local(request: ToolCallRequest, status: Status, message: str) -> ToolCallResult:
    return ToolCallResult.failure(request, status, message, queued_s=0.0)


def _done(future: CallFuture, result: ToolCallResult) -> CallFuture:
    if not future.done():
        future.set_result(result)
    return future


def _never_sent(exc: redis.ConnectionError) -> bool:
    """True when redis-py failed to connect (the command cannot have reached Redis)."""
    return "connecting to" in str(exc) or isinstance(exc.__cause__, ConnectionRefusedError)


def _arguments_size(arguments: Arguments) -> int:
    if arguments is None:
        return 0
    if isinstance(arguments, str):
        return len(arguments.encode("utf-8", "surrogatepass"))
    return len(codec.dumps(arguments))
