"""Per-account quotas: refused at once with retry_after_s, nothing published, held fleet-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from typing import Any

import redis

from conftest import Fleet, toolfleet_command
from toolfleet.producer import ToolClient, metrics
from toolfleet.shared.errors import RejectedError
from toolfleet.shared.naming import outcome_key
from toolfleet.shared.tenancy.quotas import Quota, limits_key
from toolfleet.shared.wire import Status

SLEEP = "ext_fleet_test_sleep"

#: A second producer process: at epoch ``start`` submit ``count`` calls, print the results.
_PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from toolfleet.producer import ToolClient, metrics
    url, ns, account, count, seconds = sys.argv[1:6]
    with ToolClient(url, namespace=ns) as client:
        client.tools()
        print("ready", flush=True)
        start = float(sys.stdin.readline())
        time.sleep(max(0.0, start - time.time()))
        futures = [
            client.submit("ext_fleet_test_sleep", {"seconds": float(seconds)},
                          context={"account": account}, timeout_s=20)
            for _ in range(int(count))
        ]
        print(json.dumps([f.result().model_dump(mode="json") for f in futures]))
    """
)


def _both_producers(fleet: Fleet, account: str, count: int, seconds: float) -> list[dict[str, Any]]:
    """Results of ``count`` calls from this process and ``count`` from another, at once.

    The other process says when its client is ready (imports and the catalog read take
    seconds on a loaded machine); only then is the common start time set, 0.3 s ahead.
    """
    other = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, fleet.redis_url, fleet.namespace, account,
         str(count), str(seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert other.stdin is not None and other.stdout is not None
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        client.tools()
        assert other.stdout.readline().strip() == "ready"
        start = time.time() + 0.3
        other.stdin.write(f"{start}\n")
        other.stdin.flush()
        time.sleep(max(0.0, start - time.time()))
        futures = [
            client.submit(SLEEP, {"seconds": seconds}, context={"account": account}, timeout_s=20)
            for _ in range(count)
        ]
        mine = [f.result().model_dump(mode="json") for f in futures]
    out, _ = other.communicate(timeout=60)
    assert other.returncode == 0
    return mine + json.loads(out)


def _refused_count() -> float:
    labels = {"function": SLEEP, "reason": "in_flight"}
    return metrics.REGISTRY.get_sample_value("toolfleet_client_refused_total", labels) or 0.0


def _set(fleet: Fleet, scope: str, quota: Quota) -> None:
    r = redis.Redis.from_url(fleet.redis_url)
    r.hset(limits_key(fleet.namespace), scope, quota.model_dump_json(exclude_none=True))
    r.close()


def _cli(fleet: Fleet, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [toolfleet_command(), "--redis-url", fleet.redis_url, "--namespace", fleet.namespace,
         "limits", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _never_ran(fleet: Fleet, results: list[dict[str, Any]]) -> bool:
    r = redis.Redis.from_url(fleet.redis_url)
    try:
        return not any(r.exists(outcome_key(fleet.namespace, res["id"])) for res in results)
    finally:
        r.close()


def test_in_flight_quota_holds_across_two_producers(fleet: Fleet, client: ToolClient) -> None:
    """3 in flight for the account: of 10 calls from two processes 3 run, 7 are refused at once."""
    assert _cli(fleet, "set", "tenant-q", "--in-flight", "3").returncode == 0
    # Given two producer processes each sending 5 calls of 0.8 s at the same moment
    started = time.monotonic()
    results = _both_producers(fleet, "tenant-q", 5, 0.8)
    ok = [res for res in results if res["status"] == Status.OK]
    refused = [res for res in results if res["status"] == Status.REJECTED]
    # Then exactly 3 ran and the other 7 were answered rejected, with retry_after_s
    assert len(ok) == 3 and len(refused) == 7, [(r["status"], r["content"]) for r in results]
    for res in refused:
        assert 0 < res["content"]["retry_after_s"] <= 1.0
        assert "in flight" in res["content"]["error"] and "retry after" in res["content"]["error"]
        assert res["queued_s"] == 0.0
    assert _never_ran(fleet, refused)  # nothing was published for them
    assert time.monotonic() - started < 15
    # and once those finished, the account can call again
    again = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-q"})
    assert again.status == Status.OK


def test_an_account_over_its_quota_does_not_affect_others(fleet: Fleet, client: ToolClient) -> None:
    """While one account is at its in-flight limit, another account's calls run."""
    _set(fleet, "tenant-busy", Quota(in_flight=1))
    held = client.submit(SLEEP, {"seconds": 0.8}, context={"account": "tenant-busy"})
    time.sleep(0.2)
    before = _refused_count()
    over = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-busy"})
    assert over.status == Status.REJECTED
    assert _refused_count() == before + 1  # counted by function and reason, not account
    other = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-calm"})
    assert other.status == Status.OK
    anonymous = client.call(SLEEP, {"seconds": 0.01})
    assert anonymous.status == Status.OK
    assert held.result().status == Status.OK
    try:
        over.raise_for_status()
    except RejectedError as exc:
        assert exc.result is not None and exc.result.content["retry_after_s"] > 0
    else:
        raise AssertionError("rejected raises RejectedError")


def test_per_second_quota_holds_across_two_producers(fleet: Fleet) -> None:
    """2 calls per second (burst 2): of 8 calls at once from two processes, 2 run."""
    _set(fleet, "tenant-r", Quota(per_s=2, burst=2))
    results = _both_producers(fleet, "tenant-r", 4, 0.01)
    ok = [res for res in results if res["status"] == Status.OK]
    refused = [res for res in results if res["status"] == Status.REJECTED]
    assert len(ok) == 2 and len(refused) == 6, results
    for res in refused:
        assert 0 < res["content"]["retry_after_s"] <= 1.0  # at 2/s the next one comes in 0.5 s
        assert "per second" in res["content"]["error"]
    assert _never_ran(fleet, refused)


def test_per_function_quota_limits_only_that_function(fleet: Fleet, client: ToolClient) -> None:
    """A quota on (account, function) refuses that function only."""
    _set(fleet, f"tenant-f/{SLEEP}", Quota(in_flight=1))
    held = client.submit(SLEEP, {"seconds": 0.8}, context={"account": "tenant-f"})
    time.sleep(0.2)
    assert client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-f"}).status == (
        Status.REJECTED
    )
    echo = client.call("ext_fleet_test_echo", {"text": "x"}, context={"account": "tenant-f"})
    assert echo.status == Status.OK
    assert held.result().status == Status.OK


def test_limits_cli_names_each_refused_option_and_why(fleet: Fleet) -> None:
    """An out-of-range option is a usage error naming the option and the bound it breaks."""
    out = _cli(fleet, "set", "tenant-bad", "--in-flight", "0", "--per-s", "-1")
    assert out.returncode == 2, out
    assert "--in-flight: Input should be greater than or equal to 1" in out.stderr, out.stderr
    assert "--per-s: Input should be greater than 0" in out.stderr, out.stderr


def test_limits_cli_offers_no_weight(fleet: Fleet) -> None:
    """Lanes are unweighted, so `limits set` has no --weight to record and ignore."""
    out = _cli(fleet, "set", "tenant-w", "--weight", "2")
    assert out.returncode == 2 and "No such option '--weight'" in out.stderr, out
    assert "tenant-w" not in _cli(fleet, "list").stdout


def test_limits_cli_sets_lists_and_deletes_quotas(fleet: Fleet, client: ToolClient) -> None:
    """`toolfleet limits set|list|delete` changes the quota the next call meets."""
    assert _cli(fleet, "set", "tenant-cli", "--per-s", "0.5", "--burst", "1").returncode == 0
    listed = _cli(fleet, "list")
    assert listed.returncode == 0 and "tenant-cli" in listed.stdout and "0.5" in listed.stdout
    first = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-cli"})
    second = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-cli"})
    assert (first.status, second.status) == (Status.OK, Status.REJECTED)
    assert 1.0 < second.content["retry_after_s"] <= 2.0  # one call per 2 s
    assert _cli(fleet, "delete", "tenant-cli").returncode == 0
    third = client.call(SLEEP, {"seconds": 0.01}, context={"account": "tenant-cli"})
    assert third.status == Status.OK
    missing = _cli(fleet, "delete", "tenant-cli")
    assert missing.returncode == 1 and "no quota is set" in missing.stderr
    assert _cli(fleet, "set", "tenant-cli").returncode == 2  # nothing to set: usage error
