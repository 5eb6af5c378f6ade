"""Extensions: four tool styles, broken extensions, secrets, availability, switches."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conftest import TESTS, Fleet, sandbox_reason, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status, ToolCallRequest
from toolfleet.shared.naming import catalog_key, extension_errors_key, switches_key
from toolfleet.shared.wire import CallContext, ReplyEnvelope, ToolCallResult, new_call_id

BROKEN = TESTS / "broken_extensions"
SECRET = "sk-planted-" + uuid.uuid4().hex
STYLES = ["class", "meta", "kit", "delegate"]


@pytest.fixture(scope="module")
def ext_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with the style, guarded and broken extensions loaded."""
    specs = [f"ext_styles.styles:{s}_style" for s in ("class", "metadata", "toolkit", "delegate")]
    extra = [arg for spec in [*specs, "guarded_ext:extension"] for arg in ("--extension", spec)]
    fleet = start_fleet(
        redis_url,
        f"{namespace}-ext-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("ext") / "worker.log",
        processes=1,
        extra=extra,
        env={
            "TFTEST_GUARDED_API_KEY": SECRET,
            "TOOLFLEET_EXTENSION_PATHS": str(TESTS / "broken_extensions"),
        },
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def ext_client(ext_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(ext_fleet.redis_url, namespace=ext_fleet.namespace) as c:
        yield c


CALLS = [
    {"name": "Ada"},
    '{"name": "Ada", "punctuation": "?"}',
    {"name": "   "},
    {},
    {"name": "Ada", "loud": True},
    '{"name": ',
    {"name": 5},
]


def test_four_styles_answer_the_same(ext_client: ToolClient) -> None:
    """The same calls to the class, metadata, toolkit and delegate styles give the same replies."""
    answers = {
        style: [
            (r.status, r.content)
            for r in (ext_client.call(f"ext_style_{style}_greet", c) for c in CALLS)
        ]
        for style in STYLES
    }
    reference = answers["class"]
    assert [status for status, _ in reference] == [
        Status.OK,
        Status.OK,
        Status.TOOL_ERROR,
        Status.INVALID_ARGUMENTS,
        Status.INVALID_ARGUMENTS,
        Status.INVALID_ARGUMENTS,
        Status.INVALID_ARGUMENTS,
    ]
    assert reference[0][1] == "Hello, Ada!" and reference[1][1] == "Hello, Ada?"
    for style in STYLES[1:]:
        assert answers[style] == reference, style


@pytest.mark.parametrize(
    ("style", "attr"),
    [("class", "class_style"), ("meta", "metadata_style"), ("kit", "toolkit_style"),
     ("delegate", "delegate_style")],
)  # fmt: skip
def test_run_tool_answers_what_the_fleet_answers(
    ext_client: ToolClient, style: str, attr: str
) -> None:
    """toolfleet.testing.run_tool gives each call the status and content a worker of the
    fleet posts, for every tool style (what a user's unit test sees is what the model sees)."""
    from ext_styles import styles

    from toolfleet.testing import run_tool

    for arguments in CALLS:
        fleet = ext_client.call(f"ext_style_{style}_greet", arguments)
        local = run_tool(getattr(styles, attr), "greet", arguments)
        assert (local.status, local.content) == (fleet.status, fleet.content), arguments
        assert local.function == fleet.function


def test_good_tools_serve_beside_broken_extensions(
    ext_client: ToolClient, ext_fleet: Fleet
) -> None:
    """Broken extensions are skipped and reported; the good one in the same folder serves."""
    assert ext_client.call("ext_good_ext_ping", {}).content == "pong"
    client = redis.Redis.from_url(ext_fleet.redis_url)
    errors = {
        k.decode(): v.decode()
        for k, v in client.hgetall(extension_errors_key(ext_fleet.namespace)).items()
    }
    client.close()
    text = "\n".join(f"{k}: {v}" for k, v in errors.items())
    assert "a_module_that_does_not_exist" in text
    assert "invalid manifest" in text and "version" in text
    assert "no model here" in text
    assert "duplicate function name ext_duplicate_same" in text
    assert ext_client.call("ext_duplicate_same", {}).status is Status.UNKNOWN_FUNCTION


def test_extensions_check_lists_each_problem_and_exits_one() -> None:
    """`toolfleet extensions check PATH` prints every problem and exits 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    out = subprocess.run(
        [toolfleet_command(), "extensions", "check", "--no-entry-points", str(BROKEN)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    for needle in ("import_error", "bad_manifest", "bad_tool", "duplicate"):
        assert needle in out.stdout, needle
    assert "good-ext" in out.stdout and "4 extension(s) with problems" in out.stdout


def test_extensions_check_passes_on_good_extensions() -> None:
    """The built-in extensions check clean; on a host that cannot start the python tool's
    sandbox, that is the one problem, with the reason, and the check exits 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["COLUMNS"] = "1000"  # one line per problem
    out = subprocess.run(
        [toolfleet_command(), "extensions", "check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "bfcl" in out.stdout and "date-calculator" in out.stdout
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem")]
    reason = sandbox_reason()
    if reason is None:
        assert out.returncode == 0 and not problems, out.stdout + out.stderr
    else:
        assert out.returncode == 1 and len(problems) == 1, out.stdout
        assert problems[0].startswith("problem entry point python") and reason in problems[0]


def test_secret_never_leaves_the_worker(ext_client: ToolClient, ext_fleet: Fleet) -> None:
    """A planted secret appears in no reply, log record, catalog entry or error text."""
    ctx = {"account": "acme"}
    replies = [
        ext_client.call(f"ext_guarded_{t}", {}, context=ctx)
        for t in ("leak", "leak_in_error", "leak_in_crash")
    ]
    assert [r.status for r in replies] == [Status.OK, Status.TOOL_ERROR, Status.CRASHED]
    assert "[redacted]" in str(replies[0].content) and "[redacted]" in str(replies[1].content)
    for reply in replies:
        assert SECRET not in reply.model_dump_json()
    time.sleep(0.3)
    log = ext_fleet.log()
    assert "cannot use [redacted]" in log and "using key [redacted]" in log
    assert SECRET not in log
    client = redis.Redis.from_url(ext_fleet.redis_url)
    stored = b"".join(client.hvals(catalog_key(ext_fleet.namespace)))
    stored += b"".join(client.hvals(extension_errors_key(ext_fleet.namespace)))
    client.close()
    assert SECRET.encode() not in stored and b"api_key" in stored


def _direct_call(fleet: Fleet, function: str, account: str | None) -> ToolCallResult:
    client = redis.Redis.from_url(fleet.redis_url)
    reply_to = f"{fleet.namespace}:reply:direct-{new_call_id()}"
    request = ToolCallRequest(
        id=new_call_id(),
        function=function,
        arguments={},
        context=CallContext(account=account),
        reply_to=reply_to,
        deadline=time.time() + 10,
        timeout_s=10,
    )
    Publisher(client, fleet.namespace).publish("tools.guarded", request)
    item = client.blpop([reply_to], timeout=10)
    client.close()
    assert item is not None
    result = ReplyEnvelope.decode(item[1]).result
    assert result is not None
    return result


def test_worker_refuses_accounts_the_extension_is_not_available_to(ext_fleet: Fleet) -> None:
    """With the producer bypassed, the worker answers not_available to other accounts."""
    assert _direct_call(ext_fleet, "ext_guarded_mode", "acme").status is Status.OK
    for account in ("initech", "globex", None):
        result = _direct_call(ext_fleet, "ext_guarded_mode", account)
        assert result.status is Status.NOT_AVAILABLE, account
        assert "not available to this account" in str(result.content)


def test_producer_lists_only_what_the_account_may_call(ext_client: ToolClient) -> None:
    """tools(account=...) hides what the account may not use; a call fails fast not_available."""
    names = lambda account: {t["function"]["name"] for t in ext_client.tools(account=account)}  # noqa: E731
    assert "ext_guarded_mode" in names("acme")
    assert "ext_guarded_mode" not in names("globex") and "ext_guarded_mode" not in names(None)
    assert (
        ext_client.call("ext_guarded_mode", {}, context={"account": "initech"}).status
        is Status.NOT_AVAILABLE
    )


def test_switches_change_behaviour_at_run_time(ext_client: ToolClient, ext_fleet: Fleet) -> None:
    """`toolfleet switch` turns an extension switch and a function on/off without restart."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": ext_fleet.redis_url,
        "TOOLFLEET_NAMESPACE": ext_fleet.namespace,
    }

    def switch(*args: str) -> str:
        out = subprocess.run(
            [toolfleet_command(), "switch", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        return out.stdout

    acme = {"account": "acme"}
    assert ext_client.call("ext_guarded_mode", {}, context=acme).content["loud"] is False
    switch("on", "ext_guarded_loud")
    _eventually(
        lambda: ext_client.call("ext_guarded_mode", {}, context=acme).content["loud"] is True
    )
    assert "ext_guarded_loud" in switch("list")
    switch("off", "ext_guarded_mode")
    _eventually(
        lambda: _direct_call(ext_fleet, "ext_guarded_mode", "acme").status is Status.NOT_AVAILABLE
    )
    _eventually(
        lambda: ext_client.call("ext_guarded_mode", {}, context=acme).status is Status.NOT_AVAILABLE
    )
    switch("on", "ext_guarded_mode")
    _eventually(lambda: ext_client.call("ext_guarded_mode", {}, context=acme).status is Status.OK)


def test_a_tool_switched_off_by_default_is_neither_offered_nor_run(
    ext_client: ToolClient, ext_fleet: Fleet
) -> None:
    """A tool whose switch is declared off by default, never set: not listed, not published,
    refused by the worker; `switch on` makes it all three."""
    acme = {"account": "acme"}
    names = {t["function"]["name"] for t in ext_client.tools(account="acme")}
    assert "ext_guarded_mode" in names and "ext_guarded_dormant" not in names
    local = ext_client.call("ext_guarded_dormant", {}, context=acme)
    assert local.status is Status.NOT_AVAILABLE and local.worker is None  # never published
    assert "switched off" in str(local.content)
    at_worker = _direct_call(ext_fleet, "ext_guarded_dormant", "acme")
    assert at_worker.status is Status.NOT_AVAILABLE and at_worker.worker is not None
    assert "switched off" in str(at_worker.content)
    client = redis.Redis.from_url(ext_fleet.redis_url)
    try:
        client.hset(switches_key(ext_fleet.namespace), "ext_guarded_dormant", "on")
        _eventually(
            lambda: (
                "ext_guarded_dormant"
                in {t["function"]["name"] for t in ext_client.tools(account="acme")}
            )
        )
        _eventually(
            lambda: _direct_call(ext_fleet, "ext_guarded_dormant", "acme").status is Status.OK
        )
        assert ext_client.call("ext_guarded_dormant", {}, context=acme).content == "awake"
    finally:
        client.hdel(switches_key(ext_fleet.namespace), "ext_guarded_dormant")
        client.close()


def _eventually(check: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_folder_names_resolve(tmp_path: Path) -> None:
    """Function names are ext_<slug>_<tool> with hyphens to underscores."""
    from toolfleet.shared.naming import extension_for, is_extension_function, tool_name_for

    assert is_extension_function("ext_date_calculator_add_days")
    assert not is_extension_function("calculate")
    assert extension_for("ext_bfcl_math_factorial", ["bfcl", "date-calculator"]) == "bfcl"
    assert tool_name_for("ext_date_calculator_add_days", ["bfcl", "date-calculator"]) == "add_days"
