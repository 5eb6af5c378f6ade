"""``ClientBase``: what both clients share that does no I/O (httpx's ``BaseClient`` idea)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolfleet.producer._core.calls import (
    Arguments,
    build_request,
    check_budget,
    check_timeout,
    make_context,
)
from toolfleet.producer._core.config import configure
from toolfleet.producer._core.steps import ProducerCore
from toolfleet.shared.errors import ClientClosedError, ClientError
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import CallContext, ToolCallRequest

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ClientBase"]


class ClientBase(ABC):
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
    #: the shell's poller of the outcomes duplicates wait for (``wake``)
    _follower: Any

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
                                  lambda: self._listener.rearm(),
                                  lambda: self._follower.wake())  # fmt: skip
        self.client_id = self._core.identity.client_id
        self.reply_to = self._core.identity.reply_to

    def _request(
        self, function: Any, arguments: Any, tool_call_id: Any, context: Any, timeout_s: Any,
        call_id: Any = None, max_result_bytes: Any = None, *, schema_hash: Any = None,
    ) -> ToolCallRequest:  # fmt: skip
        """A new request of this client (raises ``ClientError`` for bad arguments)."""
        made = make_context(context)
        return build_request(function, arguments, tool_call_id=tool_call_id,
                             context=made, timeout_s=check_timeout(timeout_s),
                             reply_to=self.reply_to, call_id=call_id,
                             max_result_bytes=check_budget(max_result_bytes),
                             schema_hash=schema_hash,
                             context_checked=made is not context)  # fmt: skip

    def _starter(self, tool_calls: Any, options: dict[str, Any]) -> Callable[[Any], Any]:
        """What a turn's stream calls to publish it.

        ``options``: ``context``, ``timeout_s``, ``idempotency_key``, ``max_result_bytes``.
        """
        context, timeout_s = options.get("context"), options.get("timeout_s", 30.0)
        key = options.get("idempotency_key")
        budget = check_budget(options.get("max_result_bytes"))
        return lambda emit: self._start_turn(tool_calls, context, timeout_s, emit, key, budget)  # type: ignore[attr-defined]

    @abstractmethod
    def _live(self) -> None:
        """Make this process's client usable (start threads, check a fork)."""

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._live()

    # -- the public calls: documented once here, performed by each shell ------------------

    @abstractmethod
    def submit(self, function: str, arguments: Arguments = None, *,
               tool_call_id: str | None = None, context: CallContext | dict[str, Any] | None = None,
               timeout_s: float = 30.0, schema_hash: str | None = None,
               idempotency_key: str | None = None,
               max_result_bytes: int | None = None) -> Any:  # fmt: skip
        """Publish one call; its future resolves by ``timeout_s`` at the latest.

        ``function``: e.g. ``ext_bfcl_math_factorial``; ``arguments``: a JSON object or the
        model's raw JSON string; ``tool_call_id``: the model's id, carried through;
        ``context``: a :class:`CallContext` or a dict of its fields; ``timeout_s``: seconds
        to the deadline; ``schema_hash``: the schema hash the model was shown (the exported
        tool's ``toolfleet/schema_hash`` metadata, see ``tools(metadata=True)``): a worker
        whose tool's schema differs answers ``not_available`` ("the tool changed since it
        was listed: list tools again") without running it; ``idempotency_key``: names the
        call, so that submitting it again (same key and account) within ``reply_ttl_s``
        after its deadline runs nothing and resolves with the first call's outcome
        (``result.duplicate_of`` names it; see :mod:`toolfleet.shared.idempotency`);
        ``max_result_bytes``: the most bytes its result may take encoded, at least 64 (the
        model's context budget; the tool's ``result_shaping`` decides what a larger result
        becomes; ``None``: the worker's limit, which also caps it).
        Returns a ``CallFuture`` (``ToolClient``) or an ``AsyncCallFuture`` (awaited, from
        ``AsyncToolClient``); ``future.call_id`` is what :meth:`cancel` takes.

        Raises:
            ClientClosedError: the client is closed.
            BackpressureError: no in-flight slot within ``submit_timeout_s``.
            IdempotencyKeyError: ``idempotency_key`` was used for another function or other
                arguments (nothing was published).
            ClientError: bad arguments to this method.
        """

    @abstractmethod
    def call(self, function: str, arguments: Arguments = None, **options: Any) -> Any:
        """Make one tool call and wait for its result (same arguments and errors as ``submit``)."""

    @abstractmethod
    def dispatch(self, tool_calls: Any, *, context: CallContext | dict[str, Any] | None = None,
                 timeout_s: float = 30.0, on_event: Callable[[Any], object] | None = None,
                 idempotency_key: str | None = None,
                 max_result_bytes: int | None = None) -> Any:  # fmt: skip
        """Run every tool call of one model turn; return the answers to append, in order.

        ``tool_calls``: a Chat Completions, Responses or Anthropic message, its calls or
        blocks (dicts or SDK objects, :mod:`toolfleet.producer.turns`); one message per
        call in that format (per ``tool_call_id``: a later call repeating an id is answered
        ``rejected``, unpublished, in its ``result`` event only). All are published at once
        under one deadline ``timeout_s`` away (still running then: ``timeout``).
        ``on_event`` gets each ``CallEvent`` on the caller's thread (or loop); if it
        raises, the calls still running are canceled.
        ``max_result_bytes``: one budget for all the turn's results, split equally
        between its calls (at least 64 bytes each; :func:`turn_share`).
        ``idempotency_key``: as for :meth:`submit`, for each call of the turn by its
        position (the same turn again is answered with the first turn's outcomes).

        Raises:
            ClientClosedError: the client is closed.
            IdempotencyKeyError: ``idempotency_key`` was used for a different turn (raised
                once every call of this one is answered).
            ClientError: ``tool_calls`` is no known format, or a bad context or timeout.
        """

    @abstractmethod
    def stream(self, tool_calls: Any, **options: Any) -> Any:
        """Run a turn's calls and yield their ``CallEvent`` s as they happen.

        ``with client.stream(message, timeout_s=20) as events: for event in events: ...``
        yields per call ``queued`` → ``running`` → ``progress``… → ``result``; it ends after
        the last ``result``, by the deadline at the latest, and ``events.messages`` holds
        what :meth:`dispatch` returns. Leaving the block early cancels the calls still
        running. ``options``: ``context``, ``timeout_s``, ``idempotency_key``,
        ``max_result_bytes`` (as for :meth:`dispatch`).
        """

    @abstractmethod
    def tools(self, *, account: str | None = None, format: str = "openai",  # noqa: A002
              include_unavailable: bool = False, metadata: bool = False) -> Any:  # fmt: skip
        """The tools ``account`` may call (``include_unavailable``: all) in ``format``.

        Formats: ``openai``, ``openai-strict``, ``responses``, ``anthropic``, ``mcp``.
        ``mcp`` tools carry their schema hash in ``_meta["toolfleet/schema_hash"]``; with
        ``metadata`` the other formats carry it in ``metadata`` (strip that object before
        sending the list to the model's API); pass it to ``submit(schema_hash=...)``.

        Raises:
            ValueError: unknown format.
            ConnectionFailed: Redis unreachable or failing.
        """

    @abstractmethod
    def preparing(self, function: str, partial_arguments: str | dict[str, Any] | None = None,
                  *, tool_call_id: str | None = None, index: int = 0) -> Any:  # fmt: skip
        """The ``preparing`` event of a call the model is still writing (nothing published).

        Its ``description``: the tool's preparation text, the arguments so far filled in.

        Raises:
            ClientClosedError: the client is closed.
            ConnectionFailed: Redis unreachable or failing.
        """

    @abstractmethod
    def cancel(self, call_id: str) -> Any:
        """Cancel a call by its id (``future.call_id``), made by this client or another.

        This client's resolves ``canceled`` at once, another's gets ``canceled`` from the
        worker: a queued call never runs, a running ``async``/``process`` tool stops, a
        ``thread`` tool sees ``context.canceled``. False: it had its outcome already.
        """

    @abstractmethod
    def extension_errors(self) -> Any:
        """Extensions the live workers could not load -> why (secrets scrubbed).

        Raises:
            ConnectionFailed: Redis cannot be reached.
        """

    @abstractmethod
    def close(self, *, wait: bool = True) -> Any:
        """Stop the client; idempotent. No call is left unresolved.

        With ``wait``, calls in flight resolve first (each by its deadline at the
        latest); without, they resolve ``timeout`` now ("the client was closed").
        """

    @property
    def in_flight(self) -> int:
        """Calls published and not yet resolved."""
        return self._core.table.in_flight

    @property
    def late_replies(self) -> int:
        """Replies that came after their call was resolved (dropped)."""
        return self._core.table.late_replies
