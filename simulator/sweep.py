"""The outputs of a `vjob simulate --sweep` grid: one table and one comparison figure per metric.

Why grouped bars per interactive fraction: that is how the UBIS paper shows its results
(Figures 1–3: one figure per fraction, mean interactive size on the x axis, one bar per
policy and cap), so a reader can put ours next to theirs.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

METRICS: dict[str, tuple[str, str]] = {
    "throughput": ("throughput_jobs_per_hour", "throughput (jobs/h)"),
    "utilization": ("utilization", "utilisation (0-1)"),
    "response_all": ("mean_response_s", "mean response time, all jobs (s)"),
    "response_interactive": ("interactive.mean_response_s", "mean response, interactive (s)"),
    "response_batch": ("batch.mean_response_s", "mean response, batch (s)"),
    "response_batch_large": ("batch_large.mean_response_s", "mean response, large batch jobs (s)"),
    "wait_interactive": ("interactive.mean_wait_s", "mean wait, interactive (s)"),
}

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Student's t quantile (0.975) per degrees of freedom, for the 95 % interval of a mean over a
few seeds (beyond 10 degrees of freedom 2.0 is within 10 %)."""
KEYS = ("policy", "interactive_frac", "interactive_mean_size", "interactive_cap", "cap_mode", "weights")
"""What identifies a cell of the grid; rows differing only by seed are averaged."""

COLUMNS = (
    "policy",
    "seed",
    "cap_mode",
    "interactive_frac",
    "interactive_mean_size",
    "interactive_cap",
    "weights",
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
    row["interactive_admitted_mean_wait_s"] = (doc.get("interactive_admitted") or {}).get("mean_wait_s")
    for size, stats in doc.get("batch_by_size", {}).items():
        for key in ("count", "mean_wait_s", "mean_response_s", "max_wait_s"):
            row[f"batch_{size}_{key}"] = stats.get(key)
    return row


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (KEYS): each numeric column's mean over the seeds, and `<column>_ci95`,
    the half-width of its 95 % interval (Student's t; None with one seed)."""
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row.get(k) for k in KEYS), []).append(row)
    out = []
    for key, group in cells.items():
        agg: dict[str, Any] = dict(zip(KEYS, key, strict=True))
        agg["seeds"] = len(group)
        for col in group[0]:
            if col in KEYS or col == "seed":
                continue
            values = [r.get(col) for r in group]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                continue
            mean = sum(values) / len(values)
            agg[col] = mean
            if len(values) > 1:
                var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
                agg[f"{col}_ci95"] = T95.get(len(values) - 1, 2.0) * math.sqrt(var / len(values))
            else:
                agg[f"{col}_ci95"] = None
        out.append(agg)
    return out


def _value(row: dict[str, Any], key: str) -> float:
    if "." in key:
        cls, name = key.split(".")
        key = f"{cls}_{name}"
    value = row.get(key)
    return float(value) if value is not None else float("nan")


def write_sweep(docs: list[dict[str, Any]], out: Path, plots: bool = True) -> list[Path]:
    """sweep.csv and sweep.json (one row per run), sweep_mean.csv and sweep_mean.json (per cell:
    mean and 95 % interval over the seeds) and, unless `plots` is false, compare_<metric>.png
    of the means, in `out`; returns the figure paths."""
    rows = sorted(
        (flatten(d) for d in docs),
        key=lambda r: (
            r["interactive_frac"],
            r["interactive_mean_size"],
            r["interactive_cap"],
            r["policy"],
            r.get("weights") or "",
            r.get("seed") or 0,
        ),
    )
    means = aggregate(rows)
    for name, table in (("sweep", rows), ("sweep_mean", means)):
        fields = list(dict.fromkeys(k for r in table for k in r)) or list(COLUMNS)
        with (out / f"{name}.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table)
        (out / f"{name}.json").write_text(json.dumps(table, indent=2) + "\n")
    if not plots:
        return []
    return [plot_metric(means, name, key, label, out) for name, (key, label) in METRICS.items()]


def plot_metric(rows: list[dict[str, Any]], name: str, key: str, label: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fracs = sorted({r["interactive_frac"] for r in rows})
    sizes = sorted({r["interactive_mean_size"] for r in rows})
    series = sorted({(r["policy"], r["interactive_cap"], r.get("weights") or "") for r in rows})
    fig, axes = plt.subplots(1, len(fracs), figsize=(4.2 * len(fracs), 3.6), squeeze=False)
    width = 0.8 / max(len(series), 1)
    for ax, frac in zip(axes[0], fracs, strict=True):
        x = np.arange(len(sizes))
        for k, (policy, cap, weights) in enumerate(series):
            heights, errors = [], []
            for size in sizes:
                match = [
                    r
                    for r in rows
                    if r["interactive_frac"] == frac
                    and r["interactive_mean_size"] == size
                    and r["policy"] == policy
                    and r["interactive_cap"] == cap
                    and (r.get("weights") or "") == weights
                ]
                heights.append(_value(match[0], key) if match else float("nan"))
                errors.append(_value(match[0], key + "_ci95") if match else float("nan"))
            name_ = f"{policy}, cap {cap:g}" + (f", {weights}" if weights else "")
            ax.bar(x + k * width - 0.4 + width / 2, heights, width, yerr=errors, label=name_)
        ax.set_xticks(x, [f"{s:g}" for s in sizes])
        ax.set(title=f"{frac:.0%} interactive", xlabel="mean interactive size (nodes)")
    axes[0][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = out / f"compare_{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
