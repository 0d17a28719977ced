"""Benchmark: ARRIVE-F's remapping against FCFS-EASY "fastest free sub-cluster first".

The paper's farm (docs/remap/arrive-f.toml), a 330-job Lublin–Feitelson stream of its job
kinds, three streams (seeds 1-3), at several offered loads; then, with --big-scale N, the farm
with N times the nodes and --big-jobs jobs. Prints a table per load and the change against the
baseline, writes the comparison PNG, and ends with one JSON line of the figures:
{"bench": "remap", "load": ..., "throughput_pct": ..., "makespan_pct": ..., "mean_wait_pct": ...}.

    .venv/bin/python bench/remap.py [--loads 0.6,0.9,1.2] [--big-scale 105 --big-jobs 10000]
    .venv/bin/python bench/remap.py --big-only --big-farm docs/remap/arrive-f-1056.toml --big-jobs 100000 --loads 0.9

(the second: the issue's 1,056-node farm with 100,000 jobs, one seed unless --big-seeds; about
9 minutes, progress every 2 % of the jobs finished; ends with {"bench": "remap_big", ...}).

With --vjob FRAC it measures instead remapping combined with the vjob policy (FRAC of each stream
interactive, preempting batch jobs by checkpoint): fastest-free-first, ARRIVE-F alone, vjob
alone and vjob + ARRIVE-F on the same streams, ending with
{"bench": "remap_vjob", "by_load": {load: {config: {figure: mean}}}, ...}.
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
from simulator.remap_cli import interactive_flags
from simulator.remap_engine import simulate
from simulator.remap_jobs import paper_stream
from simulator.subclusters import Farm, load_farm
from vjob.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
FIGS = ("throughput_jobs_h", "makespan_s", "mean_wait_s", "mean_turnaround_s")
PAPER = {"throughput_jobs_h": 27.0, "makespan_s": -32.0, "mean_wait_s": -55.0}


def run(farm: Farm, jobs: int, seeds: list[int], load: float, params: RemapParams, label: str) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {"none": [], "arrive-f": []}
    seconds = {"none": 0.0, "arrive-f": 0.0}
    with Progress(2 * len(seeds) * jobs, label, step_pct=2.0) as progress:
        for seed in seeds:
            stream = paper_stream(farm, jobs, seed, load, (60.0, 6000.0))
            for remap in rows:
                t0 = time.perf_counter()
                counted = [0]

                def finished(n: int, counted: list[int] = counted) -> None:
                    progress.advance(n - counted[0])  # the engine reports a running total
                    counted[0] = n

                r = simulate(farm, stream, remap, params, seed=seed, advance=finished)  # type: ignore[arg-type]
                rows[remap].append(r.summary())
                seconds[remap] += time.perf_counter() - t0
                progress.advance(jobs - counted[0])
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


COMBOS = (("fcfs-easy", "none"), ("fcfs-easy", "arrive-f"), ("vjob", "none"), ("vjob", "arrive-f"))
VJOB_FIGS = (*FIGS, "mean_wait_interactive_s", "mean_wait_batch_s", "migrations", "preemptions")


def combined(farm: Farm, jobs: int, seeds: list[int], load: float, params: RemapParams, frac: float) -> dict[str, Any]:
    """The four (policy, remap) configurations on the same streams and interactive draws."""
    rows: dict[str, list[dict[str, Any]]] = {f"{p}+{r}": [] for p, r in COMBOS}
    with Progress(len(COMBOS) * len(seeds), f"vjob+remap load {load}") as progress:
        for seed in seeds:
            stream = paper_stream(farm, jobs, seed, load, (60.0, 6000.0))
            inter = interactive_flags(len(stream.submit), frac, seed)
            for policy, remap in COMBOS:
                r = simulate(farm, stream, remap, params, seed=seed, policy=policy, interactive=inter)  # type: ignore[arg-type]
                rows[f"{policy}+{remap}"].append(r.summary())
                progress.advance()
    mean = {c: {f: float(np.mean([x[f] for x in v])) for f in VJOB_FIGS} for c, v in rows.items()}
    base = mean["fcfs-easy+none"]
    change = {c: {f: 100.0 * (m[f] / base[f] - 1.0) if base[f] else 0.0 for f in FIGS} for c, m in mean.items()}
    return {"load": load, "mean": mean, "change_pct": change}


def show_combined(res: dict[str, Any], frac: float) -> None:
    print(f"\npaper farm, offered load {res['load']}, {frac:.0%} interactive (means of the streams)")
    print(
        f"{'configuration':22} {'throughput':>16} {'makespan':>16} {'mean wait':>16} {'wait inter.':>12} "
        f"{'wait batch':>11} {'migr.':>6} {'preempt.':>8}"
    )
    for c, m in res["mean"].items():
        ch = res["change_pct"][c]
        cells = [f"{m[f]:9,.1f} {ch[f]:+5.1f}%" for f in ("throughput_jobs_h", "makespan_s", "mean_wait_s")]
        print(
            f"{c:22} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} {m['mean_wait_interactive_s']:12,.1f} "
            f"{m['mean_wait_batch_s']:11,.1f} {m['migrations']:6.1f} {m['preemptions']:8.1f}"
        )


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
    parser.add_argument("--big-farm", default="", help="the big farm's own sub-cluster file instead of --big-scale")
    parser.add_argument("--big-seeds", default="", help="seeds of the big run (default: the first of --seeds)")
    parser.add_argument("--big-only", action="store_true", help="skip the paper-farm loads, run the big farm only")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "remap" / "reproduction.png"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--vjob", type=float, default=None, metavar="FRAC", help="vjob policy + remapping instead")
    args = parser.parse_args()

    farm = load_farm(args.farm)
    seeds = [int(s) for s in args.seeds.split(",")]
    params = RemapParams()
    if args.vjob is not None:
        out = [combined(farm, args.jobs, seeds, float(x), params, args.vjob) for x in args.loads.split(",")]
        for res in out:
            show_combined(res, args.vjob)
        by_load = {
            str(r["load"]): {c: {f: round(v, 1) for f, v in m.items()} for c, m in r["mean"].items()} for r in out
        }
        print(
            json.dumps(
                {"bench": "remap_vjob", "jobs": args.jobs, "seeds": seeds, "interactive": args.vjob, "by_load": by_load}
            )
        )
        return
    if args.big_only:
        print(
            json.dumps(
                {"bench": "remap_big", "big": big_run(args, farm, seeds, float(args.loads.split(",")[0]), params)}
            )
        )
        return
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
    if args.big_scale or args.big_farm:
        doc["big"] = big_run(args, farm, seeds, head["load"], params)
    print(json.dumps(doc))


def big_run(args: argparse.Namespace, farm: Farm, seeds: list[int], load: float, params: RemapParams) -> dict[str, Any]:
    """The farm at scale: its own file (e.g. 1,056 nodes, not a multiple of the paper's 10) or
    --big-scale times the paper's; one seed unless --big-seeds, since a 100,000-job replay with
    remapping takes many minutes."""
    big = load_farm(args.big_farm) if args.big_farm else farm.scaled(args.big_scale)
    nodes = sum(s.nodes for s in big.subclusters)
    big_seeds = [int(x) for x in args.big_seeds.split(",")] if args.big_seeds else seeds[:1]
    res = run(big, args.big_jobs, big_seeds, load, params, f"farm of {nodes} nodes, {args.big_jobs} jobs")
    show(res, f"farm of {nodes} nodes")
    return {
        "nodes": nodes,
        "jobs": args.big_jobs,
        "seeds": big_seeds,
        "load": load,
        "seconds": res["seconds"],
        "decisions": res["decisions"],
        "mean": res["mean"],
        **{k: round(v, 1) for k, v in res["change_pct"].items()},
    }


if __name__ == "__main__":
    main()
