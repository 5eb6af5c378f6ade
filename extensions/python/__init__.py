"""Built-in extension ``python``: a persistent, sandboxed Python REPL for the model.

One tool, ``run`` (function ``ext_python_run``): it runs the code the model wrote and
returns ``{"stdout", "stderr", "result", "error"}``, where ``result`` is the ``repr``
of the last expression's value (as in a REPL) and ``error`` is ``"ExcType: message"``
followed by a traceback of the model's own code. An exception in the code is an
``ok`` reply with ``error`` set: the model reads it and fixes its code.

Sandbox (see :class:`PythonToolConfig` for every limit and its default, and
:mod:`toolfleet.extensions.python._sandbox` for the boundary):

- by default the interpreter runs under bubblewrap in its own user, PID, mount and
  network namespaces: its ``/proc`` shows only its own processes (no other process's
  command line or environment), its file system holds only read-only system and
  interpreter folders plus its own directory, and it has no network unless the
  extension is built with ``network=True``. Where the host cannot provide that, the
  extension is not served (its preflight says why, ``toolfleet extensions check``
  prints it), unless ``isolation="unsafe-none"`` is asked for;
- the code runs in a child process of the worker, never in the worker itself: its own
  process group and session, ``RLIMIT_AS`` (512 MiB), ``RLIMIT_CPU`` (per call and per
  interpreter), ``RLIMIT_FSIZE``, no core files, stdin on ``/dev/null``;
- the session as a whole: at most ``max_processes`` (64) processes and ``memory_bytes``
  (512 MiB) of memory, through a cgroup per interpreter where the host lets the worker
  make one, else ``RLIMIT_NPROC`` in the sandbox's own user namespace (memory then
  bounded per process only: ``max_processes`` times ``memory_bytes``); its files in a
  private tmpfs of ``disk_bytes`` (128 MiB), never on the host's disk;
- an empty environment: only ``PATH``, ``LANG`` and a few constants (``HOME`` and
  ``TMPDIR`` in the sandbox directory, thread counts of numeric libraries);
- a fresh working directory per interpreter (``/sandbox``, with ``/tmp`` in it), gone
  when it stops;
- at the call's time limit the whole process group is killed with ``SIGKILL``, and the
  worker answers ``timeout`` on time even for ``while True: pass``;
- when the worker process exits, its interpreters are killed and their directories
  removed; when it is killed outright (``SIGKILL``, OOM killer) the kernel kills the
  sandbox (``PR_SET_PDEATHSIG``, and the end of its PID namespace takes every process
  the code started), and its next start (or any worker process's, within a minute)
  removes the session cgroups (and ``unsafe-none`` folders) the dead process left;
- output is captured at the file-descriptor level (``os.system`` and C extensions
  included), each field clipped to ``max_output_bytes`` with a marker.

Sessions. The first call of a conversation (``context.conversation``, keyed together
with ``context.account``) starts an interpreter; the worker process keeps it, so
the next call served by *that process* sees the same variables, imports and files.
Calls of one conversation run one at a time. A worker process keeps at most
``max_sessions`` interpreters (least recently used stopped first) and stops one idle
for ``idle_timeout_s``. An interpreter killed at a time limit, one that crashed, and
one stopped for idleness or room is dropped; the conversation's next call on that
process gets a fresh one and its ``stderr`` starts with a note saying so and why.
A call without a conversation gets a throw-away interpreter.

Across a fleet the tool has session affinity (``Run.affinity = "conversation"``): its
reply names a queue only the worker slot holding the interpreter consumes, and the
producer sends the conversation's next calls there while that slot lives
(:mod:`toolfleet.producer.affinity`). When the slot is gone, or a call is made by a
client that never saw the conversation, another process starts a fresh interpreter; the
model then meets a ``NameError``, whose ``error`` adds a hint that the interpreter is
fresh, and redefines what it needs; the tool's description tells it so up front. State
lives in a process (objects, open files, threads), not in data that could be shipped to
Redis, so moving it between workers is not possible in general.
"""

from __future__ import annotations

from toolfleet.extensions.python._leftovers import sweep
from toolfleet.extensions.python._sandbox import unavailable_reason
from toolfleet.extensions.python.config import PythonToolConfig
from toolfleet.extensions.python.tool import (
    DEFAULT_TIMEOUT_S,
    Run,
    RunArguments,
    RunOutput,
    describe,
)
from toolfleet.shared.extension import Extension

__all__ = ["PythonToolConfig", "Run", "RunArguments", "RunOutput", "extension", "make_extension"]

VERSION = "1.0.0"


def make_extension(
    config: PythonToolConfig | None = None,
    *,
    slug: str = "python",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Extension:
    """Build the ``python`` extension with its own limits and session pool.

    ``toolfleet worker --extension mypkg.mod:ATTR`` loads an extension built this way,
    e.g. ``ATTR = make_extension(PythonToolConfig(memory_bytes=2**30), timeout_s=60)``.

    Args:
        config: sandbox limits and session policy; defaults when ``None``.
        slug: the extension's slug (function ``ext_<slug>_run``).
        timeout_s: wall-clock limit of one call, seconds.

    Returns:
        An :class:`Extension` whose one tool, ``run``, has its own session pool.
    """
    chosen = config or PythonToolConfig()

    class BoundRun(Run):
        __doc__ = Run.__doc__
        config = chosen
        description = describe(chosen, timeout_s)

    BoundRun.timeout_s = timeout_s
    BoundRun.__name__ = BoundRun.__qualname__ = "Run"
    return Extension(
        slug=slug,
        version=VERSION,
        description="A persistent, sandboxed Python interpreter per conversation.",
        tools=[BoundRun],
        timeout_s=timeout_s,
        preflight=lambda: _preflight(chosen),
    )


def _preflight(config: PythonToolConfig) -> str | None:
    """At worker start: remove what killed workers left, then say whether this host can serve."""
    sweep()
    return unavailable_reason(config)


extension = make_extension()
"""The default ``python`` extension (entry point ``python``)."""
