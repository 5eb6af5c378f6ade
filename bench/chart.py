"""A PNG chart (and the markdown table) of a ``compare.py`` result.

python bench/chart.py                          # the newest bench/results/compare-*.json
python bench/chart.py bench/results/compare-20261129T150000Z.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import LABELS, medians, render_markdown  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
COLORS = {
    "toolfleet": "#1f77b4",
    "dramatiq": "#ff7f0e",
    "celery": "#2ca02c",
    "arq": "#9467bd",
    "raw": "#7f7f7f",
}


def write_chart(data: dict[str, Any], path: Path) -> Path:
    """Draw four panels (latency, throughput, CPU per call, idle cost) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = medians(data)
    keys = list(med)
    labels = [LABELS[k].replace(" + ", "\n+ ").replace(" LPUSH", "\nLPUSH") for k in keys]
    colors = [COLORS.get(k, "#17becf") for k in keys]
    x = range(len(keys))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))

    ax = axes[0][0]
    width = 0.27
    for i, (metric, name) in enumerate(
        [("seq_p50", "p50"), ("seq_p95", "p95"), ("seq_p99", "p99")]
    ):
        ax.bar(
            [j + (i - 1) * width for j in x],
            [med[k][metric] for k in keys],
            width,
            label=name,
            color=colors,
            alpha=1.0 - 0.3 * i,
            edgecolor="black",
            linewidth=0.4,
        )
    ax.set_title("sequential round trip, ms (lower is better)")
    ax.set_yscale("log")
    ax.legend(["p50", "p95", "p99"], fontsize=8)

    ax = axes[0][1]
    bars = ax.bar(x, [med[k]["calls_per_s"] for k in keys], color=colors)
    ax.bar_label(bars, fmt="{:,.0f}", fontsize=8)
    ax.set_title(f"calls/s with {data['meta']['in_flight']:,} in flight (higher is better)")

    ax = axes[1][0]
    bottom = [0.0] * len(keys)
    for metric, name, hatch in [
        ("cpu_producer", "producer", ""),
        ("cpu_workers", "workers", "//"),
        ("cpu_redis", "Redis", ".."),
    ]:
        values = [med[k][metric] for k in keys]
        ax.bar(x, values, bottom=bottom, color=colors, hatch=hatch, edgecolor="white", label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("CPU µs per call: producer / workers (//) / Redis (..)")

    ax = axes[1][1]
    bars = ax.bar(x, [med[k]["idle"] for k in keys], color=colors)
    ax.bar_label(bars, fmt="{:.1f}", fontsize=8)
    ax.set_title("idle Redis ops/s per worker process (lower is better)")

    for row in axes:
        for ax in row:
            ax.set_xticks(list(x), labels, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
    meta = data["meta"]
    fig.suptitle(
        f"toolfleet vs peers — medians of {meta['rounds']} rounds, {meta['processes']} worker "
        f"processes, {meta['date']}\n{meta['nproc']} cores ({meta['cpu']}), "
        f"Python {meta['python']}, Redis {meta['redis_server']}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Chart and table of a compare.py result.")
    parser.add_argument("source", nargs="?", type=Path, help="a compare-*.json (default: newest)")
    parser.add_argument("--only", help="comma-separated systems to keep (e.g. leave out variants)")
    parser.add_argument("--name", default="", help="output stem (default compare[-quick])")
    args = parser.parse_args(argv)
    source = args.source
    if source is None:
        found = sorted(p for p in RESULTS_DIR.glob("compare-*.json") if "quick" not in p.name)
        if not found:
            print("no bench/results/compare-*.json: run bench/compare.py first", file=sys.stderr)
            return 1
        source = found[-1]
    data = orjson.loads(source.read_bytes())
    if args.only:
        keep = {k.strip() for k in args.only.split(",")}
        data["runs"] = [r for r in data["runs"] if r["system"] in keep]
    stem = args.name or ("compare-quick" if data["meta"].get("quick") else "compare")
    png = write_chart(data, RESULTS_DIR / f"{stem}.png")
    md = RESULTS_DIR / f"{stem}.md"
    md.write_text(render_markdown(data))
    print(f"wrote {png} and {md} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
