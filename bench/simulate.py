"""Benchmark: one `ubis` replay of the UBIS set-up (100,000 jobs, 1,056 nodes, 20 % interactive).

Prints the run's figures and, as a ratio measured in the same run, how much slower ubis is
than fcfs-easy on the same workload (the price of priorities and preemption). The last line is
one JSON object: {"bench": "simulate", "jobs", "nodes", "policy", "seconds", "events_per_s", ...}.
`--policy vjob` also replays the same workload with the former vjob pass, which sorted the
whole queue at every pass (`Rules.full_sort_vjob`), and reports how many times faster the
compiled order is (`full_sort_over_compiled`) and whether both schedules are the same
(`same_schedule`, SHA-256 of every start, end and segment). `--priority-refresh S` measures
the approximate replay that reuses priorities for S simulated seconds (docs/simulator.md,
Speed); the default, 0, is the exact replay.

    .venv/bin/python bench/simulate.py [--jobs 100000] [--nodes 1056] [--no-baseline] [--priority-refresh 0]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from simulator.engine import Simulation, simulate
from simulator.lublin import generate
from simulator.metrics import schedule_digest, summary
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from vjob.config import PriorityConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000, help="batch jobs from the Lublin model")
    parser.add_argument("--nodes", type=int, default=1056)
    parser.add_argument("--load", type=float, default=0.85, help="offered load of the batch trace")
    parser.add_argument("--interactive-frac", type=float, default=0.2)
    parser.add_argument("--no-baseline", action="store_true", help="skip the fcfs-easy run (no ratio)")
    parser.add_argument("--priority-refresh", type=float, default=0.0, help="ubis: seconds priorities are reused")
    parser.add_argument("--policy", default="ubis", help="policy measured (ubis, the slowest, by default; or vjob...)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    base = generate(args.nodes, args.jobs, seed=1, load=args.load)
    workload = apply(base, args.nodes, UbisSetup(interactive_frac=args.interactive_frac, interactive_mean_size=100))
    prepare_s = time.perf_counter() - t0
    model = ClusterModel(nodes=args.nodes, priority_refresh_s=args.priority_refresh)
    prio = PriorityConfig(interactive_cap=0.15)

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    result = simulate(workload, model, args.policy, prio)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    doc = summary(result)
    inter = int(workload.interactive.sum())
    print(f"workload: {len(workload)} jobs ({inter} interactive) prepared in {prepare_s:.2f} s")
    print(
        f"{args.policy}: {seconds:.2f} s wall, {cpu:.2f} s CPU, {result.events} events, "
        f"{result.passes} scheduling passes"
    )
    print(f"  utilisation {doc['utilization']:.3f}, preemptions {doc['preemptions']}")
    print(f"  machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared)")
    figures = {
        "bench": "simulate",
        "jobs": len(workload),
        "nodes": args.nodes,
        "policy": args.policy,
        "priority_refresh_s": args.priority_refresh,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "events_per_s": round(result.events / seconds),
        "passes": result.passes,
        "preemptions": result.preemptions,
        "load_average": round(os.getloadavg()[0], 1),
    }
    if args.policy == "vjob":
        sim = Simulation(workload, model, "vjob", prio)
        sim.rules.full_sort_vjob = True
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        before = sim.run()
        full_s = time.perf_counter() - t0
        full_cpu = time.process_time() - cpu0
        same = schedule_digest(before) == schedule_digest(result)
        print(f"vjob with the whole queue sorted at each pass (before): {full_s:.2f} s wall, {full_cpu:.2f} s CPU")
        print(f"  the same schedule: {same} (SHA-256 {schedule_digest(result)[:16]}...)")
        figures["full_sort_seconds"] = round(full_s, 2)
        figures["full_sort_cpu_seconds"] = round(full_cpu, 2)
        figures["full_sort_over_compiled"] = round(full_s / seconds, 2)
        figures["full_sort_cpu_over_compiled"] = round(full_cpu / cpu, 2)
        figures["same_schedule"] = same
        figures["schedule_sha256"] = schedule_digest(result)
    if not args.no_baseline:
        t0 = time.perf_counter()
        simulate(workload, model, "fcfs-easy", prio)
        base_s = time.perf_counter() - t0
        print(f"fcfs-easy on the same workload: {base_s:.2f} s wall")
        figures["fcfs_easy_seconds"] = round(base_s, 2)
        figures[f"{args.policy}_over_fcfs_easy"] = round(seconds / base_s, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
