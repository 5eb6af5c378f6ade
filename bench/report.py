"""Turn the per-round results of ``compare.py`` into medians, target checks and markdown."""

from __future__ import annotations

from typing import Any

from _common import median

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
