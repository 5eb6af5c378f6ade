"""The ops page over HTTP (no browser): what curl sees, who may change what, the CLI's rules."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient
from ui_support import TOKENS, UiProcess, csrf_of, login, start_ui, ui_test_fleet, write_tokens

from conftest import Fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import switches_key
from toolfleet.ui import Principal, Role, UiConfig, create_app

ECHO = "ext_fleet_test_echo"
ADD = "ext_fleet_test_add"


@pytest.fixture(scope="module")
def ui_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    yield from ui_test_fleet(redis_url, namespace, tmp_path_factory, "ui")


@pytest.fixture(scope="module")
def ui(ui_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiProcess]:
    folder = tmp_path_factory.mktemp("ui")
    tokens = write_tokens(folder / "tokens.toml")
    started = start_ui(ui_fleet.redis_url, ui_fleet.namespace, folder,
                       "--tokens-file", str(tokens), "--interval", "0.5")  # fmt: skip
    yield started
    started.stop()


def _cell(html: str, function: str, column: str) -> int | None:
    """The number in ``column`` (``total`` or a status) of ``function``'s overview row."""
    row = re.search(rf'<tr data-tool="{re.escape(function)}">(.*?)</tr>', html, re.S)
    if row is None:
        return None
    attribute = "data-total" if column == "total" else f'data-status="{column}"'
    cell = re.search(rf"<td class=\"n\" {attribute}>(\d+)</td>", row.group(1))
    return None if cell is None else int(cell.group(1))


def _until(check: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_refuses_to_start_without_auth_off_loopback(tmp_path: Path) -> None:
    """--no-auth on a non-loopback host, or no auth at all, is refused with one line."""
    for args in (["--host", "0.0.0.0", "--no-auth"], ["--host", "0.0.0.0"], []):
        out = subprocess.run([toolfleet_command(), "ui", *args], capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("toolfleet ui: "), out.stderr
        assert "--tokens-file" in lines[0]


def test_first_html_carries_the_counts(ui_fleet: Fleet, ui: UiProcess) -> None:
    """The overview's first HTML (no script run) holds each tool's calls by status."""
    with ToolClient(ui_fleet.redis_url, namespace=ui_fleet.namespace) as client:
        results = [client.call(ECHO, {"text": "x"}) for _ in range(3)]
        results.append(client.call(ECHO, {"text": 5}))  # invalid arguments
    assert [r.status.value for r in results] == ["ok", "ok", "ok", "invalid_arguments"]
    viewer = login(ui, "viewer")

    def counted() -> bool:
        html = viewer.get("/").text
        return _cell(html, ECHO, "ok") == 3 and _cell(html, ECHO, "invalid_arguments") == 1

    _until(counted, "the overview shows 3 ok and 1 invalid_arguments for echo")
    assert _cell(viewer.get("/").text, ECHO, "total") == 4


def test_pages_need_a_session(ui: UiProcess) -> None:
    """Without a session every page redirects to the login form and the stream is refused;
    a wrong token logs nobody in; the probes answer without one."""
    anonymous = httpx.Client(base_url=ui.url, timeout=10)
    for path in ("/", "/workers", "/tenants", "/failures", "/switches"):
        answer = anonymous.get(path)
        assert answer.status_code == 303 and answer.headers["location"] == "/login", path
    assert anonymous.get("/stream?page=overview").status_code == 401
    form = anonymous.get("/login")
    wrong = anonymous.post("/login", data={"token": "nope", "csrf": csrf_of(form.text)})
    assert wrong.headers["location"] == "/login?failed=1"
    assert "toolfleet_session" not in wrong.headers.get("set-cookie", "")
    no_csrf = anonymous.post("/login", data={"token": TOKENS["operator"]})
    assert no_csrf.status_code == 403
    assert anonymous.get("/livez").status_code == 200
    assert anonymous.get("/readyz").text == "ok"


def test_session_cookie_flags(ui: UiProcess) -> None:
    """The session cookie is HttpOnly and SameSite=Strict, and Secure only over HTTPS."""
    for https in (False, True):
        client = httpx.Client(base_url=ui.url, timeout=10)
        headers = {"x-forwarded-proto": "https"} if https else {}
        form = client.get("/login", headers=headers)
        # a client keeps a Secure cookie for HTTPS only: hand the pre-session one back by hand
        pre = form.headers["set-cookie"].split(";", 1)[0]
        data = {"token": TOKENS["viewer"], "csrf": csrf_of(form.text)}
        answer = client.post("/login", headers={**headers, "cookie": pre}, data=data)
        cookie = next(v for k, v in answer.headers.multi_items()
                      if k == "set-cookie" and v.startswith("toolfleet_session="))  # fmt: skip
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert "httponly" in flags and "samesite=strict" in flags, cookie
        assert ("secure" in flags) is https, cookie


def test_every_asset_is_the_apps_own(ui: UiProcess) -> None:
    """Every page says so in a Content-Security-Policy, and every asset it links is served
    by the app itself."""
    viewer = login(ui, "viewer")
    for path in ("/", "/workers", "/tenants", "/failures", "/switches", "/login"):
        answer = viewer.get(path)
        assert answer.status_code == 200, path
        csp = answer.headers["content-security-policy"]
        assert (
            "script-src 'self'" in csp and "style-src 'self'" in csp and "default-src 'none'" in csp
        )
        for link in re.findall(r'(?:src|href)="([^"]+)"', answer.text):
            assert link.startswith("/") and not link.startswith("//"), link
            if link.startswith("/static/"):
                assert viewer.get(link).status_code == 200, link


def test_only_an_operator_with_the_csrf_token_flips_a_switch(
    ui_fleet: Fleet, ui: UiProcess
) -> None:
    """A viewer's page has no control and its POST is refused; an operator's POST without
    the CSRF token, with another session's token or from another origin is refused; with
    it the switch changes in Redis."""
    r = redis.Redis.from_url(ui_fleet.redis_url)
    viewer, operator = login(ui, "viewer"), login(ui, "operator")
    viewer_page = viewer.get("/switches").text
    assert f'data-switch="{ADD}"' in viewer_page and 'data-action="flip"' not in viewer_page
    form = {"name": ADD, "state": "off"}
    assert viewer.post("/switches", data={**form, "csrf": csrf_of(viewer_page)}).status_code == 403
    operator_page = operator.get("/switches").text
    assert 'data-action="flip"' in operator_page
    assert operator.post("/switches", data=form).status_code == 403
    assert (
        operator.post("/switches", data={**form, "csrf": csrf_of(viewer_page)}).status_code == 403
    )
    foreign = operator.post("/switches", data={**form, "csrf": csrf_of(operator_page)},
                            headers={"origin": "https://evil.example"})  # fmt: skip
    assert foreign.status_code == 403
    assert r.hget(switches_key(ui_fleet.namespace), ADD) is None
    done = operator.post("/switches", data={**form, "csrf": csrf_of(operator_page)})
    assert done.status_code == 303
    assert r.hget(switches_key(ui_fleet.namespace), ADD) == b"off"
    r.hdel(switches_key(ui_fleet.namespace), ADD)


def test_read_only_offers_and_accepts_no_change(ui_fleet: Fleet, tmp_path: Path) -> None:
    """With --read-only an operator sees no control and a POST with a valid token is refused."""
    tokens = write_tokens(tmp_path / "tokens.toml")
    started = start_ui(ui_fleet.redis_url, ui_fleet.namespace, tmp_path,
                       "--tokens-file", str(tokens), "--read-only")  # fmt: skip
    try:
        operator = login(started, "operator")
        page = operator.get("/switches").text
        assert 'data-action="flip"' not in page and "read-only" in page
        answer = operator.post("/switches", data={"name": ADD, "state": "off",
                                                  "csrf": csrf_of(page)})  # fmt: skip
        assert answer.status_code == 403
    finally:
        started.stop()


def test_mounted_under_a_prefix_the_host_decides(ui_fleet: Fleet) -> None:
    """Mounted at /ops in a host application, the app links under /ops, and the host's
    callback decides who is let in and with which role."""

    def decide(request: Request) -> Principal | None:
        who = request.headers.get("x-user")
        if not who:
            return None
        return Principal(Role.OPERATOR if who.startswith("op-") else Role.VIEWER, who)

    ops = create_app(UiConfig(redis_client=lambda: redis.Redis.from_url(ui_fleet.redis_url),
                              namespace=ui_fleet.namespace, auth=decide))  # fmt: skip
    host = Starlette(routes=[Mount("/ops", app=ops)])
    with TestClient(host) as client:
        page = client.get("/ops/switches", headers={"x-user": "ana"})
        assert page.status_code == 200
        assert 'href="/ops/static/ui.css"' in page.text and 'href="/ops/workers"' in page.text
        assert 'data-action="flip"' not in page.text
        assert client.get("/ops/static/ui.js").status_code == 200
        assert client.get("/ops/", headers={}).status_code == 401
        assert client.get("/ops/livez").text == "ok"
        # each principal's CSRF token is its own: another operator's is refused
        tokens = {}
        for user in ("op-ana", "op-bo"):
            page = client.get("/ops/switches", headers={"x-user": user})
            assert 'data-action="flip"' in page.text
            tokens[user] = csrf_of(page.text)
        assert tokens["op-ana"] != tokens["op-bo"]
        form = {"name": ADD, "state": "on"}
        forged = client.post("/ops/switches", headers={"x-user": "op-bo"},
                             data={**form, "csrf": tokens["op-ana"]})  # fmt: skip
        assert forged.status_code == 403
        mine = {**form, "csrf": tokens["op-bo"]}
        own = client.post("/ops/switches", headers={"x-user": "op-bo"}, data=mine,
                          follow_redirects=False)  # fmt: skip
        assert own.status_code == 303 and own.headers["location"].startswith("/ops/switches")
        redis.Redis.from_url(ui_fleet.redis_url).hdel(switches_key(ui_fleet.namespace), ADD)


def test_the_workers_page_shows_each_process_from_its_heartbeat(
    ui_fleet: Fleet, ui: UiProcess
) -> None:
    """Each worker process is listed with its supervisor, threads, version and the Redis
    round trip of its last heartbeat."""
    viewer = login(ui, "viewer")
    pids = ui_fleet.worker_pids()
    assert len(pids) == 1

    def listed() -> bool:
        return f':{pids[0]}"' in viewer.get("/workers").text

    _until(listed, "the worker process is on the workers page")
    html = viewer.get("/workers").text
    row = re.search(rf'<tr data-worker="[^"]*:{pids[0]}"[^>]*>(.*?)</tr>', html, re.S)
    assert row is not None, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert re.fullmatch(r"\d+/4", cells[1]), cells  # threads busy of 4
    assert re.fullmatch(r"\d+\.\d ms", cells[3]), cells  # the heartbeat's round trip
    assert cells[4] == "0.1.0"
    assert cells[5].endswith(f":{ui_fleet.process.pid}")  # its supervisor
    assert "tools.fleet-test" in cells[6]


def test_a_tokens_file_of_the_wrong_shape_is_refused_with_one_line(tmp_path: Path) -> None:
    """A role that is not viewer or operator, or a digest that is not SHA-256, stops the
    command with one line naming the file and the field."""
    for body, field in (('[[tokens]]\nsha256 = "%s"\nrole = "admin"\n' % ("a" * 64), "role"),
                        ('[[tokens]]\nsha256 = "abc"\nrole = "viewer"\n', "sha256")):  # fmt: skip
        path = tmp_path / "tokens.toml"
        path.write_text(body, encoding="utf-8")
        out = subprocess.run([toolfleet_command(), "ui", "--tokens-file", str(path)],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert str(path) in lines[0] and field in lines[0], lines


def test_no_auth_on_loopback_serves_every_visitor_as_an_operator(
    ui_fleet: Fleet, tmp_path: Path
) -> None:
    """With --no-auth on 127.0.0.1 pages need no login and carry working controls, still
    guarded by the CSRF token."""
    started = start_ui(ui_fleet.redis_url, ui_fleet.namespace, tmp_path, "--no-auth")
    try:
        anyone = httpx.Client(base_url=started.url, timeout=10)
        page = anyone.get("/switches")
        assert page.status_code == 200 and 'data-action="flip"' in page.text
        form = {"name": ADD, "state": "on"}
        assert anyone.post("/switches", data=form).status_code == 403
        assert (
            anyone.post("/switches", data={**form, "csrf": csrf_of(page.text)}).status_code == 303
        )
    finally:
        started.stop()
        redis.Redis.from_url(ui_fleet.redis_url).hdel(switches_key(ui_fleet.namespace), ADD)
