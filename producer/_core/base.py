"""``ClientBase``: what both clients share that does no I/O (httpx's ``BaseClient`` idea)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolfleet.producer._core.calls import build_request, check_timeout, make_context
from toolfleet.producer._core.config import configure
from toolfleet.producer._core.steps import ProducerCore
from toolfleet.shared.errors import ClientClosedError, ClientError
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import ToolCallRequest

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ClientBase"]


class ClientBase:
    """Configuration, the per-process core, and the counters of a client.

    Args: those of ``ToolClient`` (``asyncio``: which flavour of redis-py it takes).

    Attributes:
        settings, namespace, max_in_flight, submit_timeout_s: as configured.
        redis_url: the Redis URL, or ``None`` for a client built on a caller's client or pool.
        where: the Redis, printable (password masked).
        client_id, reply_to: this process's identity (new after ``fork()``).
    """

    #: the shell's reply listener (``mark_soon``, ``rearm``)
    _listener: Any

    def __init__(
        self,
        redis_url: str | None,
        namespace: str | None,
        settings: Settings | None,
        redis_client: Any,
        connection_pool: Any,
        max_in_flight: int,
        submit_timeout_s: float,
        *,
        asyncio: bool,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if registry is not None:
            from toolfleet.producer import metrics  # lazily, as the core's observations

            try:
                metrics.register(registry)
            except ValueError as exc:
                raise ClientError(f"registry: {exc}") from exc
        config = configure(redis_url, namespace=namespace, settings=settings,
                           redis_client=redis_client, connection_pool=connection_pool,
                           max_in_flight=max_in_flight, submit_timeout_s=submit_timeout_s,
                           asyncio=asyncio)  # fmt: skip
        self._config = config
        self.settings, self.namespace = config.settings, config.namespace
        self.max_in_flight, self.submit_timeout_s = config.max_in_flight, config.submit_timeout_s
        self.redis_url, self.where = config.url, config.where
        self._closed = False

    def _new_core(self, slots: Any) -> None:
        """A fresh core (identity, pending calls, queue lengths, routes) for this process.

        ``slots`` (the shell's in-flight limit) get each call's slot back when it
        resolves; the shell's ``_listener`` marks canceled futures and re-arms its timer.
        """
        self._slots = slots
        self._core = ProducerCore(self._config, slots.release,
                                  lambda call_id: self._listener.mark_soon(call_id),
                                  lambda: self._listener.rearm())  # fmt: skip
        self.client_id = self._core.identity.client_id
        self.reply_to = self._core.identity.reply_to

    def _request(
        self, function: Any, arguments: Any, tool_call_id: Any, context: Any, timeout_s: Any
    ) -> ToolCallRequest:
        """A new request of this client (raises ``ClientError`` for bad arguments)."""
        return build_request(function, arguments, tool_call_id=tool_call_id,
                             context=make_context(context), timeout_s=check_timeout(timeout_s),
                             reply_to=self.reply_to)  # fmt: skip

    def _starter(self, tool_calls: Any, options: dict[str, Any]) -> Callable[[Any], Any]:
        """What a turn's stream calls to publish it (``options``: ``context``, ``timeout_s``)."""
        context, timeout_s = options.get("context"), options.get("timeout_s", 30.0)
        return lambda emit: self._start_turn(tool_calls, context, timeout_s, emit)  # type: ignore[attr-defined]

    def _live(self) -> None:
        """Make this process's client usable (start threads, check a fork)."""

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._live()

    @property
    def in_flight(self) -> int:
        """Calls published and not yet resolved."""
        return self._core.table.in_flight

    @property
    def late_replies(self) -> int:
        """Replies that came after their call was resolved (dropped)."""
        return self._core.table.late_replies
