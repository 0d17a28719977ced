"""Reproduce the paper's five configurations (plus checkpoint-instead-of-kill) on a paper-like
workload: a training phase fits the thresholds' parameters, the steady phase compares.

    python -m simulator.deadline_reproduce --out docs/deadline [--training-hours 10000]
        [--steady-hours 100000] [--nodes 8] [--load 0.8] [--vo-model FILE] [--seed 1]
        [--deadline-from submit|start]

--deadline-from start counts each job's 5 % buffer from its start on a node instead of its
submission (preemption.deadline.clock), in the training and the steady phase alike.

Writes reproduction.json, trained.toml (the [deadline] section the training chose), rates.png
and threshold.png (figures 3/4) into --out; the last line printed is the JSON of the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from preemption.deadline import TrainingResult, VOModel, fit_training
from preemption.deadline.clock import check_reading
from simulator.deadline_engine import Cluster, DeadlineResult, DeadlineSetup, simulate_deadline
from simulator.deadline_report import plot_rates, plot_threshold
from simulator.deadline_workload import paper_workload
from vjob.progress import Progress

PAPER = {"alg_2": 0.42, "alg_3": 0.78, "alg_4": 0.84, "alg_5": 0.84}

STATIC_GRID = {"static_x": [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}
ADAPTIVE_GRID = {"delta_x": [0.02, 0.05, 0.1], "target": [0.1, 0.2, 0.3, 0.4]}
CDF_GRID = {"probability": [0.5, 0.6, 0.7, 0.8, 0.9]}


def configurations(trained: dict[str, Any], seed: int, deadline_from: str = "submit") -> list[DeadlineSetup]:
    """alg_1..alg_5 as the paper names them, and alg_5c: alg_5 checkpointing instead of killing."""
    fixed = {k: v for k, v in trained.items() if k in CONFIG_KEYS}
    base = DeadlineSetup(seed=seed, deadline_from=deadline_from, trace_x=True, **fixed)
    return [
        replace(base, name="alg_1", physical=True, vo_managed=False, admission="none"),
        replace(base, name="alg_2", vo_managed=False, admission="none"),
        replace(base, name="alg_3", admission="static"),
        replace(base, name="alg_4", admission="adaptive"),
        replace(base, name="alg_5", admission="cdf"),
        replace(base, name="alg_5c", admission="cdf", action="checkpoint"),
    ]


def train(
    cluster: Cluster, vo: VOModel, hours: float, load: float, buffer: float, seed: int, deadline_from: str = "submit"
) -> dict[str, Any]:
    """The training phase: each parameter set chosen for the best success rate on `hours`."""
    jobs = paper_workload(hours, cores=cluster.nodes * cluster.cores, load=load, buffer=buffer, seed=seed + 1000)
    out: dict[str, Any] = {}
    total = len(STATIC_GRID["static_x"]) + 12 + len(CDF_GRID["probability"])
    with Progress(total, "training") as progress:

        def score(admission: str, fixed: dict[str, Any]) -> Any:
            def evaluate(p: dict[str, Any]) -> float:
                s = DeadlineSetup(
                    name="train", admission=admission, seed=seed, deadline_from=deadline_from, **(fixed | p)
                )
                progress.advance()
                return simulate_deadline(jobs, cluster, s, vo).summary()["success_rate"]

            return evaluate

        scores = {}
        fit = fit_training(score("static", {}), STATIC_GRID)
        out |= fit.best
        scores["static"] = fit.score
        for admission, grid in (("adaptive", ADAPTIVE_GRID), ("cdf", CDF_GRID)):
            fit = fit_training(score(admission, {"static_x": out["static_x"]}), grid)
            out |= fit.best
            scores[admission] = fit.score
    out["training_success"] = scores
    out["admission"] = max(scores, key=lambda a: scores[a])  # the best on the training workload
    return out


CONFIG_KEYS = {
    "static_x": "static_x",
    "delta_x": "delta_x",
    "target": "target_failure",
    "probability": "cdf_probability",
}


def trained_toml(trained: dict[str, Any]) -> str:
    """The training's choice as the [deadline] section of vjob.toml (the keys config.py knows),
    with the admission that did best on the training workload."""
    best = {CONFIG_KEYS[k]: v for k, v in trained.items() if k in CONFIG_KEYS}
    if "admission" in trained:
        best["admission"] = trained["admission"]
    return TrainingResult(best=best, score=0.0, tried=()).toml()


def reproduce(
    *,
    training_hours: float,
    steady_hours: float,
    nodes: int,
    load: float,
    buffer: float,
    seed: int,
    vo: VOModel,
    out: Path,
    deadline_from: str = "submit",
    keep: list[DeadlineResult] | None = None,
) -> dict[str, Any]:
    """Train, replay the six configurations, write the figures; returns reproduction.json's
    content. `keep` receives the steady phase's results (with X's every update, `trace_x`), for
    bench/deadline_readings.py's diagnosis of the update rules."""
    check_reading(deadline_from)
    cluster = Cluster(nodes=nodes)
    trained = train(cluster, vo, training_hours, load, buffer, seed, deadline_from)
    jobs = paper_workload(steady_hours, cores=nodes * cluster.cores, load=load, buffer=buffer, seed=seed)
    results = []
    setups = configurations(trained, seed, deadline_from)
    with Progress(len(setups), "steady phase") as progress:
        for s in setups:
            results.append(simulate_deadline(jobs, cluster, s, vo))
            progress.advance()
    summaries = [r.summary() for r in results]
    out.mkdir(parents=True, exist_ok=True)
    plot_rates(summaries, out / "rates.png", f"{steady_hours:g} h steady phase, load {load:g}, buffer {buffer:g}")
    plot_threshold([r for r in results if r.setup.name in ("alg_4", "alg_5")], out / "threshold.png")
    doc = {
        "training_hours": training_hours,
        "steady_hours": steady_hours,
        "jobs": len(jobs),
        "nodes": nodes,
        "cores_per_node": cluster.cores,
        "load": load,
        "buffer": buffer,
        "deadline_from": deadline_from,
        "seed": seed,
        "vo_model": vo.to_dict(),
        "trained": trained,
        "paper": PAPER,
        "results": summaries,
    }
    (out / "reproduction.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "trained.toml").write_text(trained_toml(trained))
    if keep is not None:
        keep.extend(results)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/deadline")
    ap.add_argument("--training-hours", type=float, default=10_000)
    ap.add_argument("--steady-hours", type=float, default=100_000)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--buffer", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vo-model", default=None, help="VO model JSON (or bench/vo_overhead.py output)")
    ap.add_argument("--deadline-from", default="submit", help="the deadline clock starts at: submit or start")
    a = ap.parse_args(argv)
    check_reading(a.deadline_from)
    vo = VOModel.load(a.vo_model) if a.vo_model else VOModel.default()
    doc = reproduce(
        training_hours=a.training_hours,
        steady_hours=a.steady_hours,
        nodes=a.nodes,
        load=a.load,
        buffer=a.buffer,
        seed=a.seed,
        vo=vo,
        out=Path(a.out),
        deadline_from=a.deadline_from,
    )
    for s in doc["results"]:
        print(
            f"{s['config']:7s} success {s['success_rate']:.3f} miss {s['miss_rate']:.3f} "
            f"rejected {s['rejected']} cancelled {s['cancelled']} checkpointed {s['checkpointed']}",
            file=sys.stderr,
        )
    print(json.dumps({s["config"]: round(s["success_rate"], 4) for s in doc["results"]} | {"trained": doc["trained"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
