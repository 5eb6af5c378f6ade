"""Code that runs inside a ``process``-isolation child (started by :mod:`.process`).

The child loads the same extensions as its worker process (its initializer), then runs
one tool call per task. Results and :class:`ToolCallError` subclasses travel back pickled; any
other exception travels back as :class:`ChildToolError` text (it may not pickle).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolfleet.shared.errors import ToolCallError
from toolfleet.shared.lifeline import die_with_parent
from toolfleet.worker.isolation.base import ChildToolError

if TYPE_CHECKING:
    from toolfleet.worker.registry.registry import Registry

__all__ = ["call_in_child", "init_child", "ping"]

_state: dict[str, Any] = {}


def init_child(specs: list[str], entry_points: bool, log_level: str) -> None:
    """Pool initializer: arm the parent-death signal, drop the metric files, load extensions.

    The child logs as its worker process does: at ``log_level``, in the text or JSON lines
    of ``TOOLFLEET_LOG_FORMAT`` (:func:`~toolfleet.worker.supervision.logs.configure_logging`),
    its ``worker`` field ``host:pid child``. Log records, warnings and what tools print are
    scrubbed of the secrets the worker process scrubs (the Redis password, the extensions'
    secret settings).

    Every setting (namespace, extension folders, secrets folder) comes from
    :class:`~toolfleet.shared.settings.Settings`, read from the environment the child
    inherits from its worker process; the arguments are what only the worker's command
    line says.

    The parent is the pool's fork server, which exits as soon as its worker process is
    gone (it reads end-of-file on the worker's pipe; it runs no tool, so nothing can hold
    its GIL); the kernel then kills this child, whatever its tool is doing.

    Args:
        specs: the ``MODULE:ATTR`` extension specs of the worker process.
        entry_points: whether to load the ``toolfleet.extensions`` entry points too.
        log_level: logging level name.
    """
    die_with_parent()
    from toolfleet.shared.settings import Settings
    from toolfleet.worker.registry.loader import load_all
    from toolfleet.worker.registry.redaction import Redactor
    from toolfleet.worker.registry.registry import Registry
    from toolfleet.worker.registry.scrubbed_streams import scrub_standard_streams
    from toolfleet.worker.supervision.logs import configure_logging

    _forget_metric_files()

    settings = Settings.from_env()
    redactor = Redactor(settings.secret_values())  # the extensions' secrets join at load
    worker_id = f"{socket.gethostname()}:{os.getpid()} child"
    configure_logging(log_level, settings.log_format, worker_id, redactor)
    scrub_standard_streams(redactor)
    registry = Registry(
        settings.namespace,
        secrets_dir=settings.secrets_dir,
        redactor=redactor,
        start_mcp=False,
        unservable_log_level=logging.DEBUG,  # its worker process said it
    )
    loaded, _ = load_all(specs, folders=settings.extension_folders(), entry_points_too=entry_points)
    registry.add_extensions(loaded)
    _state["registry"] = registry


def _forget_metric_files() -> None:
    """Remove the multiprocess metric files prometheus-client made for this child.

    multiprocessing re-imports the parent's main module
    (``toolfleet.worker.supervision.worker_process``) in each child, which creates the
    unlabelled gauges (``toolfleet_worker_up``, ``toolfleet_stuck_threads``) and their
    files for the child's pid: a live child would export ``worker_up 0`` and each killed
    one would leave its series behind for good. A child records no metrics of its own (its
    parent counts its calls), so its files go.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    for path in Path(directory).glob(f"*_{os.getpid()}.db"):
        path.unlink(missing_ok=True)


def ping() -> int:
    """A no-op task (warms a child up); returns the child's pid."""
    return os.getpid()


def call_in_child(
    function: str,
    arguments: dict[str, Any],
    context_fields: dict[str, Any],
    switch_states: dict[str, bool],
) -> Any:
    """Validate ``arguments`` again and run ``function``; return its JSON-able value.

    The context is the registry's (:meth:`Registry.context`), with the switch states
    the worker process knew when it handed the call over.

    Raises:
        ToolCallError: the status the tool answers (``ExtensionToolError``: its own error
            for the model; any other subclass: that class's status).
        ChildToolError: any other exception, as text.
    """
    registry: Registry = _state["registry"]
    served = registry.served[function]
    registry.switches.adopt(switch_states)
    try:
        model = served.arguments_model.model_validate(arguments)
        context = registry.context(served, context_fields)
        value = served.spec.invoke(model, context)
        if inspect.isawaitable(value):
            value = asyncio.run(_wait(value))
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        return value
    except ToolCallError as exc:  # a status the tool answers (tool_error, timeout, ...)
        raise type(exc)(exc.message) from None
    except BaseException as exc:  # noqa: BLE001 - carried back as text
        raise ChildToolError(f"{type(exc).__name__}: {exc}", traceback.format_exc()) from None


async def _wait(awaitable: Any) -> Any:
    return await awaitable
