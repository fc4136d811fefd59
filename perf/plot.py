"""Plot one perf_analyzer sweep: throughput (x) against p50 and p99 latency (y).

    python perf/plot.py perf/results/<stem>.csv [--baseline <stem>.json] [--out <stem>.png]

The served curve is read from perf_analyzer's CSV (`-f`; one row per concurrency or
request-rate level, latencies in us). Beside it go the raw diffusers baseline's serial point
(1 / p50 latency, p50 latency) and its best batched call (generations/s, ms per call), read
from the JSON perf/sweep.py writes next to the CSV (key `baseline`), so one picture shows how
far serving is from diffusers alone on the same machine. Defaults: the JSON and the PNG
share the CSV's stem. Uses matplotlib's Agg backend (no display needed).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

LEVEL_COLUMNS = {"Concurrency": "c", "Request Rate": "r"}


def read_rows(csv_path: Path) -> tuple[str, list[dict]]:
    """(level column, rows) of a perf_analyzer CSV."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{csv_path}: no measured levels")
    level = next((c for c in LEVEL_COLUMNS if c in rows[0]), None)
    if level is None:
        raise ValueError(f"{csv_path}: neither of {list(LEVEL_COLUMNS)} in its header")
    return level, rows


def draw(csv_path: Path, baseline: dict | None, title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    level, rows = read_rows(csv_path)
    x = [float(r["Inferences/Second"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    for col, style in (("p50 latency", "o-"), ("p99 latency", "s--")):
        ax.plot(x, [float(r[col]) / 1000 for r in rows], style, label=f"served {col.split()[0]}")
    for r, xi in zip(rows, x):
        ax.annotate(f"{LEVEL_COLUMNS[level]}={r[level]}", (xi, float(r["p50 latency"]) / 1000),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)
    if baseline and baseline.get("p50_ms"):
        ax.plot([1000 / baseline["p50_ms"]], [baseline["p50_ms"]], "k*", markersize=12, label="raw diffusers, serial p50")
        best = baseline.get("best_batch")
        if best:
            ax.plot([best["generations_per_s"]], [best["mean_ms"]], "kD",
                    label=f"raw diffusers, best batch (B={best['batch_size']}, ms per call)")
    ax.set_xlabel("throughput (generations/s)")
    ax.set_xlim(left=0)
    latencies = [float(r["p99 latency"]) / 1000 for r in rows] + [float(r["p50 latency"]) / 1000 for r in rows]
    if max(latencies) > 20 * min(latencies):  # an open-loop sweep past capacity: queueing dwarfs the rest
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms, log scale)")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel("latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--baseline", type=Path, default=None, help="default: <stem>.json when it exists")
    ap.add_argument("--out", type=Path, default=None, help="default: <stem>.png")
    ap.add_argument("--title", default=None, help="default: the sweep name from the JSON, else the stem")
    args = ap.parse_args(argv)
    meta_path = args.baseline or args.csv.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    title = args.title or meta.get("title") or args.csv.stem
    print(draw(args.csv, meta.get("baseline"), title, args.out or args.csv.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
