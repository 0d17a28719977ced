"""Benchmark: context-switch plans chosen by CP-SAT against first-fit decreasing (Entropy section 5.1).

Instances as in the paper: 200 nodes of 2 CPUs and 4 GB; vjobs of 9 or 18 VMs of 256, 512,
1024 or 2048 MB, each needing a whole CPU when it computes (half of them here); every vjob
starts waiting, running or sleeping at random, the running ones placed so that memory fits
(CPUs may be overbooked). The FCFS Running Job Selection decision module (queue in random
order) gives the target state of every vjob. For each instance, the same target is planned
twice: with the FFD placement (the paper's baseline) and with the CP-SAT optimiser; both plans
are validated. Per VM count the benchmark reports the mean cost reduction
1 - cost(CP-SAT) / cost(FFD) and the wall time of the CP-SAT planning (placement, sequencing,
validation). Beside the reduction, the gap to the bound: the cost no plan can go below
(preemption.planner.bound.lower_bound, proven), in points of the FFD cost; and, for comparison
with earlier runs, the gap to the simple bound (the suspends the target forces plus every
resume made locally), which ignores that a resume onto a full node must wait or go remote.

Then large instances, 1,000 nodes and 5,000 VMs, planned as `vjob plan` does: no starting
placement from the decision module, the time limit a wall-clock budget for everything. FFD
cannot pack those nearly full clusters, so their baseline is the decision module's placement.

The figures are measured in this run, on a machine shared with other work: times are wall
clock and grow with the load (the load average is printed beside them). The last line of
output is one JSON object.

    .venv/bin/python bench/planner.py [--samples 30] [--sizes 100,200,300,400,500]
        [--time-limit 10] [--large-samples 5] [--large-time-limit 30] [--plot out/bench/planner.png]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from preemption.decisions import fcfs_selection
from preemption.planner import Instance, make_plan, validate
from preemption.planner.bound import lower_bound
from preemption.planner.placement import first_fit_decreasing
from preemption.planner.workload import generate
from vjob import log
from vjob.model import VJobState


def one(raw: Instance, seed: int, time_limit: float, workers: int, *, as_cli: bool = False) -> dict[str, float]:
    """Plan one instance with FFD and CP-SAT; returns the costs, the reduction and the CP-SAT time.

    `as_cli`: CP-SAT gets no starting placement from the decision module, as from `vjob plan`.
    """
    queue = sorted(raw.vjobs())
    random.Random(seed).shuffle(queue)
    sel = fcfs_selection(raw, queue)
    inst = raw.with_target(sel.target)
    # FFD may fail to pack a nearly full cluster; the baseline is then the decision's placement.
    ffd_packs = not first_fit_decreasing(inst.nodes, inst.to_run())[1]
    ffd = make_plan(inst, optimizer="ffd", hint=sel.placement)
    validate(inst, ffd)
    t0 = time.perf_counter()
    cp = make_plan(
        inst, optimizer="cpsat", time_limit_s=time_limit, workers=workers, hint=None if as_cli else sel.placement
    )
    seconds = time.perf_counter() - t0
    validate(inst, cp)
    reduction = 1.0 - cp.cost / ffd.cost if ffd.cost else 0.0
    # The simple bound (earlier runs): forced suspends plus every resume made locally.
    simple = sum(
        v.mem
        for v in inst.vms
        if (v.state is VJobState.RUNNING and inst.target_of(v) is VJobState.SLEEPING)
        or (v.state is VJobState.SLEEPING and inst.target_of(v) is VJobState.RUNNING)
    )
    t0 = time.perf_counter()
    bound = lower_bound(inst)
    bound_seconds = time.perf_counter() - t0
    if bound > cp.cost:
        raise AssertionError(f"seed {seed}: the lower bound {bound} exceeds a valid plan's cost {cp.cost}")
    # The same plan before the improvement phase (pull_forward), for a before/after in one run.
    before = int(cp.stats.get("cost_before_pull", cp.cost))
    return {
        "ffd_cost": ffd.cost,
        "cpsat_cost": cp.cost,
        "reduction_before_phase": 1.0 - before / ffd.cost if ffd.cost else 0.0,
        "gap_points_before_phase": 100.0 * (before - bound) / ffd.cost if ffd.cost else 0.0,
        "phase_seconds": float(cp.stats.get("pull_seconds", 0.0)),
        "reduction": reduction,
        "best_possible": 1.0 - bound / ffd.cost if ffd.cost else 0.0,
        "gap_points": 100.0 * (cp.cost - bound) / ffd.cost if ffd.cost else 0.0,
        "simple_gap_points": 100.0 * (cp.cost - simple) / ffd.cost if ffd.cost else 0.0,
        "bound_seconds": bound_seconds,
        "ffd_packs": float(ffd_packs),
        "seconds": seconds,
        "pools_ffd": len(ffd.pools),
        "pools_cpsat": len(cp.pools),
        "fallback": float(any("falling back" in w for w in cp.warnings)),
        "to_run": len(inst.to_run()),
    }


def experiment(seeds: int, progress: Progress) -> dict[str, object]:
    """The paper's cluster experiment, simulated (preemption.planner.experiment): 8 vjobs of 9
    VMs on 11 nodes of 2 CPUs / 4 GB, FCFS static allocation against the control loop."""
    from preemption.planner.experiment import simulate, workload

    task = progress.add_task("cluster experiment", total=seeds)
    runs = []
    for seed in range(seeds):
        jobs = workload(seed)
        fcfs, entropy = simulate("fcfs", jobs), simulate("entropy", jobs)
        runs.append((fcfs, entropy))
        progress.advance(task)
    switch_s = [s for _f, e in runs for s in e.switch_seconds]
    return {
        "seeds": seeds,
        "fcfs_min": [round(f.completion_s / 60, 1) for f, _e in runs],
        "entropy_min": [round(e.completion_s / 60, 1) for _f, e in runs],
        "mean_reduction": round(statistics.mean(1 - e.completion_s / f.completion_s for f, e in runs), 4),
        "fcfs_cpu_busy": round(statistics.mean(f.cpu_busy_share for f, _e in runs), 4),
        "entropy_cpu_busy": round(statistics.mean(e.cpu_busy_share for _f, e in runs), 4),
        "switches_per_run": round(statistics.mean(e.switches for _f, e in runs), 1),
        "mean_switch_s": round(statistics.mean(switch_s), 1) if switch_s else 0.0,
        "max_switch_s": max(switch_s, default=0.0),
        "actions": {k: sum(e.actions.get(k, 0) for _f, e in runs) for k in ("run", "suspend", "resume", "migrate")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--sizes", default="100,200,300,400,500")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--large-nodes", type=int, default=1000)
    parser.add_argument("--large-vms", type=int, default=5000)
    parser.add_argument("--large-time-limit", type=float, default=30.0)
    parser.add_argument("--large-samples", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--plot", default="out/bench/planner.png")
    parser.add_argument("--experiment-seeds", type=int, default=5, help="runs of the simulated cluster experiment")
    parser.add_argument("--experiment-only", action="store_true", help="only the simulated cluster experiment")
    args = parser.parse_args()
    log.configure("error", "json")
    console = Console(stderr=True)
    if args.experiment_only:
        with Progress(console=console) as progress:
            figures = experiment(args.experiment_seeds, progress)
        print(
            f"cluster experiment (simulated), completion of the set: FCFS {figures['fcfs_min']} min, "
            f"Entropy loop {figures['entropy_min']} min"
        )
        print(json.dumps({"bench": "planner", "experiment": figures}))
        return
    sizes = [int(s) for s in args.sizes.split(",")]

    load_before = os.getloadavg()
    results: dict[int, list[dict[str, float]]] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("planning", total=len(sizes) * args.samples + args.large_samples)
        for n in sizes:
            results[n] = []
            for seed in range(args.samples):
                raw = generate(n, n_nodes=args.nodes, seed=seed)
                results[n].append(one(raw, seed, args.time_limit, args.workers))
                progress.advance(task)
        larges = []
        for seed in range(1, args.large_samples + 1):
            raw = generate(args.large_vms, n_nodes=args.large_nodes, seed=seed)
            larges.append(one(raw, seed, args.large_time_limit, args.workers, as_cli=True))
            progress.advance(task)
        figures = experiment(args.experiment_seeds, progress)
    load_after = os.getloadavg()
    large = {k: statistics.mean(r[k] for r in larges) for k in larges[0]}
    large["ffd_packs"] = float(all(r["ffd_packs"] for r in larges))

    table = Table(title=f"CP-SAT vs FFD plans, {args.nodes} nodes (2 CPU, 4 GB), {args.samples} samples per size")
    for col in (
        "VMs",
        "VMs to run",
        "FFD cost",
        "CP-SAT cost",
        "reduction",
        "min..max",
        "bound",
        "gap pts",
        "(simple)",
        "s/instance",
        "max s",
        "pools FFD/CP",
    ):
        table.add_column(col, justify="right")
    rows = []
    for n, rs in results.items():
        row = {
            "vms": n,
            "to_run": statistics.mean(r["to_run"] for r in rs),
            "ffd_cost": statistics.mean(r["ffd_cost"] for r in rs),
            "cpsat_cost": statistics.mean(r["cpsat_cost"] for r in rs),
            "mean_cost_reduction": statistics.mean(r["reduction"] for r in rs),
            "best_possible": statistics.mean(r["best_possible"] for r in rs),
            "gap_points": statistics.mean(r["gap_points"] for r in rs),
            "max_gap_points": max(r["gap_points"] for r in rs),
            "simple_gap_points": statistics.mean(r["simple_gap_points"] for r in rs),
            "bound_seconds": statistics.mean(r["bound_seconds"] for r in rs),
            "min_reduction": min(r["reduction"] for r in rs),
            "max_reduction": max(r["reduction"] for r in rs),
            "mean_seconds": statistics.mean(r["seconds"] for r in rs),
            "max_seconds": max(r["seconds"] for r in rs),
            "pools_ffd": statistics.mean(r["pools_ffd"] for r in rs),
            "pools_cpsat": statistics.mean(r["pools_cpsat"] for r in rs),
            "fallbacks": int(sum(r["fallback"] for r in rs)),
        }
        rows.append(row)
        table.add_row(
            str(n),
            f"{row['to_run']:.0f}",
            f"{row['ffd_cost']:,.0f}",
            f"{row['cpsat_cost']:,.0f}",
            f"{row['mean_cost_reduction']:.1%}",
            f"{row['min_reduction']:.0%}..{row['max_reduction']:.0%}",
            f"{row['best_possible']:.1%}",
            f"{row['gap_points']:.2f}",
            f"{row['simple_gap_points']:.2f}",
            f"{row['mean_seconds']:.2f}",
            f"{row['max_seconds']:.2f}",
            f"{row['pools_ffd']:.1f}/{row['pools_cpsat']:.1f}",
        )
    table.add_row(
        f"{args.large_vms} ({args.large_nodes} nodes, {len(larges)} samples)",
        f"{large['to_run']:.0f}",
        f"{large['ffd_cost']:,.0f}",
        f"{large['cpsat_cost']:,.0f}",
        f"{large['reduction']:.1%}" + ("" if large["ffd_packs"] else " *"),
        f"{min(r['reduction'] for r in larges):.0%}..{max(r['reduction'] for r in larges):.0%}",
        f"{large['best_possible']:.1%}",
        f"{large['gap_points']:.2f}",
        f"{large['simple_gap_points']:.2f}",
        f"{large['seconds']:.2f}",
        f"{max(r['seconds'] for r in larges):.2f}",
        f"{large['pools_ffd']:.1f}/{large['pools_cpsat']:.1f}",
    )
    Console(width=140).print(table)
    print("bound: the reduction no plan can beat (preemption.planner.bound, proven); gap pts: plan to bound;")
    print("(simple): gap to the earlier bound (forced suspends + every resume local, nothing else)")
    if not large["ffd_packs"]:
        print("*: FFD cannot pack (some of) the large instances; their baseline is the decision module's placement")
    print(f"large instances planned as `vjob plan` does (no starting placement), budget {args.large_time_limit:g} s")
    print(
        f"large instances before the improvement phase (same plans): {large['reduction_before_phase']:.1%} below "
        f"the baseline, {large['gap_points_before_phase']:.2f} points above the bound; the phase took "
        f"{large['phase_seconds']:.2f} s on average"
    )
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if args.samples < 30:
        print(f"note: {args.samples} samples per size (the paper used 30), to fit the time available")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["vms"] for r in rows]
        left.plot(xs, [r["ffd_cost"] for r in rows], "o-", label="FFD placement")
        left.plot(xs, [r["cpsat_cost"] for r in rows], "s-", label="CP-SAT placement")
        left.set_xlabel("VMs")
        left.set_ylabel("mean plan cost (Entropy model)")
        left.set_yscale("log")
        left.legend()
        right.plot(xs, [100 * r["mean_cost_reduction"] for r in rows], "o-", color="tab:green", label="CP-SAT")
        right.plot(xs, [100 * r["best_possible"] for r in rows], "k--", label="bound (no plan does better)")
        right.legend(loc="lower right")
        right.set_xlabel("VMs")
        right.set_ylabel("mean cost reduction vs FFD (%)")
        right.set_ylim(0, 100)
        fig.suptitle(f"Context-switch plans on {args.nodes} nodes ({args.samples} samples per size)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        print(f"plot: {path}")

    last = rows[-1]
    print(
        json.dumps(
            {
                "bench": "planner",
                "load_avg_1min": [round(load_before[0], 2), round(load_after[0], 2)],
                "nodes": args.nodes,
                "vms": last["vms"],
                "samples": args.samples,
                "time_limit_s": args.time_limit,
                "mean_cost_reduction": round(last["mean_cost_reduction"], 4),
                "worst_cost_reduction": round(last["min_reduction"], 4),
                "best_possible_reduction": round(last["best_possible"], 4),
                "mean_gap_points": round(last["gap_points"], 2),
                "max_gap_points": round(last["max_gap_points"], 2),
                "simple_gap_points": round(last["simple_gap_points"], 2),
                "bound_seconds": round(last["bound_seconds"], 3),
                "gap_points_per_size": {str(r["vms"]): round(r["gap_points"], 2) for r in rows},
                "gap_points_each": [round(r["gap_points"], 2) for r in results[last["vms"]]],
                "simple_gap_points_each": [round(r["simple_gap_points"], 2) for r in results[last["vms"]]],
                "simple_gap_points_per_size": {str(r["vms"]): round(r["simple_gap_points"], 2) for r in rows},
                "mean_seconds": round(last["mean_seconds"], 3),
                "max_seconds": round(last["max_seconds"], 3),
                "large_nodes": args.large_nodes,
                "large_vms": args.large_vms,
                "large_samples": len(larges),
                "large_time_limit_s": args.large_time_limit,
                "large_mean_seconds": round(large["seconds"], 3),
                "large_max_seconds": round(max(r["seconds"] for r in larges), 3),
                "large_mean_cost_reduction": round(large["reduction"], 4),
                "large_worst_cost_reduction": round(min(r["reduction"] for r in larges), 4),
                "large_best_possible_reduction": round(large["best_possible"], 4),
                "large_gap_points": round(large["gap_points"], 2),
                "large_gap_points_before_phase": round(large["gap_points_before_phase"], 2),
                "large_mean_cost_reduction_before_phase": round(large["reduction_before_phase"], 4),
                "large_phase_seconds": round(large["phase_seconds"], 3),
                "large_gap_points_each": [round(r["gap_points"], 2) for r in larges],
                "large_gap_points_before_phase_each": [round(r["gap_points_before_phase"], 2) for r in larges],
                "large_reduction_each": [round(r["reduction"], 4) for r in larges],
                "large_reduction_before_phase_each": [round(r["reduction_before_phase"], 4) for r in larges],
                "large_simple_gap_points": round(large["simple_gap_points"], 2),
                "large_ffd_packs": bool(large["ffd_packs"]),
                "large_fallbacks": int(sum(r["fallback"] for r in larges)),
                "per_size": {str(r["vms"]): round(r["mean_cost_reduction"], 4) for r in rows},
                "experiment": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
