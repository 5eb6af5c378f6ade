"""Group commit: one script call writes every call that finished since the last write.

A worker process has one :class:`Completer`. A thread whose call finished hands it the
call's :class:`Outcome` and waits until it is written. When no write is in flight the
thread writes at once, itself (a lone call waits for nothing and changes no thread);
while one is in flight, finished calls accumulate and the next writer takes them all,
up to :attr:`Completer.max_batch`, in **one** run of ``finish.lua``: per call its
acknowledgement, outcome (``SET NX``), events and reply, exactly as one call's write did
(the database's group commit, river's ``BatchCompleter``).

Each call keeps the rules of its own write: while Redis is unreachable the batch is
retried with backoff, and a call whose deadline comes first leaves it with the error
(:class:`redis.ConnectionError` or :class:`redis.TimeoutError`, raised in its own
thread, as before); any other Redis error of a batch is retried call by call, so it
stays the error of the call that caused it. A retry after a lost response finds the
outcomes and posts nothing more. A process killed between a tool's end and the write is
the case of a process killed mid-run: its messages are unacknowledged and its claims
held, and the redelivery rules of :mod:`~toolfleet.worker.pipeline.ledger` answer them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from toolfleet.shared import scripts
from toolfleet.shared.cancels import REQUESTED
from toolfleet.shared.naming import cancel_key, events_key, inflight_key, outcome_key

__all__ = [
    "RETRY_BACKOFF_S",
    "Completer",
    "InlineAck",
    "Outcome",
    "Posted",
    "post_outcome",
    "post_outcomes",
]

log = logging.getLogger("toolfleet.worker.completer")

#: Seconds between attempts while Redis is unreachable (the last one repeats).
RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)

#: The finish script (``finish.lua``: what it takes and returns is written at its head),
#: hashed once; run on the client given at each call.
_FINISH_SCRIPT = scripts.script("finish", REQUESTED=REQUESTED.decode())


class Posted:
    """What writing one call's outcome did (:func:`post_outcome`, :meth:`Completer.complete`)."""

    #: an outcome existed already: nothing was written (a late result, discarded)
    ALREADY_ANSWERED = 0
    #: the outcome was recorded and the reply posted
    POSTED = 1
    #: the outcome was recorded; no reply, because the producer resolved the call itself
    RESOLVED_BY_PRODUCER = 2


@dataclass
class InlineAck:
    """A Dramatiq message to acknowledge in the script that answers its call.

    Made by the broker for the message a worker thread is handling; the consumer skips its
    own acknowledgement round trip when ``done``.

    Attributes:
        acks_key: the consumer's Dramatiq acks set (``<ns>:__acks__.<broker id>.<queue>``).
        msgs_key: the queue's Dramatiq messages hash (``<ns>:<queue>.msgs``).
        redis_id: the message's ``redis_message_id``.
        done: set once a script that acknowledged it returned.
    """

    acks_key: str
    msgs_key: str
    redis_id: str
    done: bool = False


@dataclass
class Outcome:
    """One call's write: its outcome, reply, events and acknowledgement.

    Attributes:
        call_id: the request id.
        reply_to: the caller's reply list.
        envelope: the encoded result envelope (the outcome and the reply).
        ttl_s: seconds the outcome is kept.
        reply_ttl_s: seconds the reply list is kept.
        events: encoded lifecycle events, appended only when the outcome is recorded.
        ack: the Dramatiq message to acknowledge in the same script, or None.
        deadline: Unix epoch seconds past which a write Redis cannot take is given up.
        on_posted: called by the thread that wrote the batch, with the :class:`Posted`
            value, before the batch's metrics go out (how the call is counted).
    """

    call_id: str
    reply_to: str
    envelope: bytes
    ttl_s: int
    reply_ttl_s: int
    events: list[bytes] = field(default_factory=list)
    ack: InlineAck | None = None
    deadline: float = 0.0
    on_posted: Callable[[int], None] | None = None


def post_outcomes(
    client: redis.Redis,
    namespace: str,
    worker_id: str,
    outcomes: Sequence[Outcome],
    events_maxlen: int = 100_000,
) -> list[int | redis.ResponseError]:
    """Record each call's outcome and post its reply, unless it was answered already.

    One atomic script for all of ``outcomes``; each call is written as if alone (see
    ``finish.lua``). Every ack written is marked ``done`` when the script returned.

    Args:
        client: Redis client (on a cluster, every key of the batch is in one slot: the
            keys of one queue group).
        namespace: key prefix.
        worker_id: the in-flight hash to clear is this worker's.
        outcomes: the calls to write, in order.
        events_maxlen: the events stream is capped at about this many entries.

    Returns:
        One :class:`Posted` value per call, in order, or the :class:`redis.ResponseError`
        of a call whose own cancel marker or reply list is a key of another type (the
        other calls are written all the same).

    Raises:
        redis.RedisError: Redis failed (some calls of the batch may have been written:
            a second write of those finds their outcome and writes nothing).
    """
    keys = [inflight_key(namespace, worker_id), events_key(namespace)]
    argv: list[Any] = [events_maxlen, len(outcomes)]
    for outcome in outcomes:
        ack = outcome.ack
        keys += [
            outcome_key(namespace, outcome.call_id),
            outcome.reply_to,
            cancel_key(namespace, outcome.call_id),
        ]
        if ack is not None:
            keys += [ack.acks_key, ack.msgs_key]
        argv += [
            outcome.envelope,
            outcome.ttl_s,
            outcome.reply_ttl_s,
            outcome.call_id,
            ack.redis_id if ack is not None else "",
            len(outcome.events),
            *outcome.events,
        ]
    posted = [
        value if isinstance(value, redis.ResponseError) else int(value)
        for value in _FINISH_SCRIPT(keys, argv, client=client)
    ]
    for outcome in outcomes:
        if outcome.ack is not None:
            outcome.ack.done = True
    return posted


def post_outcome(
    client: redis.Redis,
    namespace: str,
    worker_id: str,
    call_id: str,
    reply_to: str,
    envelope: bytes,
    ttl_s: int,
    reply_ttl_s: int,
    events: list[bytes] | None = None,
    events_maxlen: int = 100_000,
    ack: InlineAck | None = None,
) -> int:
    """Record one call's outcome and post its reply, unless it was answered already (atomic).

    :func:`post_outcomes` for one call.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_id: the in-flight hash to clear is this worker's.
        call_id: the request id.
        reply_to: the caller's reply list.
        envelope: the encoded result envelope.
        ttl_s: seconds the outcome is kept.
        reply_ttl_s: seconds the reply list is kept.
        events: encoded lifecycle events, appended only when the outcome is recorded.
        events_maxlen: the events stream is capped at about this many entries.
        ack: the Dramatiq message to acknowledge in the same script (marked ``done`` when
            the script returned), or None.

    Returns:
        A :class:`Posted` value.

    Raises:
        redis.RedisError: Redis failed.
    """
    outcome = Outcome(call_id, reply_to, envelope, ttl_s, reply_ttl_s, events or [], ack)
    (posted,) = post_outcomes(client, namespace, worker_id, [outcome], events_maxlen)
    if isinstance(posted, redis.ResponseError):
        raise posted
    return posted


class _Waiting:
    """A call handed to the completer, until its write is settled."""

    __slots__ = ("done", "error", "outcome", "posted")

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.done = False
        self.posted = 0
        self.error: BaseException | None = None


class Completer:
    """Writes the outcomes of one worker process's calls, every finished call per write.

    Thread-safe: each of the process's worker threads calls :meth:`complete`.

    Args:
        client: Redis client.
        namespace: key prefix (the queue group's, on a cluster).
        worker_id: this process's id (its in-flight hash is cleared of each call written).
        events_maxlen: the events stream is capped at about this many entries.
        max_batch: most calls written by one script call.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        worker_id: str,
        events_maxlen: int = 100_000,
        max_batch: int = 256,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.worker_id = worker_id
        self.events_maxlen = events_maxlen
        self.max_batch = max_batch
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[_Waiting] = []
        self._writing = False
        #: called after each batch is written and its calls counted (the process's
        #: in-memory metrics go out then: a process killed later has lost none of them)
        self.after_write: Callable[[], None] | None = None

    def complete(self, outcome: Outcome) -> int:
        """Write ``outcome`` with every other call finished meanwhile; return when written.

        Returns:
            A :class:`Posted` value.

        Raises:
            redis.ConnectionError, redis.TimeoutError: Redis was still unreachable at the
                call's ``deadline``.
            redis.RedisError: Redis refused the call's write.
        """
        waiting = _Waiting(outcome)
        with self._cond:
            self._pending.append(waiting)
            while True:
                while not waiting.done and self._writing:
                    self._cond.wait()
                if waiting.done:
                    break
                self._writing = True
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                self._cond.release()
                try:
                    self._write(batch)
                finally:
                    self._cond.acquire()
                    # cut short (an exception raised in this thread): the rest waits again
                    self._pending[:0] = [item for item in batch if not item.done]
                    self._writing = False
                    self._cond.notify_all()
        if waiting.error is not None:
            raise waiting.error
        return waiting.posted

    def _settle(self, items: Sequence[_Waiting]) -> None:
        with self._cond:
            for item in items:
                item.done = True
            self._cond.notify_all()

    def _write(self, batch: list[_Waiting], join: bool = True) -> None:
        """Write ``batch``, retrying while Redis is unreachable, each call until its deadline.

        ``batch`` is changed in place: calls settled leave it, and (``join``) at each retry
        the calls that finished meanwhile join it, so they too leave it at their deadline.
        """
        attempt = 0
        while batch:
            try:
                posted = post_outcomes(
                    self.client,
                    self.namespace,
                    self.worker_id,
                    [item.outcome for item in batch],
                    self.events_maxlen,
                )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                now = time.time()
                late = [item for item in batch if now + delay >= item.outcome.deadline]
                for item in late:
                    item.error = exc
                self._settle(late)
                batch[:] = [item for item in batch if not item.done]
                if attempt == 0 and batch:
                    log.warning(
                        "answer of %d calls (%s first): %s; retrying until their deadlines",
                        len(batch), batch[0].outcome.call_id, exc,
                    )  # fmt: skip
                if batch:
                    time.sleep(delay)
                if batch and join:
                    with self._cond:
                        room = self.max_batch - len(batch)
                        batch += self._pending[:room]
                        del self._pending[:room]
                attempt += 1
            except redis.RedisError as exc:
                if len(batch) == 1:
                    batch[0].error = exc
                    self._settle(batch)
                    return
                for item in list(batch):  # each alone: an error stays the call's that caused it
                    self._write([item], join=False)
                return
            else:
                for item, value in zip(batch, posted, strict=True):
                    if isinstance(value, redis.ResponseError):
                        item.error = value
                    else:
                        item.posted = value
                self._count(batch)
                self._settle(batch)
                return

    def _count(self, batch: list[_Waiting]) -> None:
        """Count the written calls of ``batch``, then hand the metrics on (once per batch)."""
        try:
            for item in batch:
                if item.error is None and item.outcome.on_posted is not None:
                    item.outcome.on_posted(item.posted)
            if self.after_write is not None:
                self.after_write()
        except Exception:  # noqa: BLE001 - metrics never hold up an answer
            log.exception("could not count the calls written")
