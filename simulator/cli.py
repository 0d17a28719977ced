"""`vjob trace generate|info` and `vjob simulate` (one run, or a `--sweep` grid on all cores).

Why the options mirror the UBIS paper: a site admin reproduces the paper's set-up with the same
words (interactive fraction, mean size, cap, OS count) before trying their own trace and
weights. Fractions and caps are numbers between 0 and 1; sizes are in nodes.
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

from preemption.scheduling.policies import check_policy
from simulator.lublin import generate
from simulator.setup import UbisSetup, apply
from simulator.sweep import write_sweep
from simulator.swf import open_text, read_swf, summarise, write_swf
from simulator.torque_accounting import read_torque_accounting
from vjob.cli import load_config
from vjob.config import PriorityConfig
from vjob.errors import InputError


def register(sub: Any) -> None:
    tr = sub.add_parser("trace", help="workload traces: generate (Lublin-Feitelson), summarise")
    tsub = tr.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    gen = tsub.add_parser("generate", help="write a Lublin-Feitelson model trace as SWF")
    gen.add_argument("--nodes", type=int, required=True, help="machine size in nodes")
    gen.add_argument("--jobs", type=int, required=True)
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--load", type=float, default=None, help="rescale arrivals to this offered load (e.g. 0.85)")
    gen.add_argument("-o", "--output", required=True, help="SWF file to write ('-' = stdout; .gz compresses)")
    gen.set_defaults(func=_generate)
    info = tsub.add_parser("info", help="jobs, span, size and runtime distributions, offered load")
    info.add_argument("file", help="SWF (plain or .gz) or Torque accounting (file, directory or .tar.gz)")
    info.add_argument("--nodes", type=int, default=None, help="machine size for the offered load")
    info.add_argument("--lenient", action="store_true", help="skip and count malformed lines")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_info)

    sim = sub.add_parser("simulate", help="replay a trace under a scheduling policy (fcfs-easy, mms, mms-block, ubis)")
    sim.add_argument("--trace", required=True, help="SWF (plain or .gz) or Torque accounting log")
    sim.add_argument("--nodes", type=int, required=True)
    sim.add_argument("--policy", default="ubis", help="fcfs-easy, mms, mms-block or ubis (comma list with --sweep)")
    sim.add_argument("--interactive-frac", default="0", help="share of all jobs injected as interactive (0..1)")
    sim.add_argument("--interactive-mean-size", default="100", help="Poisson mean of interactive sizes (nodes)")
    sim.add_argument("--interactive-cap", default=None, help="share of nodes interactive jobs may hold (0..1)")
    sim.add_argument("--os-count", type=int, default=2, help="OS images (jobs draw one with equal shares)")
    sim.add_argument("--os-from-properties", action="store_true", help="job OS from the trace's node type")
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--max-jobs", type=int, default=None, help="replay only the first N trace jobs")
    sim.add_argument("--os-swap-s", type=float, default=300.0, help="seconds for a node to switch OS image")
    sim.add_argument("--bandwidth-mb-s", type=float, default=500.0, help="checkpoint write/read MB/s per node")
    sim.add_argument("--memory-mb", type=int, default=4096, help="VM memory per node when the trace has none")
    sim.add_argument("--backfill-depth", type=int, default=500, help="queued jobs looked at per backfill pass")
    sim.add_argument(
        "--priority-refresh",
        type=float,
        default=0.0,
        help="ubis: reuse priorities for this many simulated seconds (0 = exact; > 0 approximates, faster)",
    )
    sim.add_argument("--lenient", action="store_true", help="skip and count malformed trace lines")
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--sweep", action="store_true", help="run the grid policies × fractions × sizes × caps")
    sim.add_argument("--workers", type=int, default=None, help="processes for --sweep (default: all cores)")
    sim.add_argument("--out", required=True, help="output directory")
    sim.set_defaults(func=_simulate)


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


def _generate(args: argparse.Namespace) -> int:
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


def _info(args: argparse.Namespace) -> int:
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


def _simulate(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    policies = [check_policy(p.strip()) for p in args.policy.split(",")]
    fracs = _floats(args.interactive_frac, "--interactive-frac", 0.0, 0.99)
    sizes = _floats(args.interactive_mean_size, "--interactive-mean-size", 1.0, None)
    caps = (
        _floats(args.interactive_cap, "--interactive-cap", 0.0, 1.0)
        if args.interactive_cap is not None
        else [cfg.priority.interactive_cap]
    )
    grid = list(itertools.product(policies, fracs, sizes, caps))
    if len(grid) > 1 and not args.sweep:
        raise InputError("several values given for a parameter: add --sweep to run the grid")
    out = Path(args.out)
    base = {
        "trace": args.trace,
        "nodes": args.nodes,
        "os_count": args.os_count,
        "os_from_properties": args.os_from_properties,
        "seed": args.seed,
        "max_jobs": args.max_jobs,
        "os_swap_s": args.os_swap_s,
        "bandwidth_mb_s": args.bandwidth_mb_s,
        "memory_mb": args.memory_mb,
        "backfill_depth": args.backfill_depth,
        "priority_refresh_s": args.priority_refresh,
        "lenient": args.lenient,
        "plots": not args.no_plots,
        "priority": cfg.priority.model_dump(),
    }
    if not args.sweep:
        policy, frac, size, cap = grid[0]
        doc = run_one(base | {"policy": policy, "frac": frac, "size": size, "cap": cap, "out": str(out)}, show=True)
        _print_table(doc)
        return 0
    return _sweep(base, grid, out, args.workers)


def run_one(spec: dict[str, Any], show: bool = False) -> dict[str, Any]:
    """One simulation from a plain dict (picklable, so --sweep can run it in a worker)."""
    # heavy: numba (the engine compiles its passes on import; `vjob trace` never needs it)
    from simulator.engine import ClusterModel, simulate
    from simulator.metrics import write_all  # heavy: numba (metrics reads engine results)

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
    priority = PriorityConfig.model_validate(spec["priority"] | {"interactive_cap": spec["cap"]})
    started = time.perf_counter()
    if show:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn(f"{spec['policy']}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
            TimeElapsedColumn(), transient=True,
        ) as bar:  # fmt: skip
            task = bar.add_task("simulate", total=len(jobs))
            result = simulate(jobs, model, spec["policy"], priority, lambda d, n: bar.update(task, completed=d))
    else:
        result = simulate(jobs, model, spec["policy"], priority)
    seconds = time.perf_counter() - started
    extra = {
        "trace": spec["trace"],
        "interactive_frac": spec["frac"],
        "interactive_mean_size": spec["size"],
        "interactive_cap": spec["cap"],
        "seed": spec["seed"],
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

    from simulator.metrics import table_rows  # heavy: numba (simulator.metrics imports the engine)

    table = Table(title="simulation", show_header=False)
    for key, value in table_rows(doc):
        table.add_row(key, value)
    Console().print(table)


def _sweep(base: dict[str, Any], grid: list[tuple[str, float, float, float]], out: Path, workers: int | None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out.mkdir(parents=True, exist_ok=True)
    specs = []
    for policy, frac, size, cap in grid:
        name = f"{policy}_f{frac:g}_s{size:g}_c{cap:g}"
        specs.append(base | {"policy": policy, "frac": frac, "size": size, "cap": cap, "out": str(out / name)})
    docs: list[dict[str, Any]] = []
    workers = workers or os.cpu_count() or 1
    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("sweep", total=len(specs))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run_one, spec) for spec in specs]
            for fut in as_completed(futures):
                docs.append(fut.result())
                bar.advance(task)
    write_sweep(docs, out)
    print(f"{out}: {len(docs)} runs; sweep.csv, sweep.json and comparison figures written", file=sys.stderr)
    return 0
