"""The outputs of a `vjob simulate --sweep` grid: one table and one comparison figure per metric.

Why grouped bars per interactive fraction: that is how the UBIS paper shows its results
(Figures 1–3: one figure per fraction, mean interactive size on the x axis, one bar per
policy and cap), so a reader can put ours next to theirs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

METRICS: dict[str, tuple[str, str]] = {
    "throughput": ("throughput_jobs_per_hour", "throughput (jobs/h)"),
    "utilization": ("utilization", "utilisation (0-1)"),
    "response_all": ("mean_response_s", "mean response time, all jobs (s)"),
    "response_interactive": ("interactive.mean_response_s", "mean response, interactive (s)"),
    "response_batch": ("batch.mean_response_s", "mean response, batch (s)"),
}

COLUMNS = (
    "policy",
    "interactive_frac",
    "interactive_mean_size",
    "interactive_cap",
    "jobs",
    "makespan_s",
    "throughput_jobs_per_hour",
    "utilization",
    "mean_response_s",
    "interactive_mean_wait_s",
    "interactive_mean_response_s",
    "batch_mean_wait_s",
    "batch_mean_response_s",
    "batch_mean_bounded_slowdown",
    "preemptions",
    "wasted_node_seconds",
    "os_swaps",
    "wall_seconds",
)


def flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """One sweep row from a run's summary (class figures flattened, overall response added)."""
    row = {k: doc.get(k) for k in COLUMNS if k in doc}
    total, weighted = 0, 0.0
    for cls in ("interactive", "batch"):
        stats = doc["by_class"].get(cls, {})
        for key in ("mean_wait_s", "mean_response_s", "mean_bounded_slowdown"):
            row[f"{cls}_{key}"] = stats.get(key)
        if stats.get("count"):
            total += stats["count"]
            weighted += stats["count"] * stats["mean_response_s"]
    row["mean_response_s"] = weighted / total if total else None
    return row


def _value(row: dict[str, Any], key: str) -> float:
    if "." in key:
        cls, name = key.split(".")
        key = f"{cls}_{name}"
    value = row.get(key)
    return float(value) if value is not None else float("nan")


def write_sweep(docs: list[dict[str, Any]], out: Path) -> list[Path]:
    """sweep.csv, sweep.json and compare_<metric>.png in `out`; returns the figure paths."""
    rows = sorted(
        (flatten(d) for d in docs),
        key=lambda r: (r["interactive_frac"], r["interactive_mean_size"], r["interactive_cap"], r["policy"]),
    )
    with (out / "sweep.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    return [plot_metric(rows, name, key, label, out) for name, (key, label) in METRICS.items()]


def plot_metric(rows: list[dict[str, Any]], name: str, key: str, label: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fracs = sorted({r["interactive_frac"] for r in rows})
    sizes = sorted({r["interactive_mean_size"] for r in rows})
    series = sorted({(r["policy"], r["interactive_cap"]) for r in rows})
    fig, axes = plt.subplots(1, len(fracs), figsize=(4.2 * len(fracs), 3.6), squeeze=False)
    width = 0.8 / max(len(series), 1)
    for ax, frac in zip(axes[0], fracs, strict=True):
        x = np.arange(len(sizes))
        for k, (policy, cap) in enumerate(series):
            heights = []
            for size in sizes:
                match = [
                    r
                    for r in rows
                    if r["interactive_frac"] == frac
                    and r["interactive_mean_size"] == size
                    and r["policy"] == policy
                    and r["interactive_cap"] == cap
                ]
                heights.append(_value(match[0], key) if match else float("nan"))
            ax.bar(x + k * width - 0.4 + width / 2, heights, width, label=f"{policy}, cap {cap:g}")
        ax.set_xticks(x, [f"{s:g}" for s in sizes])
        ax.set(title=f"{frac:.0%} interactive", xlabel="mean interactive size (nodes)")
    axes[0][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / f"compare_{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
