"""Apply the hot-path proposals of the benchmark report to a COPY of toolfleet's sources.

Not part of toolfleet: an experiment kit for ``compare.py --variant``. Usage::

    mkdir -p /tmp/base/toolfleet && cp -r shared producer worker extensions /tmp/base/toolfleet/
    cp -r /tmp/base /tmp/prop
    python bench/experiments/proposals_patch.py /tmp/prop codec,pool,idle,listener,ackpipe,split
    python bench/compare.py --systems raw --variant base=/tmp/base --variant prop=/tmp/prop

Each patch is a literal text substitution written against the working tree of
2026-11-29 (a1ea414 + uncommitted changes); it fails loudly when that text moved.
"""

import pathlib
import sys

root = pathlib.Path(sys.argv[1]) / "toolfleet"
which = set(sys.argv[2].split(","))


def sub(rel, old, new, count=1):
    p = root / rel
    s = p.read_text()
    assert s.count(old) == count, (rel, old[:60], s.count(old))
    p.write_text(s.replace(old, new))


if "codec" in which:
    # 1. a 19-digit run only sends a document to the stdlib decoder when it starts an
    #    integer (not fraction digits like 0.0002801418304443359)
    sub(
        "shared/codec.py",
        '_LONG_DIGITS_BYTES = re.compile(rb"\\d{19}")',
        '_LONG_DIGITS_BYTES = re.compile(rb"(?<![.\\d])\\d{19}")',
    )
    sub(
        "shared/codec.py",
        '_LONG_DIGITS_STR = re.compile(r"\\d{19}")',
        '_LONG_DIGITS_STR = re.compile(r"(?<![.\\d])\\d{19}")',
    )
    # 2. requests leave out None fields (decoding restores the defaults), so the
    #    NaN walk in codec.dumps (triggered by any b"null") is skipped
    sub(
        "shared/wire.py",
        'return codec.dumps(self.model_dump(mode="python", exclude_defaults=False))',
        'return codec.dumps(self.model_dump(mode="python", exclude_none=True))',
    )

if "pool" in which:
    p = root / "worker/isolation/inproc.py"
    s = p.read_text()
    s = s.replace(
        "import concurrent.futures\n", "import concurrent.futures\nimport queue as _queue\n", 1
    )
    s = s.replace(
        """class InProcessRunner:""",
        '''class _Slot:
    """A reusable tool thread: runs tasks handed to it, rejoins the idle list after each."""

    IDLE_EXIT_S = 60.0

    def __init__(self, pool: "_Threads") -> None:
        self.pool = pool
        self.tasks: _queue.SimpleQueue[Callable[[], None]] = _queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="toolfleet-tool", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                task = self.tasks.get(timeout=self.IDLE_EXIT_S)
            except _queue.Empty:
                with self.pool.lock:
                    if self in self.pool.idle:
                        self.pool.idle.remove(self)
                        return
                continue
            task()
            with self.pool.lock:
                self.pool.idle.append(self)


class _Threads:
    """Threads for sync tools, reused; a stuck tool keeps its thread, others get new ones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Slot] = []

    def run(self, task: Callable[[], None]) -> threading.Thread:
        with self.lock:
            slot = self.idle.pop() if self.idle else None
        if slot is None:
            slot = _Slot(self)
        slot.tasks.put(task)
        return slot.thread


class InProcessRunner:''',
        1,
    )
    s = s.replace(
        """        self.abandoned_total = 0
""",
        """        self.abandoned_total = 0
        self._threads = _Threads()
""",
        1,
    )
    old = """        thread = threading.Thread(target=target, name="toolfleet-tool", daemon=True)
        thread.start()
        how = wait_first(future, handle, limit_s)"""
    assert s.count(old) == 1
    s = s.replace(
        old,
        """        thread = self._threads.run(target)
        how = wait_first(future, handle, limit_s)""",
    )
    p.write_text(s)

if "idle" in which:
    p = root / "worker/messaging/broker.py"
    s = p.read_text()
    s = s.replace(
        """#: Seconds to pause when the prefetch window is full""",
        """#: Longest time an idle consumer goes without running the fetch script (which also
#: refreshes Dramatiq's broker heartbeat, read by maintenance after 60 s).
IDLE_FETCH_S = 10.0
#: Seconds to pause when the prefetch window is full""",
        1,
    )
    s = s.replace(
        """        self._failures = 0
""",
        """        self._failures = 0
        self._idle_since_fetch: float | None = None
""",
        1,
    )
    old = """                fetched = self.broker.do_fetch(
                    self.queue_name, self.prefetch - self.outstanding_message_count
                )
                self._failures = 0
                if fetched:
                    self.message_cache = fetched
                    continue
                self.broker.client.blmove(self._queue_key, self._queue_key, WAIT_S, "LEFT", "LEFT")
                return None"""
    assert s.count(old) == 1, "consumer"
    s = s.replace(
        old,
        """                idle = self._idle_since_fetch
                if idle is None or time.monotonic() - idle > IDLE_FETCH_S:
                    fetched = self.broker.do_fetch(
                        self.queue_name, self.prefetch - self.outstanding_message_count
                    )
                    self._failures = 0
                    if fetched:
                        self._idle_since_fetch = None
                        self.message_cache = fetched
                        continue
                    self._idle_since_fetch = idle or time.monotonic()
                woke = self.broker.client.blmove(
                    self._queue_key, self._queue_key, WAIT_S, "LEFT", "LEFT"
                )
                if woke is not None:
                    self._idle_since_fetch = None  # the queue has work: fetch on the next call
                return None""",
    )
    old2 = """        if queue_name == dq_name(q_name(queue_name)):
            return super().consume(queue_name, prefetch, timeout)
"""
    if old2 in s:
        s = s.replace(old2, "")
    else:
        print("WARNING: DQ branch not found")
    p.write_text(s)
print("patched", root, which)

if "listener" in which:
    sub(
        "producer/listener.py",
        """                item = client.blpop([self.key], timeout=MAX_WAIT_S)
                if item is not None:
                    batch = [item[1], *(client.lpop(self.key, DRAIN_BATCH) or [])]
                    self._deliver(batch)""",
        """                item = client.blmpop(
                    MAX_WAIT_S, 1, self.key, direction="LEFT", count=DRAIN_BATCH
                )
                if item is not None:
                    self._deliver(item[1])""",
    )

if "ackpipe" in which:
    sub(
        "worker/pipeline/ledger.py",
        '''        events: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record the outcome, post the reply, append lifecycle events (one round trip).''',
        '''        events: list[dict[str, Any]] | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> None:
        """Record the outcome, post the reply, append lifecycle events (one round trip).''',
    )
    sub(
        "worker/pipeline/ledger.py",
        """            pipe.expire(request.reply_to, self.reply_ttl_s)
            pipe.execute()

        self._retrying(request, "answer", write)""",
        """            pipe.expire(request.reply_to, self.reply_ttl_s)
            if also is not None:
                also(pipe)
            pipe.execute()

        self._retrying(request, "answer", write)""",
    )
    sub(
        "worker/messaging/actors.py",
        """        try:
            self.ledger.finish(request, result, events)
        except codec.EncodeError as exc:""",
        """        message = CurrentMessage.get_current_message()
        try:
            self.ledger.finish(request, result, events, also=_ack_in(message))
            if message is not None:
                message.options["toolfleet_acked"] = True
        except codec.EncodeError as exc:""",
    )
    sub(
        "worker/messaging/actors.py",
        """def _arguments_size(request: ToolCallRequest) -> int:""",
        '''def _ack_in(message: Any) -> Any:
    """Add Dramatiq's ack of ``message`` to a pipeline (the consumer then skips its own)."""
    if message is None or not isinstance(message.options.get("redis_message_id"), str):
        return None
    broker = dramatiq.get_broker()

    def ack(pipe: Any) -> None:
        # EVALSHA, not Script(client=pipe): redis-py then sends SCRIPT EXISTS first,
        # one more round trip. The script is loaded: this broker's fetch ran it.
        pipe.evalsha(
            broker.scripts["dispatch"].sha, 1, broker.namespace,  # type: ignore[attr-defined]
            "ack", int(time.time() * 1000), message.queue_name,
            broker.broker_id, broker.heartbeat_timeout,  # type: ignore[attr-defined]
            broker.dead_message_ttl, 0, broker._max_unpack_size(),  # type: ignore[attr-defined]
            message.options["redis_message_id"],
        )

    return ack


def _arguments_size(request: ToolCallRequest) -> int:''',
    )
    sub("worker/messaging/actors.py", "import logging\n", "import logging\nimport time\n")
    sub(
        "worker/messaging/actors.py",
        "from dramatiq.brokers.redis import RedisBroker\n",
        "from dramatiq.brokers.redis import RedisBroker\n"
        "from dramatiq.middleware import CurrentMessage\n",
    )
    sub(
        "worker/messaging/broker.py",
        '''        """Acknowledge, retrying for up to ``ACK_RETRY_S`` while Redis is unreachable."""
''',
        '''        """Acknowledge, retrying for up to ``ACK_RETRY_S`` while Redis is unreachable."""
        if message.options.get("toolfleet_acked"):  # acked with the reply, one round trip
            self.queued_message_ids.discard(message.message_id)
            return
''',
    )
print("patched2", root, which)

if "split" in which:
    p = root / "worker/messaging/broker.py"
    s = p.read_text()
    s = s.replace(
        """#: Seconds to pause when the prefetch window is full""",
        """#: Most messages one fetch takes, so that a burst (a model turn) is shared by the
#: worker processes that all woke up for it instead of going to the first one.
FETCH_BATCH = 4
#: Seconds to pause when the prefetch window is full""",
        1,
    )
    n = s.count("self.queue_name, self.prefetch - self.outstanding_message_count")
    assert n == 1, n
    s = s.replace(
        "self.queue_name, self.prefetch - self.outstanding_message_count",
        "self.queue_name, min(FETCH_BATCH, self.prefetch - self.outstanding_message_count)",
    )
    p.write_text(s)
    print("patched3", root, which)
