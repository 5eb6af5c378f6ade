"""How a tool runs: in-process (threads, event loop) or in a killable child process."""

from toolfleet.worker.isolation.base import CallHandle, Outcome
from toolfleet.worker.isolation.inproc import InProcessRunner

__all__ = ["CallHandle", "InProcessRunner", "Outcome"]
