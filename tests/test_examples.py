"""The framework examples in docs/examples run against a real fleet."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from fastapi.testclient import TestClient

from conftest import Fleet
from toolfleet.producer import ToolClient

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
FIXTURES = Path(__file__).parent / "fixtures"
F = "ext_fleet_test_"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"toolfleet_example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _completion() -> dict[str, Any]:
    return json.loads((FIXTURES / "openai_chat_completion.json").read_text())


def _check(messages: list[dict[str, Any]]) -> None:
    ids = [c["id"] for c in _completion()["choices"][0]["message"]["tool_calls"]]
    assert [m["tool_call_id"] for m in messages] == ids
    assert json.loads(messages[1]["content"]) == 21
    assert json.loads(messages[4]["content"])["error"].startswith("no reply within")


def test_fastapi_example_returns_the_tool_messages(fleet: Fleet) -> None:
    """The FastAPI endpoint turns a chat completion into its tool messages, streams events,
    and answers 422 for a body of no known format."""
    app = _load("fastapi_app").create_app(fleet.redis_url, namespace=fleet.namespace, timeout_s=1.5)
    with TestClient(app) as http:
        reply = http.post("/tool-messages?account=acme", json=_completion())
        assert reply.status_code == 200, reply.text
        _check(reply.json()["messages"])
        function = {"name": F + "echo", "arguments": '{"text": "hi"}'}
        echo = {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": function}],
        }
        reply = http.post("/tool-messages?account=acme", json=echo)
        assert json.loads(reply.json()["messages"][0]["content"]) == {
            "text": "hi",
            "account": "acme",
        }
        with http.stream("POST", "/tool-messages/stream", json=_completion()) as streamed:
            lines = [json.loads(line) for line in streamed.iter_lines() if line]
        events, last = lines[:-1], lines[-1]
        assert sum(e["kind"] == "result" for e in events) == 6
        assert [e["kind"] for e in events if e["index"] == 1] == ["queued", "running", "result"]
        _check(last["messages"])
        assert http.post("/tool-messages", json={"hello": "world"}).status_code == 422
        assert http.post("/tool-messages/stream", json={"hello": 1}).status_code == 422


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def wsgi_url(fleet: Fleet) -> Iterator[str]:
    """The WSGI example served by a threading wsgiref server on a free port."""
    module = _load("wsgi_app")
    client = ToolClient(fleet.redis_url, namespace=fleet.namespace)
    app = module.make_application(lambda: client, timeout_s=1.5)
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    client.close()


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_wsgi_example_serves_concurrent_requests(wsgi_url: str) -> None:
    """The WSGI view answers a recorded turn, concurrent requests on one shared sync client,
    400 for a body that is not JSON and 422 for one of no known format."""
    status, body = _post(
        f"{wsgi_url}/tool-messages?account=acme", json.dumps(_completion()).encode()
    )
    assert status == 200
    _check(body["messages"])

    def turn(n: int) -> list[dict[str, Any]]:
        calls = [
            {"id": f"call_{n}_{k}", "type": "function",
             "function": {"name": F + "add", "arguments": json.dumps({"a": n, "b": k})}}
            for k in range(3)
        ]  # fmt: skip
        status, body = _post(f"{wsgi_url}/tool-messages", json.dumps(calls).encode())
        assert status == 200
        return [json.loads(m["content"]) for m in body["messages"]]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(turn, range(16)))
    assert answers == [[n, n + 1, n + 2] for n in range(16)]
    assert _post(f"{wsgi_url}/tool-messages", b"{not json")[0] == 400
    assert _post(f"{wsgi_url}/tool-messages", b'"hello"')[0] == 422
