"""Benchmark: ARRIVE-F's remapping against FCFS-EASY "fastest free sub-cluster first".

The paper's farm (docs/remap/arrive-f.toml), a 330-job Lublin–Feitelson stream of its job
kinds, three streams (seeds 1-3), at several offered loads; then, with --big-scale N, the farm
with N times the nodes and --big-jobs jobs. Prints a table per load and the change against the
baseline, writes the comparison PNG, and ends with one JSON line of the figures:
{"bench": "remap", "load": ..., "throughput_pct": ..., "makespan_pct": ..., "mean_wait_pct": ...}.

    .venv/bin/python bench/remap.py [--loads 0.6,0.9,1.2] [--big-scale 105 --big-jobs 10000]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from preemption.remap.policy import RemapParams
from simulator.remap_engine import paper_stream, simulate
from simulator.subclusters import Farm, load_farm
from vjob.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
FIGS = ("throughput_jobs_h", "makespan_s", "mean_wait_s", "mean_turnaround_s")
PAPER = {"throughput_jobs_h": 27.0, "makespan_s": -32.0, "mean_wait_s": -55.0}


def run(farm: Farm, jobs: int, seeds: list[int], load: float, params: RemapParams, label: str) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {"none": [], "arrive-f": []}
    seconds = {"none": 0.0, "arrive-f": 0.0}
    with Progress(2 * len(seeds), label) as progress:
        for seed in seeds:
            stream = paper_stream(farm, jobs, seed, load, (60.0, 6000.0))
            for remap in rows:
                t0 = time.perf_counter()
                rows[remap].append(simulate(farm, stream, remap, params, seed=seed).summary())  # type: ignore[arg-type]
                seconds[remap] += time.perf_counter() - t0
                progress.advance()
    keys = (*FIGS, "migrations", "utilisation")
    mean = {r: {f: float(np.mean([x[f] for x in v])) for f in keys} for r, v in rows.items()}
    change = {f: 100.0 * (mean["arrive-f"][f] / mean["none"][f] - 1.0) for f in FIGS}
    per_seed = [
        {f: 100.0 * (b[f] / a[f] - 1.0) for f in FIGS} for a, b in zip(rows["none"], rows["arrive-f"], strict=True)
    ]
    decisions: dict[str, int] = {}
    for r in rows["arrive-f"]:
        for k, v in r["decisions"].items():
            decisions[k] = decisions.get(k, 0) + v
    return {
        "load": load,
        "jobs": jobs,
        "mean": mean,
        "change_pct": change,
        "per_seed_pct": per_seed,
        "decisions": decisions,
        "seconds": seconds,
    }


def show(res: dict[str, Any], title: str) -> None:
    print(f"\n{title}: {res['jobs']} jobs, offered load {res['load']}, decisions {res['decisions']}")
    print(f"{'figure':22} {'none':>12} {'arrive-f':>12} {'change':>9} {'paper':>7}  per seed")
    for f in FIGS:
        a, b = res["mean"]["none"][f], res["mean"]["arrive-f"][f]
        seeds = " ".join(f"{s[f]:+.1f}" for s in res["per_seed_pct"])
        paper = f"{PAPER[f]:+.0f} %" if f in PAPER else ""
        print(f"{f:22} {a:12,.1f} {b:12,.1f} {res['change_pct'][f]:+8.1f}% {paper:>7}  {seeds}")
    print(f"{'seconds (replay)':22} {res['seconds']['none']:12.2f} {res['seconds']['arrive-f']:12.2f}")


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    loads = [r["load"] for r in results]
    for ax, f, name in zip(
        axes, ("throughput_jobs_h", "makespan_s", "mean_wait_s"), ("throughput", "makespan", "mean wait"), strict=True
    ):
        vals = [r["change_pct"][f] for r in results]
        lo = [min(s[f] for s in r["per_seed_pct"]) for r in results]
        hi = [max(s[f] for s in r["per_seed_pct"]) for r in results]
        ax.bar([str(x) for x in loads], vals, color="tab:blue", label="ARRIVE-F (mean of 3 streams)")
        ax.errorbar(
            [str(x) for x in loads],
            vals,
            yerr=[np.subtract(vals, lo), np.subtract(hi, vals)],
            fmt="none",
            ecolor="black",
            capsize=4,
        )
        ax.axhline(PAPER[f], color="tab:red", linestyle="--", label=f"paper {PAPER[f]:+.0f} %")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(f"{name}: change vs fastest-free-first")
        ax.set_xlabel("offered load")
        ax.set_ylabel("%")
        ax.legend(fontsize=7)
    fig.suptitle("ARRIVE-F on the paper's farm, 330-job Lublin streams (bars: min..max of 3 streams)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--farm", default=str(ROOT / "docs" / "remap" / "arrive-f.toml"))
    parser.add_argument("--jobs", type=int, default=330)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--loads", default="0.6,0.9,1.2", help="offered loads; the middle one is the headline")
    parser.add_argument("--big-scale", type=int, default=0, help="also run the farm with N times the nodes")
    parser.add_argument("--big-jobs", type=int, default=10_000)
    parser.add_argument("--plot", default=str(ROOT / "docs" / "remap" / "reproduction.png"))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()

    farm = load_farm(args.farm)
    seeds = [int(s) for s in args.seeds.split(",")]
    params = RemapParams()
    results = []
    for load in (float(x) for x in args.loads.split(",")):
        res = run(farm, args.jobs, seeds, load, params, f"load {load}")
        show(res, "paper farm")
        results.append(res)
    if not args.no_plot:
        plot(results, Path(args.plot))
    head = results[len(results) // 2]
    doc: dict[str, Any] = {
        "bench": "remap",
        "jobs": args.jobs,
        "seeds": seeds,
        "load": head["load"],
        "throughput_pct": round(head["change_pct"]["throughput_jobs_h"], 1),
        "makespan_pct": round(head["change_pct"]["makespan_s"], 1),
        "mean_wait_pct": round(head["change_pct"]["mean_wait_s"], 1),
        "turnaround_pct": round(head["change_pct"]["mean_turnaround_s"], 1),
        "by_load": {
            str(r["load"]): {k: round(v, 1) for k, v in r["change_pct"].items()} | {"decisions": r["decisions"]}
            for r in results
        },
    }
    oracle = Farm(farm.subclusters, tuple(replace(k, accuracy=1.0) for k in farm.kinds), farm.thrash_factor)
    res = run(oracle, args.jobs, seeds, head["load"], params, "exact predictions")
    show(res, "paper farm, exact predictions (accuracy 1)")
    doc["exact_predictions"] = {k: round(v, 1) for k, v in res["change_pct"].items()}
    if args.big_scale:
        big = farm.scaled(args.big_scale)
        nodes = sum(s.nodes for s in big.subclusters)
        res = run(big, args.big_jobs, seeds[:1], head["load"], params, f"big farm x{args.big_scale}")
        show(res, f"farm x{args.big_scale} ({nodes} nodes)")
        doc["big"] = {
            "nodes": nodes,
            "jobs": args.big_jobs,
            "seconds": res["seconds"],
            **{k: round(v, 1) for k, v in res["change_pct"].items()},
        }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
