"""Failed calls stay findable by id for the failures retention, at bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path

import pytest
import redis
from ui_support import login, start_ui, write_tokens

from conftest import Fleet, delete_namespace, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.failures import newest, record, search, write
from toolfleet.shared.naming import events_key, failures_key, outcome_key
from toolfleet.shared.settings import Settings

ADD = "ext_fleet_test_add"
FAIL = "ext_fleet_test_fail"
ECHO = "ext_fleet_test_echo"
T0 = 1_800_000_000.0


@pytest.fixture
def ns(r: redis.Redis) -> Iterator[str]:
    name = f"fh-{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(r.scan_iter(match=f"{name}:*"))
    if keys:
        r.delete(*keys)


def test_retention_defaults_to_a_day() -> None:
    """The retention is a setting, 24 h unless set."""
    assert Settings().failures_retention_s == 86_400
    assert Settings(failures_retention_s=3600).failures_retention_s == 3600


def test_each_batch_trims_the_index_by_time_and_by_count(r: redis.Redis, ns: str) -> None:
    """A batch written at T0 + 100 with a 60 s retention drops what is older than T0 + 40;
    past ``max_entries`` the oldest go; the key expires with the retention."""
    old = [record(f"old-{i}", "f", "tool_error", "e", at_s=T0 + i) for i in range(30)]
    pipe = r.pipeline(transaction=False)
    write(pipe, ns, old, retention_s=60, max_entries=1000, now_s=T0 + 30)
    pipe.execute()
    assert r.zcard(failures_key(ns)) == 30

    new = [record(f"new-{i}", "f", "timeout", "e", at_s=T0 + 90 + i * 0.1) for i in range(8)]
    pipe = r.pipeline(transaction=False)
    write(pipe, ns, new, retention_s=60, max_entries=1000, now_s=T0 + 100)
    pipe.execute()
    # kept: at >= T0 + 40, so none of the old ones (T0 .. T0 + 29), all 8 new ones
    assert sorted(f["id"] for f in newest(r, [ns], 100)) == sorted(f"new-{i}" for i in range(8))

    pipe = r.pipeline(transaction=False)
    write(pipe, ns, [record("last", "f", "crashed", "e", at_s=T0 + 101)], 60, 5, now_s=T0 + 101)
    pipe.execute()
    assert [f["id"] for f in newest(r, [ns], 100)] == ["last", "new-7", "new-6", "new-5", "new-4"]
    assert 0 < r.ttl(failures_key(ns)) <= 60


def test_search_finds_any_field_in_any_case(r: redis.Redis, ns: str) -> None:
    """A search by call id, function or account, in any case, among 3,000 failures."""
    batch = [
        record(uuid.uuid4().hex, f"ext_x_tool{i % 7}", "invalid_arguments", "bad",
               account=f"Acme-{i:04d}", at_s=T0 + i)
        for i in range(3000)
    ]  # fmt: skip
    pipe = r.pipeline(transaction=False)
    write(pipe, ns, batch, retention_s=10**9, max_entries=10_000, now_s=T0 + 3000)
    pipe.execute()
    target = batch[17]
    assert [f["id"] for f in search(r, [ns], target["id"].upper())] == [target["id"]]
    assert [f["id"] for f in search(r, [ns], "acme-0017")] == [target["id"]]
    found = search(r, [ns], "EXT_X_TOOL3", limit=5000)
    assert len(found) == len([i for i in range(3000) if i % 7 == 3])


@pytest.fixture(scope="module")
def short_ttl_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process whose outcomes live about 3 s (reply TTL 1 s, calls of 2 s)."""
    ns = f"{namespace}-fh-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(
        redis_url, ns, tmp_path_factory.mktemp("fh") / "worker.log", processes=1, threads=4,
        env={"TOOLFLEET_REPLY_TTL_S": "1"},
    )  # fmt: skip
    yield fleet
    fleet.stop()
    delete_namespace(redis_url, ns)


def _events_call(fleet: Fleet, call_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [toolfleet_command(), "events", "--call", call_id],
        env={**os.environ, "TOOLFLEET_REDIS_URL": fleet.redis_url,
             "TOOLFLEET_NAMESPACE": fleet.namespace},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_failed_calls_behind_600_newer_events_are_found_after_their_outcome_expired(
    short_ttl_fleet: Fleet, tmp_path: Path
) -> None:
    """A tool_error and an invalid_arguments call, then 600 calls (60 of them failing):
    once the two outcomes have expired and 500 newer events have passed, the failures
    page's search and ``toolfleet events --call`` still find both, with status and error."""
    fleet = short_ttl_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        failed = client.call(FAIL, {"reason": "the disk is full"}, timeout_s=2)
        invalid = client.call(ADD, {"a": 1}, timeout_s=2)
        assert failed.status is Status.TOOL_ERROR and invalid.status is Status.INVALID_ARGUMENTS
        futures = [
            client.submit(FAIL, {"reason": f"r{i}"}, timeout_s=60)
            if i % 10 == 0
            else client.submit(ECHO, {"text": str(i)}, timeout_s=60)
            for i in range(600)
        ]
        wait(futures, timeout=120)
        assert all(f.result().status in (Status.OK, Status.TOOL_ERROR) for f in futures)
    r = redis.Redis.from_url(fleet.redis_url)
    newest_ids = {
        json.loads(fields[b"event"]).get("id")
        for _, fields in r.xrevrange(events_key(fleet.namespace), count=500)
    }
    assert failed.id not in newest_ids and invalid.id not in newest_ids
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        r.exists(outcome_key(fleet.namespace, failed.id))
        or r.exists(outcome_key(fleet.namespace, invalid.id))
    ):
        time.sleep(0.2)
    assert not r.exists(outcome_key(fleet.namespace, invalid.id)), "the outcome outlived 20 s"

    folder = tmp_path / "ui"
    folder.mkdir()
    tokens = write_tokens(folder / "tokens.toml")
    ui = start_ui(fleet.redis_url, fleet.namespace, folder, "--tokens-file", str(tokens))
    try:
        page = login(ui, "viewer")
        for call, status in ((failed, "tool_error"), (invalid, "invalid_arguments")):
            html = page.get("/failures", params={"q": call.id}).text
            assert f'data-call="{call.id}"' in html, html[-3000:]
            assert f"<strong data-lookup-status>{status}</strong>" in html
        listed = page.get("/failures", params={"q": FAIL}).text
        assert listed.count("data-call=") == 61  # the first failure and the 60 later ones
    finally:
        ui.stop()

    for call, status, error in ((failed, "tool_error", "the disk is full"),
                                (invalid, "invalid_arguments", "b")):  # fmt: skip
        done = _events_call(fleet, call.id)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert (found["id"], found["status"], found["function"]) == (call.id, status, call.function)
        assert error in found["error"]
    assert _events_call(fleet, str(uuid.uuid4())).returncode == 1
