"""Replay recorded tool calls through the fleet and compare the results.

Two input kinds, told apart per line:

- BFCL exec question files (``{"id", "question", "function"}`` per line). The expected
  calls come from ``derived/BFCL_v3_exec_expected_results.jsonl`` beside the file (JSON
  arguments; ground truth is never ``eval``-ed). Offline calls go to ``ext_bfcl_<name>``
  and must match ``expected_result`` (floats at rel tol 1e-9) or come back with
  ``expected_status``; calls to network APIs, which the fleet does not serve, must come
  back ``unknown_function``.
- Sample files, one call per line: ``{"function", "arguments", "expect_status"?,
  "expect_content"?, "llmclient"?}``. ``arguments`` may be an object or a raw JSON
  string; ``llmclient`` names the model that made the call (its ``context.llmclient``).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolfleet.producer import ToolClient
from toolfleet.producer.client import CallFuture
from toolfleet.shared import codec
from toolfleet.shared.naming import function_name
from toolfleet.shared.wire import ToolCallResult
from toolfleet.worker.devtools.replay_match import bit_exact, matches

__all__ = ["Expected", "ReplayReport", "load_cases", "replay", "sample_file"]

DERIVED = Path("derived") / "BFCL_v3_exec_expected_results.jsonl"


def sample_file() -> Path:
    """The demo's sample calls, shipped inside the package."""
    return Path(__file__).with_name("samples") / "demo.jsonl"


@dataclass(frozen=True)
class Expected:
    """One call to make and what should come back.

    Attributes:
        source: ``file:entry`` label for reports.
        function: function name to call.
        arguments: object or raw JSON string.
        status: expected status.
        content: expected content when ``has_content`` (checked for ``ok`` results).
        llmclient: the model the call is made as (``context.llmclient``), if any.
    """

    source: str
    function: str
    arguments: dict[str, Any] | str | None
    status: str = "ok"
    content: Any = None
    has_content: bool = False
    llmclient: str | None = None


@dataclass
class ReplayReport:
    """Outcome of a replay.

    Attributes:
        entries: BFCL entries (or sample lines) read.
        calls: calls made.
        correct: calls whose status and content matched.
        bit_exact: correct ``ok`` calls whose content matched exactly.
        compared: correct ``ok`` calls with an expected content (those ``bit_exact``
            counts among).
        statuses: count of each returned status.
        mismatches: ``(case, result, why)`` for every mismatch.
        latencies_s: round-trip seconds of every call, submit to result (all calls are
            in flight at once, so these include waiting behind the others).
        answered_by_workers: calls a worker answered (the others the producer answered
            itself, e.g. ``unknown_function``).
    """

    entries: int = 0
    calls: int = 0
    correct: int = 0
    bit_exact: int = 0
    compared: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    mismatches: list[tuple[Expected, ToolCallResult, str]] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    answered_by_workers: int = 0

    @property
    def ok(self) -> bool:
        """True when every call matched."""
        return self.calls > 0 and not self.mismatches

    def percentile_ms(self, q: float) -> float:
        """Latency percentile ``q`` (0-100) in milliseconds."""
        if not self.latencies_s:
            return 0.0
        if len(self.latencies_s) == 1:
            return self.latencies_s[0] * 1000
        cuts = statistics.quantiles(self.latencies_s, n=100, method="inclusive")
        return cuts[min(98, max(0, int(q) - 1))] * 1000


def load_cases(paths: list[Path]) -> tuple[list[Expected], int]:
    """Read every file; return the calls to make and the number of entries.

    Raises:
        FileNotFoundError: a file, or a BFCL file's ``derived/`` data, is missing.
        ValueError: a line is neither a BFCL entry nor a sample call.
    """
    cases: list[Expected] = []
    entries = 0
    for path in paths:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        derived: dict[str, dict[str, Any]] | None = None
        for number, line in enumerate(lines, 1):
            row = codec.loads(line)
            entries += 1
            if isinstance(row, dict) and "question" in row and "id" in row:
                if derived is None:
                    derived = _load_derived(path)
                cases += _bfcl_cases(path, row["id"], derived)
            elif isinstance(row, dict) and isinstance(row.get("function"), str):
                cases.append(_sample_case(path, number, row))
            else:
                raise ValueError(f"{path}:{number}: neither a BFCL entry nor a sample call")
    return cases, entries


def _load_derived(question_file: Path) -> dict[str, dict[str, Any]]:
    path = question_file.parent / DERIVED
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (expected results for {question_file.name})")
    rows = (codec.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
    return {row["id"]: row for row in rows}


def _bfcl_cases(path: Path, entry_id: str, derived: dict[str, dict[str, Any]]) -> list[Expected]:
    row = derived.get(entry_id)
    if row is None:
        raise ValueError(f"{path}: entry {entry_id} has no row in {DERIVED}")
    cases = []
    for call in row["calls"]:
        source = f"{path.name}:{entry_id}#{call['index']}"
        name = function_name("bfcl", call["name"])
        if not call.get("offline"):
            cases.append(Expected(source, name, call["arguments"], status="unknown_function"))
        elif "expected_status" in call:
            cases.append(Expected(source, name, call["arguments"], status=call["expected_status"]))
        else:
            cases.append(
                Expected(
                    source,
                    name,
                    call["arguments"],
                    content=call["expected_result"],
                    has_content=True,
                )
            )
    return cases


def _sample_case(path: Path, number: int, row: dict[str, Any]) -> Expected:
    return Expected(
        source=f"{path.name}:{number}",
        function=row["function"],
        arguments=row.get("arguments"),
        status=row.get("expect_status", "ok"),
        content=row.get("expect_content"),
        has_content="expect_content" in row,
        llmclient=row.get("llmclient"),
    )


def replay(
    client: ToolClient,
    cases: list[Expected],
    entries: int,
    timeout_s: float = 30.0,
    on_result: Callable[[ToolCallResult], None] | None = None,
) -> ReplayReport:
    """Submit every case at once, wait for all, and compare.

    Args:
        client: the producer client to call through.
        cases: the calls and what each must return.
        entries: how many source entries the cases came from (for the report).
        timeout_s: each call's deadline, seconds from its submission.
        on_result: called with each result, in case order, before it is compared; an
            exception it raises stops the replay (e.g. Redis is gone).
    """
    report = ReplayReport(entries=entries, calls=len(cases))
    futures: list[CallFuture] = []
    for i, case in enumerate(cases):
        sent = time.monotonic()
        context = {"llmclient": case.llmclient} if case.llmclient else None
        future = client.submit(
            case.function, case.arguments, tool_call_id=f"call_{i}", context=context,
            timeout_s=timeout_s,
        )  # fmt: skip
        future.add_done_callback(_latency_recorder(report.latencies_s, sent))
        futures.append(future)
    for case, future in zip(cases, futures, strict=True):
        result = future.result()
        if on_result is not None:
            on_result(result)
        report.statuses[result.status.value] += 1
        report.answered_by_workers += result.worker is not None
        why = _mismatch(case, result)
        if why:
            report.mismatches.append((case, result, why))
            continue
        report.correct += 1
        if case.has_content and result.ok:
            report.compared += 1
            report.bit_exact += bit_exact(result.content, case.content)
    return report


def _latency_recorder(
    latencies_s: list[float], sent: float
) -> Callable[[Future[ToolCallResult]], None]:
    def record(_future: Future[ToolCallResult]) -> None:
        latencies_s.append(time.monotonic() - sent)

    return record


def _mismatch(case: Expected, result: ToolCallResult) -> str:
    if result.status.value != case.status:
        return f"status {result.status.value}, expected {case.status}: {result.content}"
    if case.has_content and not matches(result.content, case.content):
        return f"content {result.content!r}, expected {case.content!r}"
    return ""
