"""`vjob tune show`: the study's Pareto front measured on the held-back part of the trace,
beside the configured weights and MMS, as a table and a PNG.

Why re-measure: a trial's values are on the training part, where the search could overfit;
the held-back part says what the weights are worth on jobs the search never saw. Measured
points are kept in the study (user attribute `test`), so showing it again costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from simulator.tune.space import directions
from simulator.tune.trials import Spec, evaluate
from vjob.progress import Progress

BASELINES = ("defaults", "mms")
"""`defaults`: the study's policy with [priority] / [scheduling] as configured (the paper's
weights unless the file changed them); `mms`: the MMS policy on the same jobs."""


def held_back(study: optuna.Study, spec: Spec, *, show: bool = True) -> list[dict[str, Any]]:
    """One row per point: name, trial number (None for a baseline), params, train and test
    objective values; the front's trials first, then the baselines."""
    cache: dict[str, Any] = dict(study.user_attrs.get("test", {}))
    front = sorted(study.best_trials, key=lambda t: t.number)
    todo: list[tuple[str, optuna.trial.FrozenTrial | None]] = [(f"trial {t.number}", t) for t in front]
    todo += [(name, None) for name in BASELINES]
    rows = []
    with Progress(len(todo), "held-back replay", live=None if show else False) as progress:
        for name, trial in todo:
            key = str(trial.number) if trial is not None else name
            if key not in cache:
                params = dict(trial.params) if trial is not None else {}
                doc = evaluate(spec, params, part="test", policy="mms" if name == "mms" else None)
                cache[key] = {
                    "objectives": doc["objectives"],
                    "batch_response": doc["by_class"]["batch"].get("mean_response_s"),
                }
                study.set_user_attr("test", cache)
            rows.append(
                {
                    "name": name,
                    "trial": trial.number if trial is not None else None,
                    "params": dict(trial.params) if trial is not None else {},
                    "train": list(trial.values) if trial is not None else None,
                    "test": [cache[key]["objectives"][o] for o in spec.objectives],
                    "batch_response": cache[key]["batch_response"],
                }
            )
            progress.advance()
    return rows


def better(a: list[float], b: list[float], spec: Spec) -> bool:
    """`a` strictly better than `b` on every objective (the issue's "dominates")."""
    return all((x > y if d == "maximize" else x < y) for x, y, d in zip(a, b, directions(spec.objectives), strict=True))


def verdicts(rows: list[dict[str, Any]], spec: Spec) -> dict[str, Any]:
    """Which front trials beat the defaults on every objective, and are no worse than MMS on
    batch response, on the held-back part."""
    base = {r["name"]: r for r in rows if r["trial"] is None}
    dominating = [
        r["trial"] for r in rows if r["trial"] is not None and better(r["test"], base["defaults"]["test"], spec)
    ]
    mms_batch = base["mms"]["batch_response"]
    ok_vs_mms = [
        r["trial"]
        for r in rows
        if r["trial"] in dominating
        and r["batch_response"] is not None
        and mms_batch is not None
        and r["batch_response"] <= mms_batch
    ]
    return {
        "dominate_defaults": dominating,
        "dominate_defaults_and_batch_le_mms": ok_vs_mms,
        "front": len(complete_rows(rows)),
    }


def complete_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["trial"] is not None]


def plot(rows: list[dict[str, Any]], spec: Spec, path: Path, title: str) -> Path:
    """The held-back front on the first two objectives (one objective: against the trial)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.4))
    front = complete_rows(rows)
    two = len(spec.objectives) >= 2

    def xy(r: dict[str, Any], part: str) -> tuple[float, float]:
        v = r[part]
        return (v[0], v[1]) if two else (float(r["trial"] or 0), v[0])

    if front:
        ax.scatter(*zip(*(xy(r, "test") for r in front), strict=True), label="front, held-back part", color="C0")
        ax.scatter(
            *zip(*(xy(r, "train") for r in front), strict=True),
            label="front, training part",
            color="C0",
            alpha=0.3,
            marker="x",
        )
        for r in front:
            ax.annotate(str(r["trial"]), xy(r, "test"), fontsize=7, xytext=(3, 3), textcoords="offset points")
    marks = {"defaults": ("C3", "s", f"{spec.policy}, configured weights"), "mms": ("C2", "D", "MMS")}
    for r in rows:
        if r["trial"] is None and two:
            color, marker, label = marks[r["name"]]
            ax.scatter(*xy(r, "test"), color=color, marker=marker, s=60, label=label)
    ax.set_xlabel(spec.objectives[0] if two else "trial")
    ax.set_ylabel(spec.objectives[1] if two else spec.objectives[0])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
