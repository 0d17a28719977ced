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

BASELINES = ("defaults", "mms", "ubis")
"""`defaults`: the study's policy with [priority] / [scheduling] as configured (the paper's
weights unless the file changed them); `mms` and `ubis`: those policies, configured values,
replayed on the same held-back jobs by the same engine (the reference points of the plot)."""


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
            if key not in cache or "admitted_wait" not in cache[key]:
                params = dict(trial.params) if trial is not None else {}
                doc = evaluate(spec, params, part="test", policy=name if name in ("mms", "ubis") else None)
                cache[key] = {
                    "objectives": doc["objectives"],
                    "batch_response": doc["by_class"]["batch"].get("mean_response_s"),
                    "admitted_wait": (doc.get("interactive_admitted") or {}).get("mean_wait_s"),
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
                    "admitted_wait": cache[key]["admitted_wait"],
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
    """The trade the admin chooses: mean wait of the cap-admitted interactive jobs against mean
    batch response, both on the held-back part, for the front's trials and the configured
    policy, MMS and UBIS (whatever the study's objectives were)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.4))
    shown = [r for r in rows if r["admitted_wait"] is not None and r["batch_response"] is not None]
    front = complete_rows(shown)
    if front:
        ax.scatter(
            [r["admitted_wait"] for r in front],
            [r["batch_response"] for r in front],
            label=f"{spec.policy}, front trials",
            color="C0",
        )
        for r in front:
            xy = (r["admitted_wait"], r["batch_response"])
            ax.annotate(str(r["trial"]), xy, fontsize=7, xytext=(3, 3), textcoords="offset points")
    marks = {
        "defaults": ("C3", "s", f"{spec.policy}, configured"),
        "mms": ("C2", "D", "MMS"),
        "ubis": ("C1", "^", "UBIS, configured weights"),
    }
    for r in shown:
        if r["trial"] is None:
            color, marker, label = marks[r["name"]]
            ax.scatter(r["admitted_wait"], r["batch_response"], color=color, marker=marker, s=60, label=label)
    ax.set_xlabel("mean wait of cap-admitted interactive jobs (s)")
    ax.set_ylabel("mean batch response (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
