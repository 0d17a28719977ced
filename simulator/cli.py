"""`vjob trace generate|info` and `vjob simulate` (one run, or a `--sweep` grid on all cores).

Why the options mirror the UBIS paper: a site admin reproduces the paper's set-up with the same
words (interactive fraction, mean size, cap, OS count) before trying their own trace and
weights. Fractions and caps are numbers between 0 and 1; sizes are in nodes. The options
themselves are declared in simulator.cli_args, which imports this module only when a command runs.
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from preemption.scheduling.policies import policy_named
from simulator import deadline_cli
from simulator.lublin import generate
from simulator.metrics import table_rows, write_all
from simulator.remap_cli import simulate_remap
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from simulator.sweep import write_sweep
from simulator.swf import open_text, read_swf, summarise, write_swf
from simulator.torque_accounting import read_torque_accounting
from simulator.tune.space import weight_variants, weights_label
from vjob.cli import load_config, require_extra
from vjob.config import PriorityConfig, SchedulingConfig
from vjob.errors import InputError
from vjob.progress import Progress


# -- trace ---------------------------------------------------------------------------------
def read_trace(path: str, *, lenient: bool = False) -> Any:
    """A Workload from an SWF file or a Torque accounting log (told apart by content)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"--trace {path}: no such file or directory")
    if p.is_dir() or p.name.endswith((".tar.gz", ".tgz", ".tar")) or _looks_like_torque(p):
        return read_torque_accounting(p, lenient=lenient)
    return read_swf(p, lenient=lenient)


def _looks_like_torque(p: Path) -> bool:
    try:
        with open_text(p) as fh:
            for line in itertools.islice(fh, 50):
                if line.strip() and not line.startswith(";"):
                    return re.match(r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d;[A-Z];", line) is not None
    except UnicodeDecodeError:
        return False
    return False


def generate_cmd(args: argparse.Namespace) -> int:
    workload = generate(args.nodes, args.jobs, args.seed, load=args.load)
    if args.output == "-":
        write_swf(workload, sys.stdout)
        return 0
    out = Path(args.output)
    buf = io.StringIO()
    write_swf(workload, buf)
    data = buf.getvalue().encode()
    try:
        out.write_bytes(gzip.compress(data) if out.name.endswith(".gz") else data)
    except OSError as exc:
        raise InputError(f"-o {out}: cannot write: {exc.strerror}") from None
    print(f"{out}: {len(workload)} jobs for {args.nodes} nodes (seed {args.seed})", file=sys.stderr)
    return 0


def info_cmd(args: argparse.Namespace) -> int:
    info = summarise(read_trace(args.file, lenient=args.lenient), args.nodes)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(info["source"]), show_header=False)
    for key, value in info.items():
        if key == "source":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
        table.add_row(key, _fmt(value))
    Console().print(table)
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


# -- simulate ----------------------------------------------------------------------------------
def _floats(text: str, option: str, low: float, high: float | None) -> list[float]:
    values = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            raise InputError(f"{option} = {part!r}: not a number") from None
        if v < low or (high is not None and v > high):
            allowed = f"{low:g}..{high:g}" if high is not None else f">= {low:g}"
            raise InputError(f"{option} = {v:g}: must be in {allowed}")
        values.append(v)
    return values


def _seeds(text: str | None, seed: int) -> list[int]:
    """--seeds as integers (default: the one --seed)."""
    if text is None:
        return [seed]
    values = []
    for part in str(text).split(","):
        if not re.fullmatch(r"\s*-?\d{1,18}\s*", part):
            raise InputError(f"--seeds = {part[:40]!r}: not an integer")
        values.append(int(part))
    return values


def simulate_cmd(args: argparse.Namespace) -> int:
    if args.subclusters:
        return simulate_remap(args, read_trace(args.trace, lenient=args.lenient), _seeds(args.seeds, args.seed))
    if args.nodes is None:
        raise InputError("--nodes: required (the machine size in nodes), unless --subclusters gives the farm")
    if deadline_cli.wanted(args):  # the deadline replay (docs/deadline.md): no numba needed
        require_extra("vjob simulate", *(() if args.no_plots else ("matplotlib",)))
        return deadline_cli.run(args, load_config(args), read_trace)
    require_extra("vjob simulate", "numba", *(() if args.no_plots and not args.sweep else ("matplotlib",)))
    cfg = load_config(args)
    sched = cfg.scheduling.model_dump()
    if args.max_preemptions is not None:
        sched["max_preemptions"] = args.max_preemptions
    if args.head_slack_s is not None:
        sched["head_slack_s"] = args.head_slack_s
    try:
        SchedulingConfig.model_validate(sched)
    except ValueError as exc:
        raise InputError(f"--max-preemptions / --head-slack-s: {str(exc).splitlines()[-1].strip()}") from None
    policies = [policy_named(p.strip()).name for p in (args.policy or cfg.scheduling.policy).split(",")]
    seeds = _seeds(args.seeds, args.seed)
    fracs = _floats(args.interactive_frac, "--interactive-frac", 0.0, 0.99)
    sizes = _floats(args.interactive_mean_size, "--interactive-mean-size", 1.0, None)
    caps = (
        _floats(args.interactive_cap, "--interactive-cap", 0.0, 1.0)
        if args.interactive_cap is not None
        else [cfg.priority.interactive_cap]
    )
    variants = weight_variants(args.weight)
    grid = list(itertools.product(policies, fracs, sizes, caps, seeds, variants))
    if len(grid) > 1 and not args.sweep:
        raise InputError("several values given for a parameter: add --sweep to run the grid")
    out = Path(args.out)
    base = {
        "trace": args.trace,
        "nodes": args.nodes,
        "os_count": args.os_count,
        "os_from_properties": args.os_from_properties,
        "max_jobs": args.max_jobs,
        "os_swap_s": args.os_swap_s,
        "bandwidth_mb_s": args.bandwidth_mb_s,
        "memory_mb": args.memory_mb,
        "backfill_depth": args.backfill_depth,
        "priority_refresh_s": args.priority_refresh,
        "lenient": args.lenient,
        "plots": not args.no_plots,
        "priority": cfg.priority.model_dump(),
        "scheduling": sched,
        "cap_mode": args.cap_mode,
    }
    if not args.sweep:
        policy, frac, size, cap, seed, weights = grid[0]
        spec = {"policy": policy, "frac": frac, "size": size, "cap": cap, "seed": seed, "out": str(out)}
        spec["weights"] = weights
        doc = run_one(base | spec, show=True)
        if args.json:
            print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        else:
            _print_table(doc)
        return 0
    return _sweep(base, grid, out, args.workers)


def run_one(spec: dict[str, Any], show: bool = False) -> dict[str, Any]:
    """One simulation from a plain dict (picklable, so --sweep can run it in a worker)."""
    # heavy: numba (the engine compiles its passes on import; `vjob trace` never needs it)
    from simulator.engine import simulate

    workload = _cached_trace(spec["trace"], spec["lenient"])
    if spec["max_jobs"]:
        workload = workload.take(slice(0, spec["max_jobs"]))
    setup = UbisSetup(
        interactive_frac=spec["frac"],
        interactive_mean_size=spec["size"],
        os_count=spec["os_count"],
        os_from_properties=spec["os_from_properties"],
        seed=spec["seed"],
    )
    jobs = apply(workload, spec["nodes"], setup)
    model = ClusterModel(
        nodes=spec["nodes"],
        os_count=spec["os_count"],
        os_swap_s=spec["os_swap_s"],
        bandwidth_mb_s=spec["bandwidth_mb_s"],
        memory_mb_per_node=spec["memory_mb"],
        backfill_depth=spec["backfill_depth"] if spec["backfill_depth"] > 0 else None,
        priority_refresh_s=spec["priority_refresh_s"],
    )
    weights = spec.get("weights") or {}
    priority = PriorityConfig.model_validate(
        spec["priority"] | {"interactive_cap": spec["cap"], "weights": spec["priority"]["weights"] | weights}
    )
    scheduling = SchedulingConfig.model_validate(spec.get("scheduling", {}))
    cap_mode = spec.get("cap_mode", "preempt")
    started = time.perf_counter()
    if show:  # a live bar on a terminal, a plain line every 5 % otherwise (vjob.progress)
        with Progress(len(jobs), f"simulate {spec['policy']}") as progress:

            def advance(done: int, total: int) -> None:
                progress.advance(done - progress.done)

            result = simulate(jobs, model, spec["policy"], priority, advance, scheduling, cap_mode)
    else:
        result = simulate(jobs, model, spec["policy"], priority, None, scheduling, cap_mode)
    seconds = time.perf_counter() - started
    extra = {
        "trace": spec["trace"],
        "interactive_frac": spec["frac"],
        "interactive_mean_size": spec["size"],
        "interactive_cap": spec["cap"],
        "cap_mode": cap_mode,
        "scheduling": scheduling.model_dump(),
        "seed": spec["seed"],
        "weights": weights_label(weights),
        "wall_seconds": seconds,
    }
    return write_all(result, Path(spec["out"]), extra, plots=spec["plots"])


_TRACES: dict[tuple[str, bool], Any] = {}


def _cached_trace(path: str, lenient: bool) -> Any:
    key = (path, lenient)
    if key not in _TRACES:
        _TRACES[key] = read_trace(path, lenient=lenient)
    return _TRACES[key]


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulation", show_header=False)
    for key, value in table_rows(doc):
        table.add_row(key, value)
    Console().print(table)


def _sweep(
    base: dict[str, Any],
    grid: list[tuple[str, float, float, float, int, dict[str, float]]],
    out: Path,
    workers: int | None,
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    specs = []
    several = len({cell[4] for cell in grid}) > 1
    for policy, frac, size, cap, seed, weights in grid:
        name = f"{policy}_f{frac:g}_s{size:g}_c{cap:g}" + (f"_seed{seed}" if several else "")
        name += "".join(f"_{w.replace('=', '')}" for w in weights_label(weights).split())
        spec = {"policy": policy, "frac": frac, "size": size, "cap": cap, "seed": seed, "out": str(out / name)}
        specs.append(base | spec | {"weights": weights})
    docs: list[dict[str, Any]] = []
    workers = workers or os.cpu_count() or 1
    with Progress(len(specs), "sweep") as progress, ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_one, spec) for spec in specs]
        for fut in as_completed(futures):
            docs.append(fut.result())
            progress.advance()
    write_sweep(docs, out)
    print(f"{out}: {len(docs)} runs; sweep.csv, sweep.json and comparison figures written", file=sys.stderr)
    return 0
