"""Chaos check: calls in flight while one fault at a time hits the fleet or its Redis.

Starts a private ``redis-server`` (127.0.0.1 on a free port, or a unix socket with
``--unix``; optionally ``--requirepass``), a fleet through the real CLI (``toolfleet
worker -p 2 -t 8 --extension chaos_tools:extension``: a sleeping tool, an idempotent
one, one limited to 3 calls at once, an echo) and one ``ToolClient``. Each round submits
``--calls`` calls at once (budget ``--timeout`` seconds each) and, while they are in
flight, injects the next fault of ``--faults`` in turn:

- ``sigkill``: SIGKILL one worker process (its supervisor starts a new one);
- ``sigstop``: SIGSTOP one worker process for ``--stop-s`` seconds, then SIGCONT;
- ``redis-restart``: SHUTDOWN NOSAVE, one second down, start again on the same address:
  every key is lost (``--save ''``);
- ``redis-restart-keep``: the same with SHUTDOWN SAVE: the keys come back from the dump;
- ``client-kill``: CLIENT KILL TYPE normal / pubsub, twice, one second apart;
- ``duplicates``: copies of raw messages of calls in flight enqueued again under new ids
  (and some ids pushed twice), and once more after those calls were answered;
- ``fuzz``: a batch of raw messages: malformed JSON, damaged envelopes, bad fields, deep
  nesting, huge fields, lone surrogates (each readable one carries its own reply list).

Per round it counts the calls by status, the unanswered ones (future not resolved by its
deadline + 10 s), the duplicated or stray replies (the client's ``late_replies``: a
reply for a call already answered, or after it was resolved), the late ones (resolved
more than 1 s past their deadline), and for the raw messages with a readable reply
address, those with no reply or more than one. One row per round, a total line; exit
status 1 when any call is unanswered, duplicated or late, or any readable raw message is
unanswered or answered twice::

    python bench/chaos.py                                # 12 rounds of 1,000 calls
    python bench/chaos.py --rounds 3 --calls 200 --faults sigkill,fuzz
    python bench/chaos.py --unix --requirepass --out     # JSON to bench/results/
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from _process import load_average

from toolfleet.producer import ToolClient
from toolfleet.shared import ToolCallResult
from toolfleet.shared.naming import actor_name_for
from toolfleet.shared.wire import ReplyEnvelope

BENCH = Path(__file__).resolve().parent
APPS = BENCH / "apps"
RESULTS = BENCH / "results"
QUEUE = "tools.chaos"
SLEEP, IDEM, LIMITED, ECHO = (f"ext_chaos_{t}" for t in ("sleep", "idem", "limited", "echo"))
FAULTS = [
    "sigkill",
    "sigstop",
    "redis-restart",
    "redis-restart-keep",
    "client-kill",
    "duplicates",
    "fuzz",
]
LATE_MARGIN_S = 1.0
UNANSWERED_AFTER_S = 10.0
WORKER_MODULE = "toolfleet.worker.supervision.worker_process"


# -- processes -------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of ``pid`` from /proc, or ``None`` when it is gone."""
    try:
        after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return after[0], int(after[1])


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (its children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (found := _proc_stat(int(name))) and found[0] not in "ZX":
            children.setdefault(found[1], []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _free_port() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port
    raise RuntimeError("no free port on 127.0.0.1")


class PrivateRedis:
    """A ``redis-server`` of this run only: loopback or unix socket, no automatic saves.

    Its config file (mode 0600) holds the password, so none appears on a command line.
    """

    def __init__(self, folder: Path, *, unix: bool, password: str | None) -> None:
        self.folder = folder
        binary = shutil.which("redis-server") or shutil.which("valkey-server")
        if binary is None:
            from toolfleet.worker.devtools.embedded_redis import redis_server_binary

            binary = redis_server_binary()
        self.binary = binary
        lines = ["bind 127.0.0.1", 'save ""', "appendonly no", "maxclients 10000"]
        lines += [f"dir {folder}", f"logfile {folder / 'redis.log'}", "loglevel warning"]
        auth = f":{password}@" if password else ""
        if unix:
            self.sock = Path(tempfile.mkdtemp(prefix="tf-chaos-")) / "redis.sock"
            lines += ["port 0", f"unixsocket {self.sock}", "unixsocketperm 700"]
            self.url = f"unix://{auth}{self.sock}"
            self.where = f"unix socket {self.sock}"
        else:
            port = _free_port()
            lines += [f"port {port}"]
            self.url = f"redis://{auth}127.0.0.1:{port}/0"
            self.where = f"127.0.0.1:{port}"
        if password:
            lines.append(f"requirepass {password}")
        self.config = folder / "redis.conf"
        self.config.touch(mode=0o600)
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self, timeout_s: float = 5.0) -> redis.Redis:
        return redis.Redis.from_url(
            self.url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it and wait until it answers PING (with its data loaded)."""
        self.proc = subprocess.Popen(
            [self.binary, str(self.config)], stdout=subprocess.DEVNULL, start_new_session=True
        )
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: see {self.folder / 'redis.log'}")
            with contextlib.suppress(redis.RedisError, OSError), self.client(1.0) as c:
                if c.ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("the private redis-server did not answer")

    def restart(self, *, keep: bool, down_s: float = 1.0) -> None:
        """SHUTDOWN (SAVE when ``keep``, else NOSAVE), ``down_s`` seconds down, start again."""
        with contextlib.suppress(redis.RedisError), self.client(10.0) as c:
            c.shutdown(save=keep, nosave=not keep)
        self.wait_exit(10.0)
        if not keep:
            (self.folder / "dump.rdb").unlink(missing_ok=True)
        time.sleep(down_s)
        self.start()

    def wait_exit(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            self.wait_exit(5.0)
        self.proc = None
        if hasattr(self, "sock"):
            shutil.rmtree(self.sock.parent, ignore_errors=True)


class Fleet:
    """``toolfleet worker -p N -t T --extension chaos_tools:extension`` in its own session."""

    def __init__(self, redis_url: str, namespace: str, folder: Path, processes: int,
                 threads: int) -> None:  # fmt: skip
        self.processes = processes
        self.log_path = folder / "worker.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(APPS), *filter(None, [os.getenv("PYTHONPATH")])]),
            "TOOLFLEET_REDIS_URL": redis_url,
            "TOOLFLEET_NAMESPACE": namespace,
            "TOOLFLEET_SHUTDOWN_GRACE_S": "5",
            "TOOLFLEET_METRICS_PORT": "0",
            "TOOLFLEET_HEALTH_DIR": str(folder / "health"),
        }  # fmt: skip
        argv = [
            str(Path(sys.executable).parent / "toolfleet"), "worker",
            "-p", str(processes), "-t", str(threads), "--extension", "chaos_tools:extension",
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        self.stopped: set[int] = set()

    def worker_pids(self) -> list[int]:
        """The supervisor's live worker processes."""
        return sorted(
            pid
            for pid in descendants(self.proc.pid)
            if (_proc_stat(pid) or ("", 0))[1] == self.proc.pid and WORKER_MODULE in _cmdline(pid)
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGCONT what this run stopped, SIGTERM the supervisor, then SIGKILL any leftover.

        Leftovers are the processes below the supervisor just before it was stopped, killed
        only while they still run the same command line (a pid is never reused blindly).
        """
        for pid in self.stopped:
            _signal(pid, signal.SIGCONT)
        below = {pid: _cmdline(pid) for pid in descendants(self.proc.pid)}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        _signal_group(self.proc.pid, signal.SIGKILL)
        for pid, cmdline in below.items():
            if cmdline and _cmdline(pid) == cmdline:
                _signal(pid, signal.SIGKILL)
        self._log.close()


# -- raw messages --------------------------------------------------------------------------


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


#: Request fields a fuzzed request carries instead of good ones (its reply address stays).
BAD_FIELDS: list[dict[str, Any]] = [
    {"deadline": 1e16}, {"deadline": -5.0}, {"deadline": "NaN"}, {"deadline": "soon"},
    {"deadline": None}, {"timeout_s": 1e16}, {"timeout_s": -1.0}, {"timeout_s": "-inf"},
    {"function": "ext_nope_missing"}, {"function": ""}, {"function": 42}, {"id": None},
    {"id": 7}, {"arguments": {"text": "\ud800 lone"}}, {"arguments": '{"text": "\\udfff"}'},
    {"arguments": _deep(200)}, {"arguments": '{"a": ' * 5000 + "1" + "}" * 5000},
    {"arguments": '{"text": NaN}'},
    {"arguments": "[1, 2"}, {"arguments": [1, 2]}, {"arguments": {"text": "x", "n": 2**70}},
    {"context": {"account": 5}}, {"context": "nope"}, {"tool_call_id": {"x": 1}},
    {"arguments": {"text": "x" * 1_200_000}}, {"tool_call_id": "t" * 200_000},
    {"function": "f" * 50_000}, {"context": {"metadata": {"k": "v" * 300_000}}},
    {"tool_call_id": "\ud83d"}, {"id": "\udc80"},
]  # fmt: skip

#: Dramatiq-level damage: (name, function(message, redis id) -> (body, key it is stored under)).
ENVELOPE_DAMAGE: list[tuple[str, Callable[[dict[str, Any], str], tuple[bytes, str]]]] = [
    ("unknown actor", lambda m, i: (_dumps({**m, "actor_name": "no_such_actor"}), i)),
    ("mismatched id", lambda m, i: (_dumps(m), str(uuid.uuid4()))),
    ("no options", lambda m, i: (_dumps({**m, "options": {}}), i)),
    ("eta", lambda m, i: (_dumps({**m, "options": {**m["options"], "eta": 1}}), i)),
    ("other queue", lambda m, i: (_dumps({**m, "queue_name": "tools.elsewhere"}), i)),
    ("dict argument", lambda m, i: (_dumps({**m, "args": [json.loads(m["args"][0])]}), i)),
    ("truncated body", lambda m, i: (_dumps(m)[: len(_dumps(m)) // 2], i)),
]

#: Damage after which no reply can be posted (only dead-lettering is expected).
UNREADABLE: list[Callable[[dict[str, Any], str], tuple[bytes, str]]] = [
    lambda m, i: (b"\x00\xffnot json", i),
    lambda m, i: (_dumps({**m, "args": "not a list"}), i),
    lambda m, i: (_dumps({**m, "args": [json.dumps({"reply_to": 5})]}), i),
    lambda m, i: (b"", i),
    lambda m, i: (_dumps([1, 2, 3]), i),
    lambda m, i: (b"[" * 100_000, i),
]


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


@dataclass
class RawItem:
    """One raw message: its reply list (``None`` when no address can be read) and body."""

    reply_to: str | None
    key: str
    body: bytes
    what: str


def fuzz_items(ns: str, tag: str, count: int, budget_s: float, rng: random.Random) -> list[RawItem]:
    """``count`` raw messages, mostly damaged, for ``QUEUE``; each readable one replies to
    its own list ``<ns>:reply:chaos-raw-<tag>-<i>``."""
    items: list[RawItem] = []
    now = time.time()
    for i in range(count):
        reply_to = f"{ns}:reply:chaos-raw-{tag}-{i}"
        request: dict[str, Any] = {
            "id": str(uuid.uuid4()), "function": ECHO, "arguments": {"text": f"t{i}"},
            "reply_to": reply_to, "deadline": now + budget_s, "timeout_s": budget_s,
        }  # fmt: skip
        roll = rng.random()
        what = "good"
        if roll < 0.55 or roll >= 0.9:
            bad = rng.choice(BAD_FIELDS)
            what = repr({k: v if len(repr(v)) < 40 else "<big>" for k, v in bad.items()})
            request.update(bad)
            request = {k: v for k, v in request.items() if v is not None or k == "id"}
        redis_id = str(uuid.uuid4())
        message = {
            "queue_name": QUEUE, "actor_name": actor_name_for(QUEUE),
            "args": [json.dumps(request)], "kwargs": {},
            "options": {"redis_message_id": redis_id}, "message_id": str(uuid.uuid4()),
            "message_timestamp": int(now * 1000),
        }  # fmt: skip
        if 0.55 <= roll < 0.85:
            name, damage = rng.choice(ENVELOPE_DAMAGE)
            body, key = damage(message, redis_id)
            readable = name != "truncated body"
            items.append(RawItem(reply_to if readable else None, key, body, name))
        elif 0.85 <= roll < 0.9:
            body, key = rng.choice(UNREADABLE)(message, redis_id)
            items.append(RawItem(None, key, body, "unreadable"))
        else:
            items.append(RawItem(reply_to, redis_id, _dumps(message), what))
    return items


def enqueue_raw(r: redis.Redis, ns: str, items: list[tuple[str, bytes]]) -> None:
    """Store each ``(key, body)`` in the queue's bodies hash and push its key (as Dramatiq)."""
    pipe = r.pipeline(transaction=False)
    for key, body in items:
        pipe.hset(f"{ns}:{QUEUE}.msgs", key, body)
        pipe.rpush(f"{ns}:{QUEUE}", key)
    pipe.execute()


def copies_of(bodies: list[bytes]) -> list[tuple[str, bytes]]:
    """Each Dramatiq message body again under a new ``redis_message_id``."""
    out = []
    for body in bodies:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            message = json.loads(body)
            key = str(uuid.uuid4())
            message["options"]["redis_message_id"] = key
            out.append((key, _dumps(message)))
    return out


# -- one round -----------------------------------------------------------------------------


@dataclass
class Round:
    """The figures of one round."""

    index: int
    fault: str
    calls: int
    statuses: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0
    duplicated: int = 0
    late: int = 0
    worst_over_s: float = 0.0
    raw_readable: int = 0
    raw_unanswered: int = 0
    raw_duplicated: int = 0
    raw_statuses: dict[str, int] = field(default_factory=dict)
    raw_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    fault_note: str = ""
    seconds: float = 0.0
    load: str = ""

    @property
    def failed(self) -> bool:
        return bool(
            self.unanswered or self.duplicated or self.late or self.raw_unanswered
            or self.raw_duplicated
        )  # fmt: skip


@dataclass
class Call:
    future: Future[ToolCallResult]
    deadline: float
    resolved_at: float | None = None


class Chaos:
    """The fleet, its Redis, one client, and the faults."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.namespace = f"chaos-{uuid.uuid4().hex[:6]}"
        password = secrets.token_hex(16) if args.requirepass else None
        self.redis = PrivateRedis(folder, unix=args.unix, password=password)
        self.fleet: Fleet | None = None
        self.client: ToolClient | None = None
        self.rng = random.Random(args.seed)
        self.victim = 0

    # -- set-up and tear-down ----------------------------------------------------------------

    def start(self) -> None:
        self.redis.start()
        self.fleet = Fleet(self.redis.url, self.namespace, self.folder, self.args.processes,
                           self.args.threads)  # fmt: skip
        self.client = ToolClient(self.redis.url, namespace=self.namespace)
        self.wait_healthy(120.0)

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(wait=False)
        if self.fleet is not None:
            self.fleet.stop()
        self.redis.stop()

    def wait_healthy(self, timeout_s: float) -> str:
        """Until every worker process runs and an echo call is answered ok; what was seen."""
        assert self.fleet is not None and self.client is not None
        give_up = time.monotonic() + timeout_s
        seen = "not started"
        while time.monotonic() < give_up:
            if not self.fleet.alive():
                raise RuntimeError(f"toolfleet worker exited: see {self.fleet.log_path}")
            if len(self.fleet.worker_pids()) >= self.fleet.processes:
                result = self.client.call(ECHO, {"text": "ping"}, timeout_s=3.0)
                if result.ok:
                    return "ok"
                seen = result.status.value
            time.sleep(0.2)
        raise RuntimeError(f"the fleet did not come back in {timeout_s:.0f} s ({seen})")

    def wait_drained(self, timeout_s: float) -> None:
        """Until the queue and its bodies hash are empty (or ``timeout_s`` passed)."""
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            with contextlib.suppress(redis.RedisError), self.redis.client() as r:
                if not r.llen(f"{self.namespace}:{QUEUE}") and not r.hlen(
                    f"{self.namespace}:{QUEUE}.msgs"
                ):
                    return
            time.sleep(0.2)

    # -- faults ------------------------------------------------------------------------------

    def _worker(self) -> int | None:
        assert self.fleet is not None
        pids = self.fleet.worker_pids()
        if not pids:
            return None
        self.victim += 1
        return pids[self.victim % len(pids)]

    def inject(
        self, fault: str, tag: str, progress: Callable[[], float]
    ) -> tuple[str, list[RawItem]]:
        """Inject ``fault`` now; returns a note and the raw messages it enqueued."""
        assert self.fleet is not None
        ns = self.namespace
        if fault == "sigkill":
            pid = self._worker()
            if pid is None:
                return "no worker process", []
            _signal(pid, signal.SIGKILL)
            return f"killed {pid}", []
        if fault == "sigstop":
            pid = self._worker()
            if pid is None:
                return "no worker process", []
            self.fleet.stopped.add(pid)
            _signal(pid, signal.SIGSTOP)
            try:
                time.sleep(self.args.stop_s)
            finally:
                _signal(pid, signal.SIGCONT)
                self.fleet.stopped.discard(pid)
            return f"stopped {pid} {self.args.stop_s:g} s", []
        if fault in ("redis-restart", "redis-restart-keep"):
            keep = fault == "redis-restart-keep"
            started = time.monotonic()
            self.redis.restart(keep=keep)
            return f"{'kept' if keep else 'lost'} keys, {time.monotonic() - started:.1f} s down", []
        if fault == "client-kill":
            killed = 0
            for attempt in range(2):
                with self.redis.client() as r:
                    for kind in ("normal", "pubsub"):
                        killed += int(r.execute_command("CLIENT", "KILL", "TYPE", kind))
                if attempt == 0:
                    time.sleep(1.0)
            return f"{killed} connections killed", []
        if fault == "duplicates":
            with self.redis.client() as r:
                held = list(itertools.islice(r.hscan_iter(f"{ns}:{QUEUE}.msgs", count=500),
                                             max(1, self.args.calls // 5)))  # fmt: skip
                keys, bodies = [k for k, _ in held], [b for _, b in held]
                # the same request ids under new message ids, and the same message ids again
                enqueue_raw(r, ns, copies_of(bodies))
                pipe = r.pipeline(transaction=False)
                for key in keys[:20]:
                    pipe.lpush(f"{ns}:{QUEUE}", key)
                pipe.execute()
            give_up = time.monotonic() + self.args.timeout
            while progress() < 0.9 and time.monotonic() < give_up:
                time.sleep(0.1)
            with self.redis.client() as r:  # once more, for calls answered by now
                enqueue_raw(r, ns, copies_of(bodies))
            return f"{len(bodies)} messages copied twice, {min(20, len(keys))} pushed twice", []
        if fault == "fuzz":
            count = max(20, self.args.calls // 4)
            items = fuzz_items(ns, tag, count, self.args.timeout, self.rng)
            with self.redis.client(30.0) as r:
                enqueue_raw(r, ns, [(i.key, i.body) for i in items])
            return f"{count} raw messages", items
        raise ValueError(f"unknown fault {fault!r}")

    # -- a round -----------------------------------------------------------------------------

    def run_round(self, index: int, fault: str) -> Round:
        assert self.client is not None
        started = time.monotonic()
        client = self.client
        late_before = client.late_replies
        figures = Round(index, fault, self.args.calls)
        calls: list[Call] = []
        resolved = [0]
        lock = threading.Lock()

        def on_done(call: Call, _future: object) -> None:
            call.resolved_at = time.time()
            with lock:
                resolved[0] += 1

        for i in range(self.args.calls):
            function, arguments = self.pick(i)
            deadline = time.time() + self.args.timeout
            future = client.submit(function, arguments, timeout_s=self.args.timeout)
            call = Call(future, deadline)
            calls.append(call)
            future.add_done_callback(functools.partial(on_done, call))

        def progress() -> float:
            return resolved[0] / max(1, len(calls))

        # let the fleet get going, then hit it while most calls are still in flight
        give_up = time.monotonic() + 2.0
        while progress() < 0.1 and time.monotonic() < give_up:
            time.sleep(0.02)
        tag = f"{index}-{uuid.uuid4().hex[:4]}"
        try:
            note, raw = self.inject(fault, tag, progress)
        except (redis.RedisError, OSError) as exc:
            note, raw = f"fault failed: {exc}", []
        figures.fault_note = note
        last_deadline = max(c.deadline for c in calls)
        while time.time() < last_deadline + UNANSWERED_AFTER_S and progress() < 1.0:
            time.sleep(0.05)
        statuses: Counter[str] = Counter()
        for call in calls:
            if not call.future.done() or call.resolved_at is None:
                figures.unanswered += 1
                continue
            statuses[call.future.result().status.value] += 1
            over = call.resolved_at - call.deadline
            if over > LATE_MARGIN_S:
                figures.late += 1
            figures.worst_over_s = max(figures.worst_over_s, over)
        figures.statuses = dict(sorted(statuses.items()))
        # the fleet back, the queue drained, a moment for stray replies
        self.wait_healthy(30.0)
        self.wait_drained(10.0)
        if raw:
            self.count_raw(figures, raw)
        time.sleep(1.5)
        figures.duplicated = client.late_replies - late_before
        figures.seconds = time.monotonic() - started
        figures.load = load_average()
        return figures

    def pick(self, i: int) -> tuple[str, dict[str, Any]]:
        """The call mix: half sleeps, a fifth idempotent, a tenth limited, a fifth echoes."""
        slot = i % 10
        if slot < 5:
            return SLEEP, {"seconds": 0.05}
        if slot < 7:
            return IDEM, {"seconds": 0.05}
        if slot < 8:
            return LIMITED, {"seconds": 0.02}
        return ECHO, {"text": f"e{i}"}

    def count_raw(self, figures: Round, items: list[RawItem]) -> None:
        """Wait for the readable raw messages' replies (up to 20 s); count the missing ones."""
        readable = [i.reply_to for i in items if i.reply_to is not None]
        figures.raw_readable = len(readable)
        missing = list(readable)
        give_up = time.monotonic() + 20.0
        with self.redis.client(30.0) as r:
            while missing and time.monotonic() < give_up:
                pipe = r.pipeline(transaction=False)
                for reply in missing:
                    pipe.llen(reply)
                missing = [x for x, n in zip(missing, pipe.execute(), strict=True) if not n]
                if missing:
                    time.sleep(0.3)
            time.sleep(1.0)  # a second reply, if any, is on its list by now
            pipe = r.pipeline(transaction=False)
            for reply in readable:
                pipe.lrange(reply, 0, -1)
            statuses: Counter[str] = Counter()
            kind_of = {i.reply_to: i.what for i in items}
            by_kind: dict[str, Counter[str]] = {}
            for reply, entries in zip(readable, pipe.execute(), strict=True):
                results = []
                for entry in entries:
                    try:
                        envelope = ReplyEnvelope.decode(entry)
                    except Exception:  # noqa: BLE001 - an undecodable reply counts as one
                        results.append("undecodable")
                        continue
                    if envelope.result is not None:
                        results.append(envelope.result.status.value)
                if len(results) > 1:
                    figures.raw_duplicated += 1
                statuses.update(results[:1])
                by_kind.setdefault(kind_of[reply], Counter()).update(results[:1] or ["none"])
                if len(results) > 1:
                    by_kind[kind_of[reply]]["duplicated"] += 1
            figures.raw_unanswered = len(missing)
            figures.raw_statuses = dict(sorted(statuses.items()))
            figures.raw_by_kind = {k: dict(v) for k, v in sorted(by_kind.items())}
            if missing:
                kinds = Counter(i.what for i in items if i.reply_to in set(missing))
                figures.fault_note += f"; unanswered raw: {dict(kinds)}"
            for start in range(0, len(readable), 500):
                r.delete(*readable[start : start + 500])


# -- output --------------------------------------------------------------------------------

HEADER = (
    f"{'round':>5} {'fault':<19} {'calls':>5} {'unans':>5} {'dup':>4} {'late':>4} "
    f"{'worst':>6} {'raw':>4} {'raw-no':>6} {'raw-dup':>7} {'secs':>5}  statuses / note"
)


def row(f: Round) -> str:
    statuses = " ".join(f"{k}={v}" for k, v in f.statuses.items())
    return (
        f"{f.index:>5} {f.fault:<19} {f.calls:>5} {f.unanswered:>5} {f.duplicated:>4} "
        f"{f.late:>4} {f.worst_over_s:>+6.2f} {f.raw_readable:>4} {f.raw_unanswered:>6} "
        f"{f.raw_duplicated:>7} {f.seconds:>5.1f}  {statuses} | {f.fault_note}"
    )


def total_line(rounds: list[Round]) -> str:
    statuses: Counter[str] = Counter()
    for f in rounds:
        statuses.update(f.statuses)
    s = " ".join(f"{k}={v}" for k, v in sorted(statuses.items()))
    worst = max((f.worst_over_s for f in rounds), default=0.0)
    return (
        f"{'total':>5} {len(rounds):<19} {sum(f.calls for f in rounds):>5} "
        f"{sum(f.unanswered for f in rounds):>5} {sum(f.duplicated for f in rounds):>4} "
        f"{sum(f.late for f in rounds):>4} {worst:>+6.2f} "
        f"{sum(f.raw_readable for f in rounds):>4} {sum(f.raw_unanswered for f in rounds):>6} "
        f"{sum(f.raw_duplicated for f in rounds):>7} {sum(f.seconds for f in rounds):>5.0f}  {s}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds (default 12)")
    parser.add_argument("--calls", type=int, default=1000, help="calls in flight per round")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="comma list, injected in turn (default: all of them)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=20.0, help="budget of each call, s")
    parser.add_argument("--stop-s", type=float, default=4.0, help="how long sigstop lasts, s")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--unix", action="store_true", help="Redis on a unix socket only")
    parser.add_argument("--requirepass", action="store_true", help="Redis with a password")
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs on success too")
    parser.add_argument("--seed", type=int, default=20261201, help="seed of the fuzzed messages")
    parser.add_argument(
        "--out",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write the figures as JSON (bench/results/chaos-<UTC>.json)",
    )
    args = parser.parse_args(argv)
    args.fault_list = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(args.fault_list) - set(FAULTS))
    if unknown or not args.fault_list:
        parser.error(f"unknown faults {unknown}; known: {','.join(FAULTS)}")
    if args.rounds < 1 or args.calls < 1 or not 0 < args.timeout <= 40:
        parser.error("--rounds and --calls must be >= 1, --timeout in (0, 40] s")
    return args


@contextlib.contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C (cleanup included)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; 0 when every call and readable raw message was answered once, on time."""
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="toolfleet-chaos-"))
    # the client's reconnect warnings go to a file, not between the rows
    logging.basicConfig(filename=folder / "producer.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    chaos = Chaos(args, folder)
    rounds: list[Round] = []
    failed_setup = interrupted = False
    with interrupts_as_keyboard():
        try:
            chaos.start()
            print(f"chaos: {args.processes} x {args.threads} workers, Redis {chaos.redis.where}"
                  f"{' with a password' if args.requirepass else ''}, {args.calls} calls of "
                  f"{args.timeout:g} s per round, load {load_average()}", flush=True)  # fmt: skip
            print(HEADER, flush=True)
            for i in range(args.rounds):
                fault = args.fault_list[i % len(args.fault_list)]
                figures = chaos.run_round(i + 1, fault)
                rounds.append(figures)
                print(row(figures), flush=True)
        except KeyboardInterrupt:
            print("interrupted: cleaning up", file=sys.stderr)
            interrupted = True
        except RuntimeError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            failed_setup = True
        finally:
            chaos.stop()
    if rounds:
        print(total_line(rounds))
    failed = failed_setup or any(f.failed for f in rounds)
    if args.out is not None:
        RESULTS.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = Path(args.out) if args.out else RESULTS / f"chaos-{stamp}.json"
        out.write_text(json.dumps({
            "when": stamp, "load": load_average(), "args": {
                k: v for k, v in vars(args).items() if k != "fault_list"},
            "rounds": [asdict(f) for f in rounds], "failed": failed,
        }, indent=1) + "\n")  # fmt: skip
        print(f"wrote {out}")
    if interrupted:
        print(f"chaos: interrupted; logs kept in {folder}", file=sys.stderr)
        return 130
    if failed:
        print(f"chaos: FAILED; worker, producer and Redis logs kept in {folder}", file=sys.stderr)
    elif args.keep_logs:
        print(f"logs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
