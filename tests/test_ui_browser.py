"""The ops page in a real browser (Debian's chromium, driven by Playwright) against a live
fleet: counts that change live, switches, roles, failures, dead letters, restarts, widths.

Screenshots of every page at 1280 and 390 px wide are written to ``build/ui-screenshots``
on every run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from ui_support import TOKENS, UiProcess, csrf_of, start_ui, ui_test_fleet, write_tokens

from conftest import TEST_QUEUE, TESTS, Fleet, unavailable
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import encode_message
from toolfleet.shared.aggregates import Accumulator
from toolfleet.shared.aggregates import write as write_aggregates
from toolfleet.shared.naming import dead_letters_key, reply_key
from toolfleet.shared.wire import ToolCallRequest, new_call_id

playwright_api = pytest.importorskip("playwright.sync_api")

ECHO = "ext_fleet_test_echo"
ADD = "ext_fleet_test_add"
FAIL = "ext_fleet_test_fail"
MARK = "ext_fleet_test_mark"
SCREENSHOTS = TESTS.parent / "build" / "ui-screenshots"
WIDTHS = (1280, 390)
#: Milliseconds the browser waits for something to appear (live updates every 0.5 s).
WAIT_MS = 30_000


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        unavailable("Debian's chromium is not installed (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def live_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    # the session tools add a slot queue per worker process, as the python tool does
    extra = ["--extension", "session_tools:extension"]
    yield from ui_test_fleet(redis_url, namespace, tmp_path_factory, "uib", extra)


@pytest.fixture(scope="module")
def ui_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("uib")
    write_tokens(folder / "tokens.toml")
    return folder


def _start(fleet: Fleet, folder: Path, port: int | None = None) -> UiProcess:
    return start_ui(fleet.redis_url, fleet.namespace, folder, "--tokens-file",
                    str(folder / "tokens.toml"), "--interval", "0.5", port=port)  # fmt: skip


@pytest.fixture(scope="module")
def ui(live_fleet: Fleet, ui_folder: Path) -> Iterator[list[UiProcess]]:
    """The ``toolfleet ui`` process, in a list so that a test can restart it."""
    holder = [_start(live_fleet, ui_folder)]
    yield holder
    holder[0].stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def calls(live_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(live_fleet.redis_url, namespace=live_fleet.namespace) as client:
        yield client


def _page(browser: Any, ui: UiProcess, role: str, width: int = 1280) -> Any:
    """A new browser page logged in as ``role`` through the login form."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(ui.url + "/login")
    page.fill("input[name=token]", TOKENS[role])
    page.click("button[type=submit]")
    page.wait_for_url(ui.url + "/")
    return page


def _cell(page: Any, function: str, status: str) -> Any:
    return page.locator(f'tr[data-tool="{function}"] td[data-status="{status}"]')


def test_overview_counts_the_calls_and_changes_live(
    browser: Any, ui: list[UiProcess], calls: ToolClient
) -> None:
    """The overview shows each tool that ran with its count, and the count changes as
    calls run, without a reload."""
    expect = playwright_api.expect
    for _ in range(2):
        assert calls.call(ECHO, {"text": "a"}).ok
    page = _page(browser, ui[0], "viewer")
    expect(_cell(page, ECHO, "ok")).to_have_text("2")
    page.evaluate("window.sameDocument = true")
    for _ in range(3):
        assert calls.call(ECHO, {"text": "b"}).ok
    assert calls.call(ECHO, {"times": 2}).status.value == "invalid_arguments"
    expect(_cell(page, ECHO, "ok")).to_have_text("5")
    expect(_cell(page, ECHO, "invalid_arguments")).to_have_text("1")
    assert page.evaluate("window.sameDocument") is True  # patched by the stream, not reloaded
    page.click("#pause")
    expect(page.locator("body")).to_have_attribute("data-live", "paused")
    page.context.close()


def test_an_operator_flips_a_switch_and_the_next_call_obeys(
    browser: Any, ui: list[UiProcess], calls: ToolClient
) -> None:
    """Turning a function off from the page makes the very next call not_available, and
    turning it on again makes the next one ok."""
    page = _page(browser, ui[0], "operator")
    assert calls.call(ADD, {"a": 1, "b": 2}).ok
    page.goto(ui[0].url + "/switches")
    row = page.locator(f'tr[data-switch="{ADD}"]')
    row.locator('button[data-action="flip"]').click()
    page.wait_for_url("**/switches?message=*")
    playwright_api.expect(row.locator("td[data-state]")).to_have_text("off")
    assert calls.call(ADD, {"a": 1, "b": 2}).status.value == "not_available"
    row.locator('button[data-action="flip"]').click()
    playwright_api.expect(row.locator("td[data-state]")).to_have_text("on")
    assert calls.call(ADD, {"a": 1, "b": 2}).ok
    page.context.close()


def test_a_viewer_has_no_control_and_a_forged_post_is_refused(
    browser: Any, ui: list[UiProcess], live_fleet: Fleet
) -> None:
    """A viewer's switches page has no control; a POST from its session, with or without
    its CSRF token, is refused and changes nothing."""
    page = _page(browser, ui[0], "viewer")
    page.goto(ui[0].url + "/switches")
    playwright_api.expect(page.locator(f'tr[data-switch="{ADD}"]')).to_be_visible()
    assert page.locator('button[data-action="flip"]').count() == 0
    token = csrf_of(page.content())  # the logout form's
    form = {"name": ADD, "state": "off"}
    assert page.request.post(ui[0].url + "/switches", form=form).status == 403
    assert page.request.post(ui[0].url + "/switches", form={**form, "csrf": token}).status == 403
    r = redis.Redis.from_url(live_fleet.redis_url)
    assert r.hget(f"{live_fleet.namespace}:switches", ADD) in (None, b"on")
    page.context.close()


def test_a_failed_call_is_found_by_its_call_id(
    browser: Any, ui: list[UiProcess], calls: ToolClient
) -> None:
    """Searching the failures page for a failed call's id shows its status and error."""
    failed = calls.call(FAIL, {"reason": "the disk is full"})
    assert failed.status.value == "tool_error"
    page = _page(browser, ui[0], "viewer")
    page.goto(ui[0].url + "/failures")
    page.fill("input[name=q]", failed.id)
    page.click(".search button[type=submit]")
    playwright_api.expect(page.locator("[data-lookup-status]")).to_have_text("tool_error")
    row = page.locator(f'tr[data-call="{failed.id}"]')
    playwright_api.expect(row).to_contain_text("the disk is full")
    playwright_api.expect(row).to_contain_text(FAIL)
    page.context.close()


def test_a_dead_letter_retried_from_the_page_runs_again(
    browser: Any, ui: list[UiProcess], live_fleet: Fleet, tmp_path: Path
) -> None:
    """A dead-lettered call (as Dramatiq's nack leaves it) is retried by an operator's
    click, and its tool runs again, as the new call the page names."""
    marker = tmp_path / "ran.txt"
    request = ToolCallRequest(
        id=new_call_id(), function=MARK, arguments={"path": str(marker)},
        reply_to=reply_key(live_fleet.namespace, "gone"), deadline=time.time() - 60,
        timeout_s=10.0,
    )  # fmt: skip
    redis_id, body = encode_message(TEST_QUEUE, request)
    r = redis.Redis.from_url(live_fleet.redis_url)
    key = dead_letters_key(live_fleet.namespace, TEST_QUEUE)
    r.hset(key + ".msgs", redis_id, body)
    r.zadd(key, {redis_id: time.time() * 1000})
    page = _page(browser, ui[0], "operator")
    page.goto(ui[0].url + "/failures")
    row = page.locator(f'tr[data-dead="{redis_id}"]')
    playwright_api.expect(row).to_contain_text(MARK)
    row.locator('button[data-action="retry"]').click()
    message = page.locator(".message")
    playwright_api.expect(message).to_contain_text("retried as call")
    new_id = message.inner_text().rsplit(" ", 1)[-1]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.1)
    assert marker.read_text().split() == [new_id]
    assert r.zscore(key, redis_id) is None
    playwright_api.expect(page.locator(f'tr[data-dead="{redis_id}"]')).to_have_count(0)
    page.context.close()


def _numbers(page: Any) -> dict[str, str]:
    cells = page.locator("tr[data-tool] td[data-total], tr[data-tool] td[data-status]")
    found = {}
    for i in range(cells.count()):
        cell = cells.nth(i)
        row = cell.locator("xpath=..").get_attribute("data-tool")
        column = cell.get_attribute("data-status") or "total"
        found[f"{row}/{column}"] = cell.inner_text()
    return found


def test_the_numbers_are_the_same_after_the_ui_restarts(
    browser: Any, ui: list[UiProcess], live_fleet: Fleet, ui_folder: Path
) -> None:
    """Restarting the ``ui`` process changes no number on the overview: they live in Redis."""
    page = _page(browser, ui[0], "viewer")
    before = _numbers(page)
    assert before.get(f"{ECHO}/ok") == "5" and before.get(f"{FAIL}/tool_error") == "1", before
    page.context.close()
    port = int(ui[0].url.rsplit(":", 1)[1])
    ui[0].stop()
    ui[0] = _start(live_fleet, ui_folder, port=port)
    page = _page(browser, ui[0], "viewer")
    assert _numbers(page) == before
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_the_width_and_is_photographed(
    browser: Any, ui: list[UiProcess], width: int
) -> None:
    """At 1280 and 390 px no page scrolls sideways (wide tables scroll inside their box);
    a screenshot of each is kept under build/ui-screenshots."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = _page(browser, ui[0], "operator", width=width)
    for name in ("overview", "workers", "tenants", "failures", "switches"):
        page.goto(ui[0].url + ("/" if name == "overview" else f"/{name}"))
        page.wait_for_selector("#live")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name} at {width} px is {overflow} px too wide"
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    page.context.close()


#: A function name of the longest allowed length (64 characters).
LONGEST = "ext_a_long_extension_slug_with_a_long_tool_name_as_long_as_allow"
#: Every status a worker answers with (the ops page shows a column for each one seen).
WORKER_STATUSES = ("ok", "tool_error", "invalid_arguments", "timeout", "canceled", "expired",
                   "crashed", "rejected")  # fmt: skip


def test_at_1280_px_no_table_scrolls_sideways(
    browser: Any, ui: list[UiProcess], live_fleet: Fleet
) -> None:
    """At 1280 px every table of every page fits its box (no sideways scrolling inside it),
    also with a 64-character function name and a column for every status a worker
    answers; the workers table sums a process's slot queues up as ``(+N slot)`` after
    their queue."""
    counts = Accumulator()  # a worker's counts, written as its heartbeat writes them
    for status in WORKER_STATUSES:
        counts.record(LONGEST, "unknown", status, queued_s=0.2, run_s=0.0004)
    client = redis.Redis.from_url(live_fleet.redis_url)
    pipe = client.pipeline()
    write_aggregates(pipe, live_fleet.namespace, counts.drain(), 3600)
    pipe.execute()
    client.close()
    page = _page(browser, ui[0], "operator")
    expect = playwright_api.expect
    expect(page.locator(f'tr[data-tool="{LONGEST}"] td[data-status="rejected"]')).to_have_text("1")
    page.goto(ui[0].url + "/workers")
    queues = page.locator("table.workers tbody tr td").nth(6)
    expect(queues).to_contain_text("tools.session-test (+1 slot)")
    assert ".slot." not in queues.inner_text()
    for name in ("overview", "workers", "tenants", "failures", "switches"):
        page.goto(ui[0].url + ("/" if name == "overview" else f"/{name}"))
        page.wait_for_selector("#live")
        wider = page.evaluate(
            "[...document.querySelectorAll('.scroll')]"
            ".map(box => box.scrollWidth - box.clientWidth).filter(extra => extra > 0)"
        )
        assert wider == [], f"{name}: a table is wider than its box by {wider} px at 1280 px"
        page.screenshot(path=str(SCREENSHOTS / f"{name}-1280-all-statuses.png"), full_page=True)
    page.context.close()
