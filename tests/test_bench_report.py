"""bench/report.py's Redis Cluster sizing table, from a hand-written compare.py JSON."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _report() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("toolfleet_bench_report", BENCH / "report.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


report = _report()


def _master(port: int, roles: list[str], cpu_us: float, cmds: float) -> dict[str, Any]:
    return {"port": port, "roles": roles, "cpu_us_redis": cpu_us, "redis_cmds_per_call": cmds}


def _cluster_run(round_no: int, group_us: float, fleet_us: float, rate: float) -> dict[str, Any]:
    """A round whose third master, holding neither slot, spends 0.3 µs per call."""
    return {
        "system": "toolfleet-cluster",
        "round": round_no,
        "throughput": {
            "calls_per_s": rate,
            "per_master": [
                _master(7001, ["group"], group_us, 9.0),
                _master(7002, ["fleet"], fleet_us, 0.05),
                _master(7003, [], 0.3, 0.0),
            ],
        },
    }


#: Three rounds: group master 48.3, 50.3, 55.3 µs per call, {fleet} master 2.3, 1.8, 3.3 µs,
#: each minus the idle master's 0.3 µs: group 48, 50, 55 (median 50), {fleet} 2, 1.5, 3
#: (median 2); the single Redis 61, 60 µs (median 60.5).
DATA: dict[str, Any] = {
    "meta": {"date": "2026-01-02 03:04 UTC", "git": "abc1234", "nproc": 2, "load_before": 0.2},
    "runs": [
        _cluster_run(1, 48.3, 2.3, 1000.0),
        _cluster_run(2, 50.3, 1.8, 1100.0),
        _cluster_run(3, 55.3, 3.3, 900.0),
        {"system": "toolfleet", "round": 1, "throughput": {"cpu_us_redis": 61.0}},
        {"system": "toolfleet", "round": 2, "throughput": {"cpu_us_redis": 60.0}},
    ],
}

# By hand, with group 50 µs and {fleet} 2 µs per call: one group's ceiling 1e6 / 50 =
# 20,000 calls/s; m masters carry 1e6 / (50 / m + 2):
#   1: 1e6 / 52        = 19,230.8  {fleet} share 19,230.8 * 2e-6 = 3.8 %
#   3: 1e6 / 18.667    = 53,571.4  10.7 %
#  10: 1e6 / 7         = 142,857.1 28.6 %
#  30: 1e6 / 3.6667    = 272,727.3 54.5 %  (over half its master: {fleet} limits)
EXPECTED_ROWS = [
    "| 1 | 19,231 | 20,000 | 4% | one Redis core per master |",
    "| 3 | 53,571 | 20,000 | 11% | one Redis core per master |",
    "| 10 | 142,857 | 20,000 | 29% | one Redis core per master |",
    "| 30 | 272,727 | 20,000 | 55% | the `{fleet}` slot's reads |",
]
# With 5 groups: at most 5 * 20,000 = 100,000 calls/s, which caps 10 and 30 masters;
# {fleet} share at 100,000 calls/s: 100,000 * 2e-6 = 20 %.
EXPECTED_FIVE_GROUPS = [
    "| 1 | 19,231 | 20,000 | 4% | one Redis core per master |",
    "| 3 | 53,571 | 20,000 | 11% | one Redis core per master |",
    "| 10 | 100,000 | 20,000 | 20% | 5 queue groups × one group's ceiling |",
    "| 30 | 100,000 | 20,000 | 20% | 5 queue groups × one group's ceiling |",
]


def _rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line][
        1:
    ]


def test_sizing_table_from_the_per_master_medians() -> None:
    """The table gives calls/s for 1, 3, 10 and 30 masters from the medians of the rounds."""
    markdown = report.render_sizing(DATA)
    assert _rows(markdown) == EXPECTED_ROWS
    assert "50.0 µs on the master holding the calls' group slot (9.0 commands" in markdown
    assert "2.0 µs on the master holding `{fleet}`" in markdown
    assert "net of the 0.3 µs per call of a master holding neither" in markdown
    assert "1,000 calls/s on the cluster" in markdown  # median of 1,000, 1,100 and 900
    assert "single Redis of the same run: 60 µs" in markdown  # median of 61 and 60 is 60.5
    assert "3 rounds" in markdown and "abc1234" in markdown


def test_queue_groups_cap_the_table() -> None:
    """With 5 queue groups the fleet takes at most 5 groups' ceilings."""
    assert _rows(report.render_sizing(DATA, groups=5)) == EXPECTED_FIVE_GROUPS


def test_a_run_whose_group_and_fleet_share_a_master_is_refused() -> None:
    """Costs of the group and {fleet} slots on one master cannot be told apart: an error."""
    data = copy.deepcopy(DATA)
    data["runs"][1]["throughput"]["per_master"][0]["roles"] = ["group", "fleet"]
    data["runs"][1]["throughput"]["per_master"][1]["roles"] = []
    with pytest.raises(ValueError, match="share a master"):
        report.render_sizing(data)
    with pytest.raises(ValueError, match="compare.py --cluster"):
        report.render_sizing({"meta": {}, "runs": DATA["runs"][3:]})


def test_write_puts_the_table_between_the_markers_only(tmp_path: Path) -> None:
    """`--sizing FILE --write DOC` replaces what the markers hold and nothing else."""
    source = tmp_path / "run.json"
    source.write_text(json.dumps(DATA))
    doc = tmp_path / "cluster.md"
    doc.write_text(
        "# Title\n\nbefore\n<!-- sizing:start -->\nNot yet measured.\n<!-- sizing:end -->\nafter\n"
    )
    assert report.main(["--sizing", str(source), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\nbefore\n<!-- sizing:start -->\nMeasured 2026-01-02")
    assert text.endswith("<!-- sizing:end -->\nafter\n")
    assert "Not yet measured" not in text
    assert _rows(text) == EXPECTED_ROWS
    assert report.main(["--sizing", str(source), "--write", str(doc)]) == 0
    assert doc.read_text() == text, "writing twice gives the same document"


def test_write_refuses_a_quick_run(tmp_path: Path) -> None:
    """A --quick run is a smoke test: its figures are never written into the docs."""
    source = tmp_path / "run.json"
    source.write_text(json.dumps({**DATA, "meta": {**DATA["meta"], "quick": True}}))
    doc = tmp_path / "cluster.md"
    doc.write_text("<!-- sizing:start -->\nNot yet measured.\n<!-- sizing:end -->\n")
    assert report.main(["--sizing", str(source), "--write", str(doc)]) == 1
    assert "Not yet measured" in doc.read_text()


def test_the_docs_hold_the_markers_and_say_when_not_measured() -> None:
    """docs/cluster.md has the sizing markers; until a run fills them it says so plainly."""
    text = (BENCH.parent / "docs" / "cluster.md").read_text()
    start, end = text.index(report.SIZING_START), text.index(report.SIZING_END)
    section = text[start:end]
    measured = "| 30 |" in section and "Measured " in section
    pending = "not yet measured" in section.lower() and "calls/s |" not in section
    assert measured or pending, section
