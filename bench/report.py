"""Turn the per-round results of ``compare.py`` into medians, target checks and markdown.

    python bench/report.py --sizing bench/results/compare-<time>.json
    python bench/report.py --sizing FILE.json --write docs/cluster.md   # between its markers

``--sizing`` computes the Redis Cluster sizing table (calls/s for 1, 3, 10 and 30
masters) from the per-master figures of a ``compare.py --cluster`` run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import median  # noqa: E402

ORDER = ["toolfleet", "dramatiq", "celery", "arq", "raw"]
LABELS = {
    "toolfleet": "toolfleet",
    "dramatiq": "Dramatiq + Results",
    "celery": "Celery (redis)",
    "arq": "arq",
    "raw": "raw LPUSH/BRPOP floor",
}


def _get(run: dict[str, Any], path: str) -> Any:
    value: Any = run
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


METRICS = {
    "seq_p50": "sequential.p50_ms",
    "seq_p95": "sequential.p95_ms",
    "seq_p99": "sequential.p99_ms",
    "calls_per_s": "throughput.calls_per_s",
    "cpu_producer": "throughput.cpu_us_producer",
    "cpu_workers": "throughput.cpu_us_workers",
    "cpu_redis": "throughput.cpu_us_redis",
    "cmds": "throughput.redis_cmds_per_call",
    "cmds_scripts": "throughput.redis_cmds_incl_scripts_per_call",
    "seq_cmds": "sequential.redis_cmds_per_call",
    "rss": "worker_rss_mib",
    "pss": "worker_pss_mib",
    "idle": "idle.ops_per_s_per_process",
    "idle_top": "idle.top_level_per_s_per_process",
    "census_top": "census.top_level_per_call",
    "turn_p50": "turn.p50_ms",
    "turn_p99": "turn.p99_ms",
    "turn_submit_p50": "turn_submit.p50_ms",
    "turn_submit_p99": "turn_submit.p99_ms",
    "tenk_bytes": "ten_thousand.client_bytes_per_call",
    "tenk_rss_bytes": "ten_thousand.client_rss_bytes_per_call",
    "tenk_conns": "ten_thousand.reply_connections",
    "tenk_client_conns": "ten_thousand.client_connections",
    "tenk_in_flight": "ten_thousand.in_flight_peak",
    "tenk_submit_s": "ten_thousand.submit_s",
    "tenk_drain_rate": "ten_thousand.drain_calls_per_s",
}


def medians(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """System key -> metric -> median over the rounds."""
    out: dict[str, dict[str, float]] = {}
    keys = [k for k in ORDER if any(r["system"] == k for r in data["runs"])]
    keys += sorted({r["system"] for r in data["runs"]} - set(keys))
    for key in keys:
        runs = [r for r in data["runs"] if r["system"] == key]
        if runs:
            out[key] = {m: median(_get(r, p) for r in runs) for m, p in METRICS.items()}
            out[key]["rounds"] = len(runs)
            LABELS.setdefault(key, str(runs[0].get("label", key)))
            out[key]["wrong"] = sum(
                (_get(r, "sequential.wrong") or 0)
                + (_get(r, "throughput.wrong") or 0)
                + (_get(r, "turn.wrong") or 0)
                for r in runs
            )
    return out


def targets(med: dict[str, dict[str, float]]) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured ratio, limit, met) for each hot-path target that can be computed."""
    rows: list[tuple[str, str, str, bool | None]] = []
    tf = med.get("toolfleet")
    if not tf:
        return rows

    def ratio(name: str, a: float, b: float | None, limit: float, at_most: bool) -> None:
        if b is None or b != b or not b:
            return
        value = a / b
        met = value <= limit if at_most else value >= limit
        rows.append((name, f"{value:.2f}×", f"{'≤' if at_most else '≥'} {limit:g}×", met))

    def total_cpu(m: dict[str, float]) -> float:
        return m["cpu_producer"] + m["cpu_workers"] + m["cpu_redis"]

    raw, dq, cel = med.get("raw"), med.get("dramatiq"), med.get("celery")
    if dq:
        ratio("throughput vs Dramatiq + Results", tf["calls_per_s"], dq["calls_per_s"], 1.3, False)
    if cel:
        ratio("throughput vs Celery", tf["calls_per_s"], cel["calls_per_s"], 4, False)
    if dq:
        ratio("CPU per call, total, vs Dramatiq + Results", total_cpu(tf), total_cpu(dq), 0.8, True)
        ratio("CPU per call, workers, vs Dramatiq + Results", tf["cpu_workers"],
              dq["cpu_workers"], 1.0, True)  # fmt: skip
        ratio("Redis commands per call vs Dramatiq + Results", tf["cmds"], dq["cmds"], 1.0, True)
    if raw:
        ratio("sequential p50 vs raw floor", tf["seq_p50"], raw["seq_p50"], 2.5, True)
        ratio("sequential p99 vs raw floor", tf["seq_p99"], raw["seq_p99"], 4, True)
        ratio("turn of 8 parallel calls (p50) vs raw", tf["turn_p50"], raw["turn_p50"], 3, True)
    if tf["tenk_bytes"] == tf["tenk_bytes"]:
        rows.append(
            (
                f"{tf['tenk_in_flight']:,.0f} in flight, one client: memory per call",
                f"{tf['tenk_bytes']:,.0f} B",
                "< 2,048 B",
                tf["tenk_bytes"] < 2048,
            )
        )
        rows.append(
            (
                "… on one reply connection",
                f"{tf['tenk_conns']:.0f}",
                "= 1",
                tf["tenk_conns"] == 1,
            )
        )
    if dq:
        rows.append(
            (
                "idle Redis ops/s per worker process vs Dramatiq's",
                f"{tf['idle']:.1f} vs {dq['idle']:.1f}",
                "≤ Dramatiq",
                tf["idle"] <= dq["idle"],
            )
        )
    return rows


def _f(value: float, fmt: str) -> str:
    return "–" if value != value else format(value, fmt)


def render_markdown(data: dict[str, Any]) -> str:
    """The table of medians, the second table, the target checks and the machine line."""
    meta = data["meta"]
    med = medians(data)
    lines = [
        f"Medians of {meta['rounds']} interleaved rounds, {meta['date']}; "
        f"{meta['nproc']} cores ({meta['cpu']}), Python {meta['python']}, "
        f"Redis {meta['redis_server']} on 127.0.0.1 (TCP), {meta['processes']} worker processes "
        f"per system, a no-op tool `noop(n) -> n`; toolfleet at {meta.get('git', '?')}; "
        f"load average {meta.get('load_before', '?')} before, {meta.get('load_after', '?')} after.",
        "",
        "| system | seq p50 ms | seq p95 ms | seq p99 ms "
        f"| calls/s ({meta['in_flight']:,} in flight) "
        "| CPU µs/call producer | workers | Redis | Redis cmds/call "
        "| worker RSS MiB (PSS) | idle Redis ops/s per worker process |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, m in med.items():
        lines.append(
            f"| {LABELS[key]} | {_f(m['seq_p50'], '.2f')} | {_f(m['seq_p95'], '.2f')} "
            f"| {_f(m['seq_p99'], '.2f')} | {_f(m['calls_per_s'], ',.0f')} "
            f"| {_f(m['cpu_producer'], '.0f')} | {_f(m['cpu_workers'], '.0f')} "
            f"| {_f(m['cpu_redis'], '.0f')} "
            f"| {_f(m['cmds'], '.1f')} ({_f(m['census_top'], '.1f')}) "
            f"| {_f(m['rss'], '.0f')} ({_f(m['pss'], '.0f')}) "
            f"| {_f(m['idle'], '.1f')} ({_f(m['idle_top'], '.1f')}) |"
        )
    lines += [
        "",
        "| system (toolfleet: one `ToolClient.dispatch` of the turn's `tool_calls`) "
        "| turn of 8 parallel calls p50 ms | p99 ms |",
        "| --- | ---: | ---: |",
    ]
    for key, m in med.items():
        lines.append(f"| {LABELS[key]} | {_f(m['turn_p50'], '.2f')} | {_f(m['turn_p99'], '.2f')} |")
        if m["turn_submit_p50"] == m["turn_submit_p50"]:
            lines.append(
                f"| {LABELS[key]}, 8 × `submit` | {_f(m['turn_submit_p50'], '.2f')} "
                f"| {_f(m['turn_submit_p99'], '.2f')} |"
            )
    tf = med.get("toolfleet")
    if tf and tf["tenk_bytes"] == tf["tenk_bytes"]:
        lines += [
            "",
            f"toolfleet, {tf['tenk_in_flight']:,.0f} calls in flight from one `ToolClient` "
            f"(workers paused while submitting): {tf['tenk_bytes']:,.0f} B of client memory "
            f"per call (tracemalloc; RSS grew {tf['tenk_rss_bytes']:,.0f} B per call), "
            f"{tf['tenk_conns']:.0f} reply connection ({tf['tenk_client_conns']:.0f} "
            f"connections in all), submitted in {tf['tenk_submit_s']:.1f} s, "
            f"drained at {tf['tenk_drain_rate']:,.0f} calls/s.",
        ]
    rows = targets(med)
    if rows:
        lines += [
            "",
            "| target | measured | limit | met |",
            "| --- | ---: | ---: | :-: |",
        ]
        for name, value, limit, met in rows:
            lines.append(f"| {name} | {value} | {limit} | {'yes' if met else '**no**'} |")
    wrong = {k: m["wrong"] for k, m in med.items() if m["wrong"]}
    notes = [
        "",
        "Columns: round trip of one call at a time; throughput = calls / seconds from the "
        "first submit to the last result; CPU from /proc (psutil) of the producer process, "
        "the whole worker process tree (supervisor/main process included) and redis-server "
        "during the throughput phase; Redis commands per call in that phase (INFO "
        "commandstats; commands run inside Lua scripts count too; in parentheses the "
        "top-level commands, the ones clients send, counted with MONITOR in a separate "
        "burst); RSS summed over the worker process tree after the run (PSS counts shared "
        "pages once); idle = Redis "
        "commands/s with workers up and no producer, divided by the worker processes "
        "(commandstats, script-internal included, as Dramatiq's ~7/s is counted; in "
        "parentheses top-level only, by MONITOR). "
        "toolfleet: `toolfleet worker -p N -Q tools.bench` (8 threads per process), "
        "`ToolClient`, validation on. Dramatiq: stock `RedisBroker` + `Results(RedisBackend)`, "
        "`dramatiq -p N -t 8`. Celery: `-P prefork -c N`, redis broker and result backend, "
        "`AsyncResult.get()`. arq: N `arq` processes, queue and result polling at 10 ms "
        "(defaults 0.5 s). Raw: N processes `BRPOP` → `LPUSH` reply; one producer thread "
        "`BRPOP`s replies.",
        f"Versions: {', '.join(f'{k} {v}' for k, v in meta['packages'].items())}.",
    ]
    if wrong:
        notes.append(f"Wrong or failed results: {wrong}.")
    return "\n".join(lines + notes) + "\n"


# -- sizing a Redis Cluster from the per-master figures of `compare.py --cluster` ------

#: The ``system`` key of toolfleet's runs on the loopback cluster in a compare JSON.
CLUSTER_SYSTEM = "toolfleet-cluster"
#: Cluster sizes the sizing table gives.
SIZING_MASTERS = (1, 3, 10, 30)
#: The markers of docs/cluster.md between which ``--write`` puts the table.
SIZING_START = "<!-- sizing:start -->"
SIZING_END = "<!-- sizing:end -->"
#: The reads that go to the ``{fleet}`` slot, from producer/catalog.py and the workers'
#: heartbeats (docs/cluster.md).
FLEET_READS = (
    "Reads of the `{fleet}` slot: none per call in the steady state. Each client reads the "
    "catalog there at most once per `catalog_cache_s` (1 s): `HGETALL` of the catalog, "
    "`ZRANGE` of `catalog:live`, `HGETALL` of the switches, `SMEMBERS` of "
    "`catalog:recovering` and one `ZCOUNT` of `workers:<queue>` per queue (4 + queues "
    "commands; the `HLEN` of each queue goes to its group's slot). It reads again sooner "
    "only for a function the snapshot lacks or shows not live (at most every 0.1 s) and "
    "for every call to a switched-off function; each worker process writes its heartbeats "
    "there once per `heartbeat_interval_s` (2 s). So the `{fleet}` load grows with clients "
    "and worker processes, not with calls: its figure per call, measured at the "
    "benchmark's rate, overstates it at higher rates."
)


@dataclass(frozen=True)
class ShardFigures:
    """Medians over the rounds of toolfleet's per-master figures on a cluster.

    The CPU figures are net of what a master spends holding neither slot (cluster bus,
    timers: the CPU per call of a master with no role in the run, 0 when every master
    has one), since that does not grow with calls.

    Attributes:
        group_cpu_us: Redis CPU µs per call of the master holding the calls' group slot.
        fleet_cpu_us: Redis CPU µs per call of the master holding the ``{fleet}`` slot
            (and no group of the run).
        idle_cpu_us: Redis CPU µs per call of a master holding neither (subtracted above).
        group_cmds: Redis commands per call on the group's master (INFO commandstats,
            commands inside scripts counted once per script call).
        fleet_cmds: the same on the ``{fleet}`` master.
        calls_per_s: calls/s of the throughput phase on the cluster.
        single_cpu_us: Redis CPU µs per call of toolfleet on the single Redis of the same
            run (NaN when the run has none).
        rounds: cluster runs the medians are over.
    """

    group_cpu_us: float
    fleet_cpu_us: float
    idle_cpu_us: float
    group_cmds: float
    fleet_cmds: float
    calls_per_s: float
    single_cpu_us: float
    rounds: int


@dataclass(frozen=True)
class SizingRow:
    """One row of the sizing table.

    Attributes:
        masters: masters in the cluster, one Redis core each.
        calls_per_s: calls/s the cluster carries (the busiest master's core full).
        group_ceiling: calls/s one queue group can take (its slot lives on one master).
        fleet_share: fraction of the ``{fleet}`` master's core its reads take at that rate.
        limited_by: what sets ``calls_per_s``.
    """

    masters: int
    calls_per_s: float
    group_ceiling: float
    fleet_share: float
    limited_by: str


def _idle_figure(run: dict[str, Any]) -> float:
    """Median Redis CPU µs per call of the masters with no role in ``run`` (0 if none)."""
    masters = _get(run, "throughput.per_master") or []
    idle = median(float(m["cpu_us_redis"]) for m in masters if not m.get("roles"))
    return idle if idle == idle else 0.0


def _role_figure(run: dict[str, Any], role: str, field: str) -> float | None:
    masters = _get(run, "throughput.per_master") or []
    found = [m for m in masters if role in m.get("roles", ())]
    if len(found) != 1:
        raise ValueError(f"round {run.get('round')}: {len(found)} masters hold the {role} slot")
    if set(found[0]["roles"]) >= {"group", "fleet"}:
        raise ValueError(
            f"round {run.get('round')}: the group and {{fleet}} slots share a master; "
            "their costs cannot be told apart"
        )
    value = found[0].get(field)
    return None if value is None else float(value)


def shard_figures(data: dict[str, Any]) -> ShardFigures:
    """The per-shard figures of a ``compare.py --cluster`` JSON (medians over its rounds).

    Raises:
        ValueError: the JSON holds no cluster run, or a run lacks per-master figures for
            exactly one group master and one ``{fleet}`` master apart from it.
    """
    runs = [r for r in data.get("runs", []) if r.get("system") == CLUSTER_SYSTEM]
    if not runs:
        raise ValueError(f"no {CLUSTER_SYSTEM!r} runs: measure with compare.py --cluster")
    single = [r for r in data["runs"] if r.get("system") == "toolfleet"]

    def net(run: dict[str, Any], role: str) -> float:
        return max(0.0, (_role_figure(run, role, "cpu_us_redis") or 0.0) - _idle_figure(run))

    return ShardFigures(
        group_cpu_us=median(net(r, "group") for r in runs),
        fleet_cpu_us=median(net(r, "fleet") for r in runs),
        idle_cpu_us=median(_idle_figure(r) for r in runs),
        group_cmds=median(_role_figure(r, "group", "redis_cmds_per_call") for r in runs),
        fleet_cmds=median(_role_figure(r, "fleet", "redis_cmds_per_call") for r in runs),
        calls_per_s=median(_get(r, "throughput.calls_per_s") for r in runs),
        single_cpu_us=median(_get(r, "throughput.cpu_us_redis") for r in single),
        rounds=len(runs),
    )


def sizing_rows(
    figures: ShardFigures, masters: Sequence[int] = SIZING_MASTERS, groups: int | None = None
) -> list[SizingRow]:
    """Calls/s a cluster of each size carries, from the per-shard figures.

    Model: the calls spread evenly over the groups, the groups evenly over ``m`` masters,
    one Redis core per master. The master holding ``{fleet}`` also holds its share of the
    groups, so it fills first: ``T · (group_cpu_us / m + fleet_cpu_us) = 1 s`` gives
    ``T = 1e6 / (group_cpu_us / m + fleet_cpu_us)`` calls/s. One group's slot lives on one
    master, so a group takes at most ``1e6 / group_cpu_us`` calls/s, and ``groups`` groups
    at most that many times it.

    Args:
        figures: from :func:`shard_figures`.
        masters: cluster sizes, one row each.
        groups: queue groups carrying the traffic evenly; ``None``: at least as many as
            masters.

    Raises:
        ValueError: a per-call CPU figure is not a positive number, or ``groups`` < 1.
    """
    if not figures.group_cpu_us > 0 or not figures.fleet_cpu_us >= 0:
        raise ValueError(f"unusable per-call CPU figures: {figures}")
    if groups is not None and groups < 1:
        raise ValueError("groups must be >= 1")
    ceiling = 1e6 / figures.group_cpu_us
    rows = []
    for m in masters:
        rate = 1e6 / (figures.group_cpu_us / m + figures.fleet_cpu_us)
        limited = "one Redis core per master"
        if groups is not None and groups * ceiling < rate:
            rate, limited = groups * ceiling, f"{groups} queue groups × one group's ceiling"
        share = rate * figures.fleet_cpu_us / 1e6
        if limited.startswith("one Redis") and share >= 0.5:
            limited = "the `{fleet}` slot's reads"
        rows.append(SizingRow(m, rate, ceiling, share, limited))
    return rows


def render_sizing(data: dict[str, Any], groups: int | None = None) -> str:
    """The sizing section's markdown (what goes between the markers of docs/cluster.md).

    Raises:
        ValueError: as :func:`shard_figures` and :func:`sizing_rows`.
    """
    meta = data.get("meta", {})
    fig = shard_figures(data)
    single = (
        f"; toolfleet on the single Redis of the same run: {fig.single_cpu_us:.0f} µs"
        if fig.single_cpu_us == fig.single_cpu_us
        else ""
    )
    lines = [
        f"Measured {meta.get('date', '?')} at {meta.get('git', '?')}, medians of "
        f"{fig.rounds} rounds of `bench/compare.py --cluster` ({meta.get('nproc', '?')} cores, "
        f"load average {meta.get('load_before', '?')} before), a 3-master loopback cluster: "
        f"Redis CPU per call {fig.group_cpu_us:.1f} µs on the master holding the calls' "
        f"group slot ({fig.group_cmds:.1f} commands per call) and {fig.fleet_cpu_us:.1f} µs "
        f"on the master holding `{{fleet}}` ({fig.fleet_cmds:.2f} commands per call), net of "
        f"the {fig.idle_cpu_us:.1f} µs per call of a master holding neither{single}; "
        f"{fig.calls_per_s:,.0f} calls/s on the cluster.",
        "",
        "| masters | calls/s | one queue group at most | `{fleet}` share of its master's "
        "core | limited by |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for row in sizing_rows(fig, groups=groups):
        lines.append(
            f"| {row.masters} | {row.calls_per_s:,.0f} | {row.group_ceiling:,.0f} "
            f"| {row.fleet_share:.0%} | {row.limited_by} |"
        )
    spread = (
        f"{groups} queue groups carrying the calls evenly"
        if groups is not None
        else "at least as many queue groups as masters, carrying the calls evenly"
    )
    lines += [
        "",
        f"Assumes one Redis core per master and {spread}: calls/s = 1e6 / (group µs per "
        "call / masters + `{fleet}` µs per call), the master holding `{fleet}` filling "
        "first. A queue group's keys share one slot, so one group never exceeds one "
        "master's rate (the third column), however many masters there are.",
        "",
        FLEET_READS,
    ]
    return "\n".join(lines) + "\n"


def write_sizing(doc: Path, section: str) -> None:
    """Put ``section`` between the sizing markers of ``doc`` (the rest left as it is).

    Raises:
        ValueError: ``doc`` lacks the markers, or holds them out of order.
    """
    text = doc.read_text()
    start, end = text.find(SIZING_START), text.find(SIZING_END)
    if start < 0 or end < start:
        raise ValueError(f"{doc}: no {SIZING_START} ... {SIZING_END} markers")
    head = text[: start + len(SIZING_START)]
    doc.write_text(f"{head}\n{section}{text[end:]}")


def main(argv: Sequence[str] | None = None) -> int:
    """``report.py --sizing FILE.json [--groups N] [--write docs/cluster.md]``."""
    parser = argparse.ArgumentParser(description="The sizing table of a compare.py --cluster run.")
    parser.add_argument("--sizing", type=Path, required=True, metavar="FILE.json")
    parser.add_argument("--groups", type=int, help="queue groups carrying the calls")
    parser.add_argument("--write", type=Path, metavar="DOC.md", help="write between markers")
    args = parser.parse_args(argv)
    data = json.loads(args.sizing.read_text())
    section = render_sizing(data, groups=args.groups)
    print(section, end="")
    if args.write:
        if data.get("meta", {}).get("quick"):
            print("refused: a --quick run is a smoke test, not a measurement", file=sys.stderr)
            return 1
        write_sizing(args.write, section)
        print(f"wrote {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
