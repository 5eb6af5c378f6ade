"""The ops page under test: ``toolfleet ui`` started through the real CLI, and its tokens."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import TESTS, Fleet, delete_namespace, start_fleet, toolfleet_command
from private_redis import free_port, stop_process

#: The tokens the test tokens file accepts, by role.
TOKENS = {"viewer": "viewer-token-for-tests", "operator": "operator-token-for-tests"}


def write_tokens(path: Path) -> Path:
    """A tokens file accepting :data:`TOKENS` (their SHA-256, as an operator writes it)."""
    lines = []
    for role, token in TOKENS.items():
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines += ["[[tokens]]", f'sha256 = "{digest}"', f'role = "{role}"', ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@dataclass
class UiProcess:
    """A running ``toolfleet ui``."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process)


def start_ui(
    redis_url: str, namespace: str, folder: Path, *args: str, port: int | None = None
) -> UiProcess:
    """Start ``toolfleet ui ARGS`` on a free loopback port; return once ``/livez`` answers."""
    port = port or free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": redis_url,
        "TOOLFLEET_NAMESPACE": namespace,
        "TOOLFLEET_WORKER_TTL_S": "3",
    }
    log_path = folder / f"ui-{port}.log"
    argv = [toolfleet_command(), "ui", "--host", "127.0.0.1", "--port", str(port), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    started = UiProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"toolfleet ui exited:\n{started.log()}")
        try:
            if httpx.get(started.url + "/livez", timeout=1).status_code == 200:
                return started
        except httpx.HTTPError:
            time.sleep(0.1)
    started.stop()
    raise AssertionError(f"toolfleet ui did not answer:\n{started.log()}")


def login(ui: UiProcess, role: str) -> httpx.Client:
    """An HTTP client logged in as ``role`` through the login form (CSRF token included)."""
    client = httpx.Client(base_url=ui.url, timeout=10)
    form = client.get("/login")
    csrf = form.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    answer = client.post("/login", data={"token": TOKENS[role], "csrf": csrf})
    assert answer.status_code == 303 and answer.headers["location"].endswith("/"), answer.text
    return client


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    return html.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def ui_test_fleet(
    redis_url: str,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
    tag: str,
    extra: list[str] | None = None,
) -> Iterator[Fleet]:
    """Body of a module fixture: one worker process of four threads in its own namespace
    ``<namespace>-<tag>-<hex>``, stopped and its keys deleted after the module; ``extra``:
    more ``toolfleet worker`` arguments (e.g. ``--extension``)."""
    ns = f"{namespace}-{tag}-{uuid.uuid4().hex[:6]}"
    running = start_fleet(redis_url, ns, tmp_path_factory.mktemp(f"{tag}fleet") / "worker.log",
                          processes=1, threads=4, extra=extra)  # fmt: skip
    yield running
    running.stop()
    delete_namespace(redis_url, ns)
