"""toolfleet's Dramatiq middleware: messages that are not tool calls fail and are answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from dramatiq import Broker, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.middleware import SkipMessage

__all__ = ["FleetMiddleware"]


class FleetMiddleware(Middleware):
    """toolfleet's handling of messages that are not tool calls.

    toolfleet runs without Dramatiq's ``Retries`` (its default of 20 retries would run a
    tool with side effects again) and without its ``TimeLimit`` (it cannot interrupt a
    blocking call; the toolkit enforces limits itself). Without ``Retries`` nothing marks
    a message failed, so a message whose actor raised would be acknowledged and lost;
    this middleware marks it failed, so that Dramatiq dead-letters it, and answers
    ``rejected`` where a reply address can be read. The same goes for a message naming an
    actor this worker does not have. It also declares the ``throws`` actor option.

    Attributes:
        reject: ``reject(raw_request, why)`` posts a ``rejected`` reply when it can.
    """

    def __init__(self) -> None:
        self.reject: Callable[[Any, str], object] | None = None

    @property
    def actor_options(self) -> set[str]:
        """The options this middleware lets actors declare."""
        return {"throws"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        """Dead-letter (and answer) a message for an actor that does not exist here."""
        if message.actor_name not in broker.actors:
            self._reject(message, f"no actor {message.actor_name!r} on this worker")
            message.fail()
            raise SkipMessage(message.actor_name)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        """Mark a message whose actor raised as failed, so Dramatiq dead-letters it."""
        if exception is None:
            return
        if isinstance(exception, redis.RedisError):
            # the request was fine and Redis failed (the ledger retried until the deadline):
            # not a rejection; the caller resolves it at its deadline
            return
        if type(exception).__name__ != "RejectedMessage":  # already answered by the actor
            self._reject(message, f"{type(exception).__name__}: {exception}")
        message.fail()

    def _reject(self, message: MessageProxy, why: str) -> None:
        if self.reject is not None:
            self.reject(message.args[0] if message.args else None, why)
