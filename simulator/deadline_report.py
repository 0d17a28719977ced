"""Outputs of the deadline replay: summary.json's `deadline` block and the X / failure-rate plot
(the paper's figures 3 and 4)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simulator.deadline_engine import DeadlineResult


def deadline_block(result: DeadlineResult) -> dict[str, Any]:
    """The `deadline` block of summary.json (rates are shares of all submitted jobs)."""
    s = result.summary()
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in s.items()}


def plot_threshold(results: list[DeadlineResult], path: Path, title: str = "") -> Path | None:
    """X and the measured failure rate against simulated time, one panel per configuration."""
    shown = [r for r in results if r.series and not all(math.isnan(x) for _, x, _ in r.series)]
    if not shown:
        return None
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 3 * len(shown)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], shown, strict=True):
        hours = [h for h, _, _ in r.series]
        ax.plot(hours, [x for _, x, _ in r.series], label="X threshold", color="tab:blue")
        ax.plot(hours, [f for _, _, f in r.series], label="failure rate", color="tab:red", linestyle="--")
        ax.set_ylim(0, 1)
        ax.set_ylabel(r.setup.name)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("simulated hours")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_rates(summaries: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Success and miss rate per configuration (the paper's figure 2, as bars)."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    names = [s["config"] for s in summaries]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [s["success_rate"] for s in summaries], width=0.4, label="success rate")
    ax.bar([x + 0.2 for x in xs], [s["miss_rate"] for s in summaries], width=0.4, label="miss rate")
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
