"""A WSGI app for ``gunicorn --preload``: one ToolClient made and used in the master, before fork.

Each request makes one call with a 3 s deadline and answers what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from toolfleet.producer import ToolClient

ADD = "ext_fleet_test_add"
DEADLINE_S = 3.0

client = ToolClient()  # TOOLFLEET_REDIS_URL and TOOLFLEET_NAMESPACE from the environment
_warm = client.call(ADD, {"a": 1, "b": 1}, timeout_s=20)  # threads and connections, pre-fork
if _warm.content != 2:
    raise RuntimeError(f"the master's call failed: {_warm}")
MASTER = {"pid": os.getpid(), "client_id": client.client_id, "reply_to": client.reply_to}


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Make one call through the preloaded client; answer its outcome and this process's ids."""
    started = time.monotonic()
    result = client.call(ADD, {"a": 2, "b": 3}, timeout_s=DEADLINE_S)
    body = {
        "status": str(result.status),
        "content": result.content,
        "elapsed_s": time.monotonic() - started,
        "pid": os.getpid(),
        "client_id": client.client_id,
        "reply_to": client.reply_to,
        "master": MASTER,
    }
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]
