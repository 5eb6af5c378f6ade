"""A worker process's own loop on Dramatiq's queues: fetchers and slot threads.

Per process, ``threads`` slot threads and, per queue, a fetcher (:mod:`.fetch`) that waits
in Redis and takes at most as many messages as there are free slots. A slot thread takes a
fetched message and walks it through the remaining stages itself
(:class:`~.handler.CallHandler`: admit, run, complete); a plain sync tool runs on it. When
such a tool overruns its limit (or its call is canceled), the process's timer starts a
fresh slot thread that answers the call and takes the slot; the abandoned thread ends
when its tool returns (:class:`~toolfleet.worker.isolation.inproc.Abandoned`), its late
result dropped. A message whose call ended
without an answer that acknowledged it is acknowledged here as Dramatiq's worker would,
and one that was not a request is dead-lettered. No Dramatiq ``Worker``, worker thread or
middleware runs: Dramatiq is the transport only (its message format and keys).

:meth:`CallLoop.stop` drains: the fetchers stop (their waits end at once), every message
already fetched is still run, and the slot threads end within the grace period. A call
still running when the grace runs out is answered ``crashed`` before the process exits
(:meth:`~.handler.CallHandler.answer_started`); one fetched and not started goes back to
its queue unclaimed (one waiting for a fleet-wide slot is not claimed yet and goes back
with the process's recovery).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

import redis

from toolfleet.shared.naming import actor_name_for
from toolfleet.worker.isolation.inproc import Abandoned, mark_slot_thread
from toolfleet.worker.messaging.broker import FleetRedisBroker
from toolfleet.worker.pipeline.fetch import DelayFetcher, Delivery, QueueFetcher, Slots
from toolfleet.worker.pipeline.handler import CallHandler, RejectedMessage
from toolfleet.worker.pipeline.ledger import InlineAck

__all__ = ["HAND_BACK_PAUSE_S", "CallLoop"]

log = logging.getLogger("toolfleet.worker.loop")

#: Seconds this process's fetcher of a queue pauses after handing a call back, per time
#: that call was handed back: a worker that serves the name fetches it meanwhile.
HAND_BACK_PAUSE_S = 0.05


class CallLoop:
    """Fetchers and slot threads of one worker process.

    Args:
        broker: the process's broker (Dramatiq's keys and scripts).
        handler: admits, runs and completes each call.
        queues: served queue -> the queue it is answered and counted as (itself, or the
            public queue of a private affinity queue).
        threads: slot threads (calls run at once).
        connect: makes a client for a fetcher's blocking wait (the process's factory).
        reject: ``reject(raw, why)`` answers ``rejected`` where a reply address can be read.
    """

    def __init__(
        self,
        broker: FleetRedisBroker,
        handler: CallHandler,
        queues: dict[str, str],
        threads: int,
        connect: Callable[[], Any],
        reject: Callable[[Any, str], object],
    ) -> None:
        self.broker = broker
        self.handler = handler
        self.reject = reject
        self.slots = Slots(threads)
        self.inbox: SimpleQueue[Delivery | None] = SimpleQueue()
        self._current = threading.local()
        handler.hand_back = self._hand_back
        handler.pipeline.runner.on_abandon = self._replace
        self._threads_lock = threading.Lock()
        names = frozenset(actor_name_for(queue) for queue in queues)
        self.fetchers: list[QueueFetcher | DelayFetcher] = []
        for queue, counted_as in sorted(queues.items()):
            self.fetchers.append(
                QueueFetcher(
                    broker, queue, counted_as, self.slots, self.inbox, names, connect, handler
                )
            )
            self.fetchers.append(DelayFetcher(broker, queue, connect))
        #: the slot threads serving now (an abandoned one leaves, its replacement joins)
        self.threads = [
            threading.Thread(target=self._serve, name=f"toolfleet-slot-{i}", daemon=True)
            for i in range(threads)
        ]
        self._replaced = 0

    def start(self) -> None:
        """Start the slot threads, then the fetchers."""
        for thread in self.threads:
            thread.start()
        for fetcher in self.fetchers:
            fetcher.start()

    def stop(self, grace_s: float) -> None:
        """Stop fetching, run what was fetched, and wait up to ``grace_s`` for the calls."""
        give_up = time.monotonic() + grace_s
        for fetcher in self.fetchers:
            fetcher.stop()
        self.slots.wake()
        for fetcher in self.fetchers:
            fetcher.join(max(0.1, give_up - time.monotonic()))
        with self._threads_lock:
            serving = list(self.threads)
        for _ in serving:
            self.inbox.put(None)  # after every fetched message: the inbox is FIFO
        for thread in serving:
            thread.join(max(0.0, give_up - time.monotonic()))
        with self._threads_lock:
            serving = list(self.threads)  # replacements started meanwhile too
        for thread in serving:
            thread.join(max(0.0, give_up - time.monotonic()))
        left = sum(thread.is_alive() for thread in serving)
        if left:
            self._give_back_unstarted()
            answered = self.handler.answer_started()
            log.warning(
                "%d calls still running at the end of the grace period; %d answered crashed",
                left, answered,
            )  # fmt: skip

    def _give_back_unstarted(self) -> None:
        """Put the messages fetched and not started back on their queues, claims given up.

        At the end of a drain whose grace ran out: every slot thread is busy, and the
        process exits without running them.
        """
        while True:
            try:
                delivery = self.inbox.get_nowait()
            except Empty:
                return
            if delivery is None:
                continue
            try:
                if delivery.claim is not None and delivery.claim.state == 1:
                    self.handler.drop_claim(delivery.redis_id)
                self.broker.do_requeue(delivery.queue, delivery.redis_id)
            except redis.RedisError as exc:  # its recovery gives it back
                log.warning("message %s not given back: %s", delivery.redis_id, exc)

    def _serve(self, first: Callable[[], None] | None = None) -> None:
        """Serve fetched messages until the inbox says stop (``None``).

        ``first``: the answer of an abandoned call, given before serving (a replacement).
        """
        mark_slot_thread()
        if first is not None:
            try:
                first()
            except Exception:  # noqa: BLE001 - the slot thread outlives any one call
                log.exception("could not answer an abandoned call")
            self.slots.give(1)  # the abandoned call's slot
        inbox = self.inbox
        while True:
            delivery = inbox.get()
            if delivery is None:
                return
            try:
                self._current.delivery = delivery
                self._handle(delivery)
            except Abandoned:  # answered by this thread's replacement, which holds the slot
                log.info("a thread whose call was answered without it ended (call of %s)",
                         delivery.redis_id)  # fmt: skip
                return
            except BaseException:  # noqa: BLE001 - the slot thread outlives any one call
                log.exception("call of message %s failed", delivery.redis_id)
            finally:
                self._current.delivery = None
            self.slots.give(1)

    def _replace(self, first: Callable[[], None], abandoned: threading.Thread) -> None:
        """Start a slot thread that runs ``first()`` and then serves in ``abandoned``'s place."""
        with self._threads_lock:
            self._replaced += 1
            thread = threading.Thread(
                target=self._serve,
                args=(first,),
                name=f"toolfleet-slot-r{self._replaced}",
                daemon=True,
            )
            self.threads = [t for t in self.threads if t is not abandoned] + [thread]
        thread.start()

    def _handle(self, delivery: Delivery) -> None:
        """Answer one message, then settle it as Dramatiq's worker would."""
        message = delivery.message
        ack = self.broker.inline_ack(delivery.queue, delivery.redis_id)
        args = message.args
        raw = args[0] if isinstance(args, list | tuple) and args else None
        failed = False
        try:
            if not isinstance(args, list | tuple) or len(args) != 1 or message.kwargs:
                raise TypeError("a toolfleet message takes exactly one argument, the request")
            self.handler.handle(raw, delivery.counted_as, ack, delivery.claim)
        except RejectedMessage:  # answered already
            failed = True
        except redis.RedisError as exc:
            # the request was fine and Redis failed (the ledger retried until the deadline):
            # not a rejection; the caller resolves it at its deadline
            log.warning("message %s left unanswered: %s", delivery.redis_id, exc)
        except Exception as exc:  # noqa: BLE001 - answered rejected and dead-lettered
            self.reject(raw, f"{type(exc).__name__}: {exc}")
            failed = True
        if failed or not ack.done:
            self.broker.settle(delivery.queue, delivery.redis_id, failed=failed)

    def _hand_back(self, ack: InlineAck, times: int) -> None:
        """Put the current message back at the end of its queue (Dramatiq's ``requeue``).

        This process's fetcher of that queue then pauses ``times * HAND_BACK_PAUSE_S``
        seconds, so that the message is not fetched by this process again at once.

        Raises:
            redis.RedisError: Redis failed.
        """
        delivery: Delivery | None = getattr(self._current, "delivery", None)
        if delivery is None:
            raise redis.RedisError("no current message")
        self.broker.pause_fetch(delivery.queue, times * HAND_BACK_PAUSE_S)
        self.broker.do_requeue(delivery.queue, ack.redis_id)
