"""A real fleet for a test: worker processes serving an extension, on a Redis the test names."""

from __future__ import annotations

import contextlib
import os
import shutil
import site
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

import redis

from toolfleet.producer import ToolClient
from toolfleet.shared.naming import catalog_key
from toolfleet.shared.settings import Settings
from toolfleet.testing._sources import ExtensionSource, is_folder, load_source
from toolfleet.worker.devtools.local_fleet import LocalFleet, delete_namespace
from toolfleet.worker.supervision.supervisor import WorkerOptions

__all__ = ["RunningFleet", "start_fleet"]


class RunningFleet:
    """Worker processes serving a test's extensions, and a client of them; a context manager.

    Attributes:
        url: the Redis URL the fleet and :attr:`client` use.
        namespace: the key prefix of this fleet alone (``toolfleet-test-<hex>``); every key
            under it is deleted by :meth:`stop`.
        client: a :class:`~toolfleet.producer.ToolClient` of the fleet.
        functions: the wire function names the fleet serves, e.g.
            ``["ext_my_tools_greet"]``.
    """

    def __init__(self, local: LocalFleet, client: ToolClient, functions: list[str]) -> None:
        self._local = local
        self.url = local.redis_url
        self.namespace = local.options.settings.namespace
        self.client = client
        self.functions = functions
        self._health_dir = local.options.settings.health_dir
        self._stopped = False

    @property
    def pids(self) -> list[int]:
        """The process ids of the worker processes running now (a restarted one's new id)."""
        supervisor = self._local.supervisor
        return supervisor.pids() if supervisor is not None else []

    def stop(self) -> None:
        """Close the client, drain and stop the worker processes, delete the fleet's keys.

        Idempotent. Raises nothing for a Redis that went away meanwhile (its keys went too).
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            self.client.close()
        finally:
            self._local.stop()
            _delete_keys(self.url, self.namespace)
            _remove_tree(self._health_dir)

    def __enter__(self) -> RunningFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_fleet(
    *extensions: ExtensionSource,
    redis_url: str,
    processes: int = 1,
    threads: int = 4,
    entry_points: bool = False,
    ready_timeout_s: float = 60.0,
    log_level: str = "WARNING",
) -> RunningFleet:
    """Start worker processes serving ``extensions``; return once each serves their queues.

    The same supervisor and worker processes as ``toolfleet worker`` (real Dramatiq
    consumers, heartbeats, the catalog, restarts), in a namespace of their own, with
    heartbeats every 0.5 s, a 5 s drain and no ``/metrics`` port. Worker processes get this
    process's environment and the ``sys.path`` entries they would not have by themselves
    (pytest's rootdir, a ``conftest.py``'s folder), so a module a test imports, they import.

    Args:
        extensions: each a ``"MODULE:ATTR"`` string (as ``--extension`` takes) or the path
            of an extension folder. Objects cannot cross into another process: name the
            module attribute that holds them.
        redis_url: the Redis to use (e.g. the ``toolfleet_redis`` fixture's).
        processes: worker processes.
        threads: worker threads per process.
        entry_points: also load the installed extensions (``toolfleet.extensions`` entry
            points), as a production worker does.
        ready_timeout_s: seconds to wait for the workers.
        log_level: the worker processes' log level (their lines go to this process's
            stderr, which pytest shows with a failing test).

    Raises:
        ValueError: no extension named.
        TypeError: an extension given as an object.
        ConfigurationError: an extension that does not load, or workers not ready within
            ``ready_timeout_s`` (everything started is stopped then).
    """
    if not extensions:
        raise ValueError("name at least one extension: 'module:attr' or a folder path")
    for source in extensions:
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(
                f"a fleet loads extensions in other processes: name {source!r} as "
                "'module:attr' or a folder path"
            )
    loaded = [load_source(source) for source in extensions]  # fail here, with the reason
    folders = [str(Path(s).resolve()) for s in extensions if is_folder(s)]
    specs = [str(s) for s in extensions if not is_folder(s)]
    namespace = f"toolfleet-test-{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env().model_copy(
        update={
            "redis_url": redis_url,
            "redis_client": None,
            "namespace": namespace,
            "heartbeat_interval_s": 0.5,
            "worker_ttl_s": 3.0,
            "shutdown_grace_s": 5.0,
            "metrics_port": 0,
            "extension_paths": os.pathsep.join(folders),
            "health_dir": Path(tempfile.mkdtemp(prefix="toolfleet-test-health-")),
        }
    )
    options = WorkerOptions(
        settings,
        processes=processes,
        threads=threads,
        extensions=specs,
        entry_points=entry_points,
        log_level=log_level,
        environment_extra={"PYTHONPATH": _child_path()},
    )
    queues = sorted({extension.queue_name for extension in loaded})
    local = LocalFleet(options, ready_queues=queues, ready_timeout_s=ready_timeout_s)
    try:
        local.start()
        client = ToolClient(redis_url, namespace=namespace)
    except BaseException:
        local.stop()
        _delete_keys(redis_url, namespace)
        _remove_tree(settings.health_dir)
        raise
    return RunningFleet(local, client, _catalogued(redis_url, namespace))


def _catalogued(url: str, namespace: str) -> list[str]:
    """The function names in the fleet's catalog, sorted."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sorted(str(name) for name in client.hkeys(catalog_key(namespace)))
    finally:
        client.close()


def _child_path() -> str:
    """``PYTHONPATH`` for a worker process: this one's, after this process's extra folders.

    The extra folders are those on ``sys.path`` that a fresh interpreter would not have
    (the standard library and site-packages it finds by itself are left out, so that
    they keep their order).
    """
    found = [*sysconfig.get_paths().values(), *site.getsitepackages(), site.getusersitepackages()]
    own = {os.path.realpath(p) for p in found}
    extra = [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) not in own]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*extra, *inherited]))


def _delete_keys(url: str, namespace: str) -> None:
    """Delete every key under ``namespace`` (nothing when Redis is gone)."""
    with contextlib.suppress(redis.RedisError):  # the server went away, and its keys with it
        delete_namespace(url, namespace)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
