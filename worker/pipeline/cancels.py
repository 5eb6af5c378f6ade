"""Listen for cancellations of running calls (Redis pub/sub) and cancel them here."""

from __future__ import annotations

import logging
import threading

from toolfleet.shared.naming import cancel_channel
from toolfleet.shared.reconnect import OUTAGE_ERRORS, Reconnect
from toolfleet.shared.text import as_text
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = ["CancelListener"]

log = logging.getLogger("toolfleet.worker.cancels")


class CancelListener:
    """A daemon thread subscribed to ``<ns>:cancel``; each message is a call id.

    A queued call is canceled through its ``<ns>:cancel:<id>`` key (checked when a worker
    claims it); this listener reaches calls that are already running.
    """

    def __init__(
        self, url: str, namespace: str, pipeline: CallPipeline, *, factory: str | None = None
    ) -> None:
        self.url = url
        self.factory = factory
        self.channel = cancel_channel(namespace)
        self.pipeline = pipeline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolfleet-cancels", daemon=True)

    def start(self) -> None:
        """Start listening."""
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (within a second)."""
        self._stop.set()

    def _run(self) -> None:
        reconnect = Reconnect(log, "cancel listener", first_wait_s=0.1, max_wait_s=5.0)
        while not self._stop.is_set():
            try:
                client = redis_client(self.url, factory=self.factory)
                pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
                pubsub.subscribe(self.channel)
                reconnect.succeeded()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "message":
                        data = message["data"]
                        call_id = as_text(data)
                        if self.pipeline.cancel(call_id):
                            log.info("canceled running call %s", call_id)
                pubsub.close()
                client.close()
            except OUTAGE_ERRORS as exc:
                self._stop.wait(reconnect.failed(exc))
