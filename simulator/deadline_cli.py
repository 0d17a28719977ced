"""`vjob simulate --deadline-buffer B --admission none|static|adaptive|cdf [--vo-model FILE]
[--physical] [--deadline-from submit|start]`: the deadline replay of a trace (docs/deadline.md)
instead of the UBIS one.

Each trace job gets deadline = submit + (1 + B) × its requested time, one VM per processor on
distinct nodes (vjob's one VM per allocated node), a kind drawn from the seed. The thresholds'
parameters come from the configuration's [deadline] section (a training run writes them).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from preemption.deadline import VOModel
from simulator.deadline_engine import ADMISSIONS, Cluster, DeadlineSetup, simulate_deadline
from simulator.deadline_report import deadline_block, plot_threshold
from simulator.deadline_workload import trace_jobs
from vjob.errors import InputError
from vjob.progress import Progress


def add_arguments(sim: Any) -> None:
    sim.add_argument(
        "--deadline-buffer",
        metavar="FRACTION",
        type=float,
        default=None,
        help="deadline replay: deadline = submit + (1 + B) x requested time (share, e.g. 0.05)",
    )
    sim.add_argument(
        "--admission",
        metavar="RULE",
        default=None,
        help="deadline replay: x-factor threshold none, static, adaptive or cdf (comma list with --sweep)",
    )
    sim.add_argument(
        "--vo-model", metavar="FILE", default=None, help="deadline replay: VO model JSON (bench/vo_overhead.py output)"
    )
    sim.add_argument("--physical", action="store_true", help="deadline replay: no virtualisation overhead (alg_1)")
    sim.add_argument(
        "--deadline-action",
        default=None,
        choices=("cancel", "checkpoint"),
        help="deadline replay: a running job over X is cancelled or checkpointed (default: [deadline] action)",
    )
    sim.add_argument(
        "--deadline-from",
        metavar="EVENT",
        default=None,
        help="deadline replay: the buffer is counted from the job's submit (default) or its start on a node",
    )


def wanted(args: argparse.Namespace) -> bool:
    return (
        args.admission is not None
        or args.deadline_buffer is not None
        or args.physical
        or args.vo_model is not None
        or args.deadline_from is not None
    )


def run(args: argparse.Namespace, cfg: Any, read_trace: Any) -> int:
    """Run one deadline replay per admission (several only with --sweep) and write summary.json."""
    dl = cfg.deadline
    buffer = dl.buffer if args.deadline_buffer is None else args.deadline_buffer
    if not (math.isfinite(buffer) and 0 <= buffer <= 10):
        raise InputError(f"--deadline-buffer = {buffer}: must be in 0..10")
    admissions = [a.strip() for a in (args.admission or dl.admission).split(",")]
    for a in admissions:
        if a not in ADMISSIONS:
            raise InputError(f"--admission = {a!r}: must be one of {', '.join(ADMISSIONS)}")
    if len(admissions) > 1 and not args.sweep:
        raise InputError("several --admission values: add --sweep to run them all")
    if args.nodes < 1:
        raise InputError(f"--nodes = {args.nodes}: must be >= 1")
    vo = VOModel.load(args.vo_model) if args.vo_model else VOModel.default()
    workload = read_trace(args.trace, lenient=args.lenient)
    if args.max_jobs:
        workload = workload.take(slice(0, args.max_jobs))
    jobs = trace_jobs(workload, buffer=buffer, seed=args.seed, max_vms=args.nodes)
    cluster = Cluster(nodes=args.nodes, cores=1, mem_gb=1.0)
    base = DeadlineSetup(
        physical=args.physical,
        vo_managed=not args.physical,
        action=args.deadline_action or dl.action,
        static_x=dl.static_x,
        delta_x=dl.delta_x,
        target=dl.target_failure,
        x_min=dl.x_min,
        x_max=dl.x_max,
        probability=dl.cdf_probability,
        window=dl.window,
        seed=args.seed,
        deadline_from=args.deadline_from or "submit",
    )
    out = Path(args.out)
    docs = []
    results = []
    for a in admissions:
        setup = replace(base, name=("physical" if args.physical else a), admission=a)
        started = time.perf_counter()
        with Progress(len(jobs), f"deadline {a}") as progress:
            result = simulate_deadline(jobs, cluster, setup, vo, progress.advance)
        results.append(result)
        doc = {
            "trace": args.trace,
            "nodes": args.nodes,
            "jobs": len(jobs),
            "deadline_buffer": buffer,
            "deadline_from": base.deadline_from,
            "admission": a,
            "physical": args.physical,
            "vo_model": vo.source,
            "seed": args.seed,
            "wall_seconds": time.perf_counter() - started,
            "deadline": deadline_block(result),
        }
        where = out / a if len(admissions) > 1 else out
        where.mkdir(parents=True, exist_ok=True)
        (where / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
        if not args.no_plots:
            plot_threshold([result], where / "threshold.png", f"{Path(args.trace).name}: X and failure rate")
        docs.append(doc)
    for d in docs:
        b = d["deadline"]
        print(
            f"{d['admission']:9s} success {b['success_rate']:.3f}  miss {b['miss_rate']:.3f}  rejected {b['rejected']}"
            f"  cancelled {b['cancelled']}  checkpointed {b['checkpointed']}",
            file=sys.stderr,
        )
    return 0
