"""A plain WSGI app (the shape of a Django or Flask view) that runs a turn's tool calls.

It uses the synchronous ``ToolClient``: one per process, created on first use and
shared by every request thread (it is thread-safe and holds one reply connection).

``POST /tool-messages?account=acme`` with an OpenAI Chat Completions response (or
assistant message, Responses output, Anthropic message) as the JSON body answers
``{"messages": [...]}``: the tool messages to append, one per call, in order. A body
that is not JSON answers 400, one of no known format 422.

In Django the view is the same three lines::

    def tool_messages(request):
        turn = json.loads(request.body)
        messages = get_client().dispatch(turn, context={"account": ...}, timeout_s=20)
        return JsonResponse({"messages": messages})

Run it with a fleet on the same Redis (``toolfleet worker``)::

    TOOLFLEET_REDIS_URL=redis://127.0.0.1:6379/0 python wsgi_app.py   # wsgiref on :8000
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

from toolfleet.producer import ToolClient
from toolfleet.shared import ClientError

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_client: ToolClient | None = None
_client_lock = threading.Lock()


def get_client() -> ToolClient:
    """The process's one ``ToolClient`` (configured from ``TOOLFLEET_*``), made on first use."""
    global _client
    with _client_lock:
        if _client is None:
            _client = ToolClient()
        return _client


def make_application(
    client: Callable[[], ToolClient] = get_client, *, timeout_s: float = 20.0
) -> WSGIApp:
    """A WSGI application answering ``POST /tool-messages``.

    Args:
        client: returns the ``ToolClient`` to use.
        timeout_s: one deadline for all the tool calls of a turn, seconds.
    """

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/tool-messages" or environ["REQUEST_METHOD"] != "POST":
            return _reply(start_response, "404 Not Found", {"detail": "POST /tool-messages"})
        length = int(environ.get("CONTENT_LENGTH") or 0)
        try:
            turn = json.loads(environ["wsgi.input"].read(length))
        except ValueError as exc:
            return _reply(start_response, "400 Bad Request", {"detail": f"not JSON: {exc}"})
        account = parse_qs(environ.get("QUERY_STRING", "")).get("account", [None])[0]
        try:
            messages = client().dispatch(turn, context={"account": account}, timeout_s=timeout_s)
        except ClientError as exc:
            return _reply(start_response, "422 Unprocessable Entity", {"detail": str(exc)})
        return _reply(start_response, "200 OK", {"messages": messages})

    return application


def _reply(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


application = make_application()

if __name__ == "__main__":
    with make_server("127.0.0.1", 8000, application) as server:
        server.serve_forever()
