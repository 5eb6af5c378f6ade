"""Results shaped to a byte budget: JSON-aware cuts with markers, and on a real fleet."""

from __future__ import annotations

import os
import socket
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import codec
from toolfleet.shared.errors import ClientError
from toolfleet.shared.manifest import Manifest
from toolfleet.shared.shaping import MARKER_KEY, shape

NUMBERS = "ext_shaping_numbers"
STRICT = "ext_shaping_strict_numbers"
BUDGET = "ext_shaping_budget"


def test_a_long_list_keeps_its_first_items_and_says_how_many_were_cut() -> None:
    """10,000 numbers in 2,000 bytes: a list of the first numbers, then the count of the rest."""
    value, shaped = shape(list(range(10_000)), 2000)
    encoded = codec.dumps(value)
    assert shaped and len(encoded) <= 2000
    kept = value[:-1]
    assert kept == list(range(len(kept)))
    assert value[-1] == f"… {10_000 - len(kept):,} more items"


def test_an_object_keeps_its_small_keys_and_cuts_its_large_values() -> None:
    """A page object keeps its cursor and total; its rows and long text are cut with markers."""
    page = {
        "rows": [{"id": i, "name": "x" * 40} for i in range(500)],
        "total": 500,
        "next_cursor": "c-2",
        "note": "y" * 3000,
    }
    value, shaped = shape(page, 700)
    assert shaped and len(codec.dumps(value)) <= 700
    assert list(value) == ["rows", "total", "next_cursor", "note"]  # the shape is kept
    assert value["total"] == 500 and value["next_cursor"] == "c-2"
    rows = value["rows"]
    assert rows[-1] == f"… {500 - (len(rows) - 1):,} more items"
    assert value["note"].endswith(f"… ({3000 - value['note'].index('…'):,} more characters)")


def test_a_long_string_is_cut_with_the_count_of_what_was_cut() -> None:
    """A string keeps its start and says how many characters were cut."""
    value, shaped = shape("é" * 5000, 100)
    assert shaped and len(codec.dumps(value)) <= 100
    kept = value.index("…")
    assert value == "é" * kept + f"… ({5000 - kept:,} more characters)"


def test_objects_too_many_keys_keep_the_first_ones_and_a_marker_key() -> None:
    """An object of many small keys keeps the first ones and counts the rest under ``…``."""
    value, shaped = shape({f"k{i}": i for i in range(1000)}, 200)
    assert shaped and len(codec.dumps(value)) <= 200
    kept = [k for k in value if k != MARKER_KEY]
    assert kept == [f"k{i}" for i in range(len(kept))]
    assert value[MARKER_KEY] == f"… {1000 - len(kept):,} more keys"


def test_what_fits_is_not_shaped_and_nothing_fitting_is_refused() -> None:
    """A value within budget is returned as is; a budget too small for any part raises."""
    assert shape({"a": [1, 2]}, 100) == ({"a": [1, 2]}, False)
    with pytest.raises(ValueError, match="fits"):
        shape(10**200, 64)


def test_shaped_values_stay_within_any_budget() -> None:
    """Nested values of every kind encode within budgets from 64 bytes to 3 KB."""
    value = {"a": [[{"x": "w" * 90}] * 5] * 20, "b": {str(i): "é" * 70 for i in range(40)},
             "c": "q" * 4000, "d": list(range(300))}  # fmt: skip
    for budget in range(64, 3000, 37):
        cut, shaped = shape(value, budget)
        assert shaped and len(codec.dumps(cut)) <= budget, budget


def test_the_manifest_names_a_tools_shaping_policy() -> None:
    """``[tools.NAME] result_shaping`` is read from a manifest; other values are refused."""
    text = 'slug = "s"\nversion = "1"\nentry = "m:t"\n[tools.rows]\nresult_shaping = "truncate"\n'
    manifest = Manifest.model_validate(tomllib.loads(text))
    assert manifest.tools["rows"].result_shaping == "truncate"
    with pytest.raises(ValueError, match="result_shaping"):
        Manifest.model_validate(tomllib.loads(text.replace("truncate", "squeeze")))


@pytest.fixture(scope="module")
def shaping_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process serving the shaping tools, its metrics on a port of its own."""
    ns = f"{namespace}-s-{uuid.uuid4().hex[:6]}"
    tmp = tmp_path_factory.mktemp("s")
    env = {"TOOLFLEET_METRICS_PORT": str(_free_port()), "TMPDIR": str(tmp)}
    saved = os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    try:
        fleet = start_fleet(redis_url, ns, tmp / "worker.log", processes=1, env=env,
                            extra=["--extension", "shaping_tools:extension"])  # fmt: skip
    finally:
        if saved is not None:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    fleet.metrics_port = int(env["TOOLFLEET_METRICS_PORT"])  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shaped_total(fleet: Fleet) -> float:
    port = fleet.metrics_port  # type: ignore[attr-defined]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "toolfleet_results_shaped_total" and s.labels.get("function") == NUMBERS
    )


def _client(fleet: Fleet) -> ToolClient:
    return ToolClient(fleet.redis_url, namespace=fleet.namespace)


def test_truncate_answers_ok_within_budget_with_a_marker_and_the_shaped_flag(
    shaping_fleet: Fleet,
) -> None:
    """10,000 numbers under ``truncate`` with max_result_bytes=2000: ok, at most 2,000 bytes of
    JSON ending in a marker of how many were cut, and ``shaped`` set; on the wire too."""
    before = _shaped_total(shaping_fleet)
    with _client(shaping_fleet) as client:
        result = client.call(NUMBERS, {}, max_result_bytes=2000, timeout_s=20)
    assert result.status.value == "ok", result
    assert _shaped_total(shaping_fleet) == before + 1
    assert len(codec.dumps(result.content)) <= 2000
    kept = result.content[:-1]
    assert kept == list(range(len(kept))) and len(kept) > 100
    assert result.content[-1] == f"… {10_000 - len(kept):,} more items"
    assert result.shaped is True


def test_error_policy_answers_as_before(shaping_fleet: Fleet) -> None:
    """Under ``error`` a result over the call's budget is a tool_error asking for less."""
    with _client(shaping_fleet) as client:
        result = client.call(STRICT, {}, max_result_bytes=2000, timeout_s=20)
        small = client.call(STRICT, {"count": 3}, max_result_bytes=2000, timeout_s=20)
    assert result.status.value == "tool_error"
    assert result.error is not None and "over the limit of 2000 bytes; ask for less" in result.error
    assert result.shaped is None
    assert small.status.value == "ok" and small.content == [0, 1, 2] and small.shaped is None


def test_without_a_budget_nothing_is_shaped(shaping_fleet: Fleet) -> None:
    """A call with no budget gets the whole result (the worker's limit is far above it)."""
    with _client(shaping_fleet) as client:
        result = client.call(NUMBERS, {}, timeout_s=20)
    assert result.status.value == "ok" and result.content == list(range(10_000))
    assert result.shaped is None


def test_the_budget_is_in_the_tools_context_and_a_turn_shares_one(shaping_fleet: Fleet) -> None:
    """The tool reads its budget in its context; a turn's budget is split between its calls."""

    def call(i: int, name: str) -> dict[str, Any]:
        return {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": "{}"}}  # fmt: skip

    with _client(shaping_fleet) as client:
        alone = client.call(BUDGET, {}, max_result_bytes=5000, timeout_s=20)
        default = client.call(BUDGET, {}, timeout_s=20)
        turn = client.dispatch([call(0, BUDGET), call(1, NUMBERS)], max_result_bytes=4000,
                               timeout_s=20)  # fmt: skip
        with pytest.raises(ClientError, match="max_result_bytes"):
            client.call(BUDGET, {}, max_result_bytes=10, timeout_s=20)
    assert alone.content == {"max_result_bytes": 5000}
    assert default.content == {"max_result_bytes": 1_048_576}  # the worker's limit
    assert codec.loads(turn[0]["content"]) == {"max_result_bytes": 2000}
    numbers = codec.loads(turn[1]["content"])
    assert len(turn[1]["content"].encode()) <= 2000 and numbers[-1].endswith("more items")
