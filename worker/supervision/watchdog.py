"""Answer ``timeout`` for calls whose worker process cannot, and replace that process.

A thread tool that holds the GIL (a long C call, a huge ``re`` or integer operation)
stops every thread of its process: the in-process time limit cannot fire, the reply
cannot be posted, other calls there cannot run. Nothing inside the process can help, so
the supervisor runs this watchdog beside it. Each worker process records its running
calls in ``<ns>:inflight:<worker id>`` with the time by which it answers them itself
(the limit plus its isolation's margin; see :class:`~toolfleet.worker.pipeline.ledger.InFlight`)
and removes a record in the same atomic step that posts the call's reply.

Every ``interval_s`` the watchdog reads the table each live process keeps of its running
calls in shared memory (:mod:`.inflight_table`: by when each is answered), with no Redis
command; only for a process with a call past its time (or without a table) does it read
the records in Redis. While it finds no running call, it looks less often (a record is
due at the earliest ``MIN_ANSWER_S`` after its claim, so the idle pause loses no time).
A record ``margin_s`` past its ``answer_by`` gets the ``timeout`` reply from here
(through :func:`~toolfleet.worker.pipeline.ledger.post_outcome`: if the process answered first,
nothing is posted; if it answers later, its late result is discarded), an error log line
naming the tool, the call and the process, and a count in
``toolfleet_tool_overruns_total{function}``. It is counted as every answered call is:
in ``toolfleet_tool_calls_total`` (status ``timeout``, from this process:
:class:`~toolfleet.worker.supervision.supervisor_counts.SupervisorCalls`), its
``tool_responded`` event on the events stream (written with the answer, in one script),
and, once per pass, in the per-minute aggregates and the failures index (one pipeline for
all the calls the pass answered). A late result of the process is discarded, and not
counted again (:meth:`~toolfleet.worker.pipeline.observe.Observer.answered`).

A record still there ``grace_s`` later means the process is not answering anything (and
it has not refreshed its broker heartbeat since, which any of its threads would do if one
could run): it is killed, so that the supervisor restarts it and hands its other calls
back to the queue (``recover_dead_worker``), where another process serves them within
their own deadlines; its calls' concurrency slots are freed just before the kill
(``forget_calls``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from pydantic import ValidationError

from toolfleet.shared import aggregates as agg
from toolfleet.shared import codec
from toolfleet.shared import failures as fl
from toolfleet.shared.metric_labels import NO_MODEL_LABEL
from toolfleet.shared.naming import broker_heartbeats_key, brokers_key, inflight_key
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallResult
from toolfleet.worker.messaging.recovery import forget_calls
from toolfleet.worker.pipeline.ledger import MIN_ANSWER_S, InFlight, Posted, post_outcome
from toolfleet.worker.supervision.inflight_table import TableReader
from toolfleet.worker.supervision.supervisor_counts import SupervisorCalls

__all__ = ["Watchdog", "start_watchdog"]

log = logging.getLogger("toolfleet.worker.watchdog")


class Watchdog:
    """Posts ``timeout`` for calls a hogged process cannot answer; replaces the process.

    Args:
        client: Redis client.
        namespace: key prefix.
        reply_ttl_s: seconds replies and outcomes are kept.
        processes: returns ``{worker id: pid}`` of the live worker processes.
        replace: kills the process of a pid (the supervisor restarts it).
        interval_s: seconds between two checks while calls run.
        margin_s: seconds past ``answer_by`` before the watchdog answers.
        grace_s: seconds after that before a process still not answering is replaced
            (at least its heartbeat interval, so a live one has refreshed its heartbeat).
        aggregates_ttl_s: seconds each minute's aggregates live (0: not counted there).
        failures_retention_s: seconds a failure stays in the failures index (0: none).
        failures_max: most failures the index keeps.
        tables: the processes' in-flight tables (``None``: read Redis every check).
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        reply_ttl_s: int,
        processes: Callable[[], dict[str, int]],
        replace: Callable[[int], None],
        *,
        interval_s: float = 0.1,
        margin_s: float = 0.25,
        grace_s: float = 1.0,
        aggregates_ttl_s: int = 86_400,
        failures_retention_s: int = 86_400,
        failures_max: int = 200_000,
        tables: TableReader | None = None,
    ) -> None:
        self.client = client
        self.tables = tables or TableReader(None)
        self.namespace = namespace
        self.reply_ttl_s = reply_ttl_s
        self.processes = processes
        self.replace = replace
        self.interval_s = interval_s
        self.margin_s = margin_s
        self.grace_s = grace_s
        self.overruns: dict[str, int] = {}
        self.calls = SupervisorCalls()
        self.aggregates_ttl_s = aggregates_ttl_s
        self.failures_retention_s = failures_retention_s
        self.failures_max = failures_max
        self._counted = agg.Accumulator()
        self._failed = fl.FailureLog()
        self._answered: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolfleet-watchdog", daemon=True)

    def start(self) -> None:
        """Start checking in a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (within ``interval_s``)."""
        self._stop.set()

    @property
    def idle_interval_s(self) -> float:
        """Seconds between two checks that found no running call.

        A call claimed after an empty check is due ``MIN_ANSWER_S + margin_s`` after its
        claim at the earliest; the next check, this long after, sees it in time to answer
        it as promptly as a check every ``interval_s`` would.
        """
        return max(self.interval_s, MIN_ANSWER_S + self.margin_s - self.interval_s)

    def _run(self) -> None:
        failing = False
        pause = self.interval_s
        while not self._stop.wait(pause):
            try:
                running = self.check(time.time())
                pause = self.interval_s if running else self.idle_interval_s
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("watchdog cannot read Redis: %s; retrying", exc)
                failing = True

    def check(self, now: float) -> int:
        """One pass over every live process's running calls (``now``: epoch seconds).

        Returns:
            How many in-flight records it read.

        Raises:
            redis.RedisError: Redis failed.
        """
        processes = self.processes()
        self.tables.forget_all_but(set(processes.values()))
        pending = {worker_id for worker_id, _ in self._answered}
        running = 0
        due: dict[str, int] = {}
        for worker_id, pid in processes.items():
            earliest, count = self.tables.earliest(pid)
            if worker_id in pending or earliest == 0.0:
                due[worker_id] = pid  # followed up, or no table to trust: read Redis
            elif earliest is not None and now >= earliest + self.margin_s:
                due[worker_id] = pid
            else:
                running += count
        if not due:
            self._answered = {}
            return running
        pipe = pipeline(self.client)
        for worker_id in due:
            pipe.hgetall(inflight_key(self.namespace, worker_id))
        seen: set[tuple[str, str]] = set()
        for (worker_id, pid), records in zip(due.items(), pipe.execute(), strict=True):
            running += len(records)
            for raw in records.values():
                try:
                    record = InFlight.model_validate_json(raw)
                except ValidationError:
                    continue
                key = (worker_id, record.id)
                if now < record.answer_by + self.margin_s:
                    continue
                seen.add(key)
                answered_at = self._answered.get(key)
                if answered_at is None:
                    self._answer(worker_id, pid, record)
                    self._answered[key] = now
                elif now - answered_at >= self.grace_s and not self._beat_since(
                    worker_id, answered_at
                ):
                    log.error(
                        "worker process pid %d answers nothing since tool %s overran its "
                        "limit (call %s); replacing the process", pid, record.function, record.id,
                    )  # fmt: skip
                    forget_calls(self.client, self.namespace, worker_id)  # frees its slots
                    self.replace(pid)
        self._answered = {key: at for key, at in self._answered.items() if key in seen}
        self._flush()
        return running

    def _flush(self) -> None:
        """Write the aggregates and failures of the calls answered since the last write.

        One pipeline per pass that answered any; kept for the next pass when Redis fails.

        Raises:
            redis.RedisError: Redis failed.
        """
        if not len(self._failed):
            return
        counts, failed = self._counted.drain(), self._failed.drain()
        pipe = self.client.pipeline(transaction=False)
        if self.aggregates_ttl_s > 0:
            agg.write(pipe, self.namespace, counts, self.aggregates_ttl_s)
        fl.write(pipe, self.namespace, failed, self.failures_retention_s, self.failures_max)
        try:
            pipe.execute()
        except BaseException:
            self._counted.restore(counts)
            self._failed.restore(failed)
            raise

    def _beat_since(self, worker_id: str, since: float) -> bool:
        """True when the process refreshed its broker heartbeat after ``since`` (epoch s).

        A hogged process cannot: every thread that would (its consumer, its catalog
        heartbeat) waits for the GIL. One that is merely slow to answer can.
        """
        broker_id = self.client.hget(brokers_key(self.namespace), worker_id)
        if broker_id is None:
            return False
        beat_ms = self.client.zscore(broker_heartbeats_key(self.namespace), broker_id)
        return beat_ms is not None and beat_ms / 1000 > since

    def _answer(self, worker_id: str, pid: int, record: InFlight) -> None:
        result = ToolCallResult(
            id=record.id,
            tool_call_id=record.tool_call_id,
            function=record.function,
            status=Status.TIMEOUT,
            content={"error": f"the tool did not finish within {record.limit_s:.3g} s"},
            run_s=record.limit_s,
            worker=worker_id,
        )
        envelope = ReplyEnvelope(type="result", result=result).encode()
        now = time.time()
        event = {
            "kind": "tool_responded", "at": now, "id": record.id, "function": record.function,
            "extension": "", "account": None, "worker": worker_id, "traceparent": None,
            "status": Status.TIMEOUT.value, "queued_s": None, "run_s": record.limit_s,
            "result": None, "error": result.error, "answered_by": "watchdog",
        }  # fmt: skip
        posted = post_outcome(
            self.client,
            self.namespace,
            f"{worker_id}:watchdog",  # the record stays: it shows whether the process answers
            record.id,
            record.reply_to,
            envelope,
            self.reply_ttl_s,
            self.reply_ttl_s,
            events=[codec.dumps(event)],
        )
        if posted == Posted.ALREADY_ANSWERED:
            return
        self.overruns[record.function] = self.overruns.get(record.function, 0) + 1
        self.calls.inc(record.function, "", Status.TIMEOUT.value, NO_MODEL_LABEL)
        self._counted.record(
            record.function, NO_MODEL_LABEL, Status.TIMEOUT.value, run_s=record.limit_s, at_s=now
        )
        self._failed.add(
            fl.record(
                record.id,
                record.function,
                Status.TIMEOUT.value,
                result.error,
                worker=worker_id,
                at_s=now,
            )  # fmt: skip
        )
        log.error(
            "tool %s held worker process pid %d past its %.3g s limit (call %s); answered "
            "timeout from the supervisor", record.function, pid, record.limit_s, record.id,
        )  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        """``toolfleet_tool_overruns_total{function}`` (a Prometheus collector)."""
        family = CounterMetricFamily(
            "toolfleet_tool_overruns",
            "Calls the watchdog answered timeout because their process could not, by function.",
            labels=["function"],
        )
        for function, count in sorted(dict(self.overruns).items()):
            family.add_metric([function], count)
        yield family


def start_watchdog(
    client: redis.Redis,
    namespace: str,
    reply_ttl_s: int,
    pids: Callable[[], list[int]],
    registry: CollectorRegistry | None,
    heartbeat_interval_s: float = 2.0,
    tables_dir: str | Path | None = None,
    **counting: int,
) -> Watchdog:
    """Start the watchdog of a supervisor's processes (``pids``: the live ones).

    A process to replace gets SIGKILL (the supervisor sees it exit and restarts it), at
    the earliest ``max(1, 1.5 x heartbeat_interval_s)`` seconds after the watchdog
    answered for it. The overrun counter joins ``registry`` when there is one. The
    processes write their in-flight tables to ``tables_dir``. ``counting``:
    :class:`Watchdog`'s ``aggregates_ttl_s``, ``failures_retention_s`` and ``failures_max``.
    """
    host = socket.gethostname()

    def processes() -> dict[str, int]:
        return {f"{host}:{pid}": pid for pid in pids()}

    def replace(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    grace_s = max(1.0, 1.5 * heartbeat_interval_s)
    watchdog = Watchdog(
        client, namespace, reply_ttl_s, processes, replace, grace_s=grace_s,
        tables=TableReader(tables_dir), **counting,
    )  # fmt: skip
    if registry is not None:
        registry.register(watchdog)
    watchdog.start()
    return watchdog
