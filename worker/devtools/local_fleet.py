"""A whole fleet in one context manager: Redis (embedded when no URL) plus supervised workers.

Used by ``toolfleet demo`` and by tests; production runs ``toolfleet worker`` instead.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from toolfleet.shared.connect import sync_client
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.naming import all_keys_pattern, workers_key
from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis
from toolfleet.worker.supervision.supervisor import Supervisor, WorkerOptions

__all__ = ["LocalFleet", "delete_namespace"]


def delete_namespace(url: str, namespace: str) -> int:
    """Delete every key under ``namespace`` at ``url`` (``SCAN`` then one ``DEL``).

    Returns:
        How many keys were deleted.

    Raises:
        redis.RedisError: Redis failed or is gone.
    """
    client = sync_client(url, socket_connect_timeout=2, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=all_keys_pattern(namespace), count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


class LocalFleet:
    """Start Redis (if ``options.redis_url`` is empty) and ``options.processes`` workers.

    Args:
        options: worker options; an empty ``redis_url`` starts an embedded Redis.
        ready_queues: queues that must have ``options.processes`` live workers before
            :meth:`start` returns.
        ready_timeout_s: how long to wait for that.

    Raises:
        ConfigurationError: from :meth:`start`, when the workers do not come up in time.
    """

    def __init__(
        self, options: WorkerOptions, ready_queues: list[str], ready_timeout_s: float = 60.0
    ) -> None:
        self.options = options
        self.ready_queues = ready_queues
        self.ready_timeout_s = ready_timeout_s
        self.embedded: EmbeddedRedis | None = None
        self.supervisor: Supervisor | None = None
        self._thread: threading.Thread | None = None

    @property
    def redis_url(self) -> str:
        """The URL the fleet uses."""
        return self.options.redis_url

    def start(self) -> LocalFleet:
        """Start everything and wait until ready."""
        try:
            if not self.options.redis_url:
                self.embedded = EmbeddedRedis()
                url = self.embedded.start()
                self.options.settings = self.options.settings.model_copy(update={"redis_url": url})
            self.supervisor = Supervisor(self.options)
            self._thread = threading.Thread(
                target=self.supervisor.run, kwargs={"install_signals": False}, daemon=True
            )
            self._thread.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        client = sync_client(self.options.redis_url)
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            while time.monotonic() < deadline:
                if self._thread is not None and not self._thread.is_alive():
                    raise ConfigurationError("the workers stopped during start-up (see their log)")
                since = time.time() - self.options.settings.worker_ttl_s
                counts = [
                    client.zcount(workers_key(self.options.settings.namespace, q), since, "+inf")
                    for q in self.ready_queues
                ]
                if all(n >= self.options.processes for n in counts):
                    return
                time.sleep(0.05)
        finally:
            client.close()
        raise ConfigurationError(f"workers not ready within {self.ready_timeout_s:.0f} s")

    def stop(self) -> None:
        """Drain the workers and stop the embedded Redis."""
        if self.supervisor is not None:
            self.supervisor.stop()
        if self._thread is not None:
            self._thread.join(self.options.settings.shutdown_grace_s + 10)
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None
            self.options.settings = self.options.settings.model_copy(update={"redis_url": None})

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
