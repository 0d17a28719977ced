"""Khalid et al. under both readings of "a deadline buffer of 5 % of the job duration"
(docs/deadline.md, "Two readings of the deadline"), and why adaptive and cdf X fall below
static: X's every update and what drove it, and the replays that test each suspected cause.

    .venv/bin/python bench/deadline_readings.py --out docs/deadline     # about 15 min, 2 cores

Writes, under --out: the submit reading's reproduction (reproduction.json, rates.png, …, as
`python -m simulator.deadline_reproduce` does), the start reading's under from_start/,
readings.json (both tables, the update statistics, the cause replays), readings.png (success
per configuration, both readings side by side) and x_updates.png (X over time for alg_4 and
alg_5 with the driver of each update). The last line printed is readings.json's summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from preemption.deadline import VOModel
from simulator.deadline_engine import Cluster, DeadlineResult, simulate_deadline
from simulator.deadline_reproduce import reproduce
from simulator.deadline_workload import paper_workload

READINGS = ("submit", "start")


def completers_failure(s: dict[str, Any]) -> float:
    """The failure rate the adaptive rule measures: misses among jobs let run to their end (the
    cancelled and the refused are the policy's own decisions and are not counted)."""
    succeeded = round(s["success_rate"] * s["jobs"])
    ran = succeeded + s["missed"]
    return s["missed"] / ran if ran else 0.0


def update_stats(r: DeadlineResult) -> dict[str, Any]:
    """How X moved in one replay: where it sat, how often each way, what drove it."""
    ups = r.updates
    if not ups:
        return {}
    s = r.setup
    xs = [after for _, _, after, _, _ in ups]
    drivers = [d for *_, d in ups if math.isfinite(d)]
    out: dict[str, Any] = {
        "updates": len(ups),
        "x_mean": sum(xs) / len(xs),
        "at_x_min": sum(x <= s.x_min + 1e-12 for x in xs) / len(xs),
        "at_x_max": sum(x >= s.x_max - 1e-12 for x in xs) / len(xs),
        "raised": sum(a > b for _, b, a, _, _ in ups),
        "lowered": sum(a < b for _, b, a, _, _ in ups),
        "triggered_by_success": sum(ok for *_, ok, _ in ups) / len(ups),
        "driver_mean": sum(drivers) / len(drivers) if drivers else None,
    }
    if s.admission == "adaptive":  # how long the measured rate stayed under the target
        out["under_target"] = sum(d < s.target for d in drivers) / len(drivers)
    elif s.admission == "cdf":  # how often the headroom quantile wanted X below the floor
        out["quantile_below_x_min"] = sum(d < s.x_min for d in drivers) / len(drivers)
    return out


def cause_replays(doc: dict[str, Any], results: list[DeadlineResult], vo: VOModel) -> list[dict[str, Any]]:
    """Replays that each remove one suspected cause, on the same steady workload and seed:
    the floor X_min (0.1, above the trained static X), and the adaptive target (0.10, the
    lowest of the training grid, above what static achieves among the jobs it lets run)."""
    by = {r.setup.name: r for r in results}
    jobs = paper_workload(
        doc["steady_hours"],
        cores=doc["nodes"] * doc["cores_per_node"],
        load=doc["load"],
        buffer=doc["buffer"],
        seed=doc["seed"],
    )
    cluster = Cluster(nodes=doc["nodes"], cores=doc["cores_per_node"])
    static = next(s for s in doc["results"] if s["config"] == "alg_3")
    target = completers_failure(static)
    a4, a5 = by["alg_4"].setup, by["alg_5"].setup
    setups = [
        replace(a4, name="alg_4, X_min = 0", x_min=0.0),
        replace(a4, name="alg_4, X_min = 0, target = static's", x_min=0.0, target=round(target, 4)),
        replace(a4, name="alg_4, target = static's", target=round(target, 4)),
        replace(a5, name="alg_5, X_min = 0", x_min=0.0),
    ]
    out = []
    for s in setups:
        r = simulate_deadline(jobs, cluster, s, vo)
        row = r.summary() | {"completers_failure": completers_failure(r.summary())}
        out.append(row | {"x_updates": update_stats(r)})
        print(f"  {s.name}: success {row['success_rate']:.3f} X mean {row['x_mean']}", file=sys.stderr)
    return out


def plot_readings(docs: dict[str, dict[str, Any]], path: Path) -> None:
    """Success rate per configuration, the two readings side by side."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    names = [s["config"] for s in docs["submit"]["results"]]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, reading in enumerate(READINGS):
        rates = {s["config"]: s["success_rate"] for s in docs[reading]["results"]}
        xs = [k + (i - 0.5) * 0.4 for k in range(len(names))]
        bars = ax.bar(xs, [rates[n] for n in names], width=0.4, label=f"deadline counted from {reading}")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("success rate")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("5 % buffer from submission vs from the start on the node (100,000 h, seed 1)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_updates(kept: dict[str, list[DeadlineResult]], path: Path) -> None:
    """X after each update for alg_4 and alg_5 under each reading, with its driver: the
    measured failure rate against the target (adaptive), the unclipped headroom quantile
    against X_min (cdf)."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, axes = plt.subplots(2, 2, figsize=(11, 6), sharex=True, squeeze=False)
    for col, reading in enumerate(READINGS):
        by = {r.setup.name: r for r in kept[reading]}
        static_x = by["alg_3"].setup.static_x
        for row, name in enumerate(("alg_4", "alg_5")):
            r, ax = by[name], axes[row][col]
            hours = [h for h, *_ in r.updates]
            ax.plot(
                hours,
                [d for *_, d in r.updates],
                color="tab:red",
                lw=0.5,
                alpha=0.6,
                label="measured failure rate" if name == "alg_4" else "headroom quantile (unclipped)",
            )
            ax.plot(hours, [a for _, _, a, _, _ in r.updates], color="tab:blue", lw=1, label="X")
            if name == "alg_4":
                ax.axhline(r.setup.target, color="tab:red", ls=":", lw=1, label=f"target {r.setup.target:g}")
            ax.axhline(r.setup.x_min, color="grey", ls="--", lw=1, label=f"X_min {r.setup.x_min:g}")
            ax.axhline(static_x, color="tab:green", ls="-.", lw=1, label=f"trained static X {static_x:g}")
            ax.set_ylim(-0.3 if name == "alg_5" else 0, 0.6)
            ax.set_title(f"{name} ({r.setup.admission}), deadline from {reading}", fontsize=9)
            ax.legend(loc="upper right", fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("simulated hours")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(docs: dict[str, dict[str, Any]]) -> str:
    """The side-by-side table of docs/deadline.md (markdown)."""
    lines = [
        "| config | success (submit) | success (start) | miss (submit) | miss (start) "
        "| cancelled (submit) | cancelled (start) | X mean (submit) | X mean (start) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = {r: {s["config"]: s for s in docs[r]["results"]} for r in READINGS}
    for name in rows["submit"]:
        a, b = rows["submit"][name], rows["start"][name]

        def fx(v: float | None) -> str:
            return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

        lines.append(
            f"| {name} | {a['success_rate']:.3f} | {b['success_rate']:.3f} | {a['miss_rate']:.3f} "
            f"| {b['miss_rate']:.3f} | {a['cancelled']:,} | {b['cancelled']:,} "
            f"| {fx(a['x_mean'])} | {fx(b['x_mean'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/deadline")
    ap.add_argument("--training-hours", type=float, default=10_000)
    ap.add_argument("--steady-hours", type=float, default=100_000)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    vo, out = VOModel.default(), Path(a.out)
    docs: dict[str, dict[str, Any]] = {}
    kept: dict[str, list[DeadlineResult]] = {}
    for reading in READINGS:
        kept[reading] = []
        docs[reading] = reproduce(
            training_hours=a.training_hours,
            steady_hours=a.steady_hours,
            nodes=a.nodes,
            load=0.7,
            buffer=0.05,
            seed=a.seed,
            vo=vo,
            out=out if reading == "submit" else out / "from_start",
            deadline_from=reading,
            keep=kept[reading],
        )
    report: dict[str, Any] = {"table": table(docs), "readings": {}}
    for reading in READINGS:
        d = docs[reading]
        report["readings"][reading] = {
            "trained": d["trained"],
            "success": {s["config"]: s["success_rate"] for s in d["results"]},
            "completers_failure": {s["config"]: completers_failure(s) for s in d["results"]},
            "x_updates": {r.setup.name: update_stats(r) for r in kept[reading] if r.updates},
            "cause_replays": cause_replays(d, kept[reading], vo),
        }
    plot_readings(docs, out / "readings.png")
    plot_updates(kept, out / "x_updates.png")
    (out / "readings.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(report["table"], file=sys.stderr)
    print(json.dumps({r: report["readings"][r]["success"] for r in READINGS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
