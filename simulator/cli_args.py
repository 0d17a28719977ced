"""`vjob trace` and `vjob simulate`: their arguments; the commands themselves are
simulator.cli, imported when one runs.

Why apart: simulator.cli imports the replay, the trace readers (the Torque one through the PBS
adapter and the store) and pydantic, about 0.8 s, and `vjob simulate --help` should cost none
of it (issue 36: every `--help` under 0.3 s).
"""

from __future__ import annotations

import argparse
from typing import Any

from simulator import deadline_cli


def register(sub: Any) -> None:
    """`vjob trace generate|info` and `vjob simulate`, their options in groups."""
    _register_trace(sub)
    sim = sub.add_parser(
        "simulate",
        help="replay a trace under a scheduling policy (vjob, ubis, mms, mms-block, fcfs-easy)",
        description="Replay a trace on a model cluster under a scheduling policy (the decision pass the agent "
        "runs), or a grid of them with --sweep. Writes summary.json, jobs.csv, segments.csv and plots; "
        "docs/simulator.md and docs/policy.md explain the figures.",
        epilog="example:\n  vjob simulate --trace lublin.swf --nodes 1056 --interactive-frac 0.2 "
        "--interactive-mean-size 100 --interactive-cap 0.15 --out run1\n"
        "  vjob simulate --sweep --trace lublin.swf --nodes 1056 --policy mms,ubis,vjob \\\n"
        "      --interactive-frac 0.1,0.2,0.3 --interactive-mean-size 50,100,150 --interactive-cap 0.05,0.15 "
        "--seeds 1,2,3 --no-plots --out grid",
    )
    sim.add_argument("--trace", metavar="FILE", required=True, help="SWF (plain or .gz) or Torque accounting log")
    sim.add_argument(
        "--nodes", metavar="N", type=int, default=None, help="machine size (nodes; not with --subclusters)"
    )
    _add_policy_options(sim)
    _add_setup_options(sim)
    _add_model_options(sim)
    _add_run_options(sim)
    deadline_cli.add_arguments(sim)
    sim.set_defaults(func=_simulate)


def _register_trace(sub: Any) -> None:
    """`vjob trace generate` and `vjob trace info`."""
    tr = sub.add_parser(
        "trace",
        help="workload traces: generate (Lublin-Feitelson), summarise",
        description="Workload traces for `vjob simulate`: generate a Lublin-Feitelson model trace, or summarise "
        "an SWF file or a Torque accounting log.",
        epilog="example:\n  vjob trace generate --nodes 1056 --jobs 100000 --seed 1 --load 0.7 -o lublin.swf\n"
        "  vjob trace info lublin.swf --nodes 1056",
    )
    tsub = tr.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    gen = tsub.add_parser(
        "generate",
        help="write a Lublin-Feitelson model trace as SWF",
        description="Write a Lublin-Feitelson (2003) model trace as SWF, reproducible from its seed.",
        epilog="example:\n  vjob trace generate --nodes 1056 --jobs 100000 --seed 1 --load 0.7 -o lublin.swf.gz",
    )
    gen.add_argument("--nodes", metavar="N", type=int, required=True, help="machine size (nodes)")
    gen.add_argument("--jobs", metavar="N", type=int, required=True, help="number of jobs to generate")
    gen.add_argument("--seed", metavar="N", type=int, default=1, help="random seed (integer; same seed, same trace)")
    gen.add_argument(
        "--load",
        metavar="FRACTION",
        type=float,
        default=None,
        help="rescale arrivals to this offered load (0..1, e.g. 0.85)",
    )
    gen.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="SWF file to write ('-' = stdout; .gz compresses)"
    )
    gen.set_defaults(func=_generate)
    info = tsub.add_parser(
        "info",
        help="jobs, span, size and runtime distributions, offered load",
        description="Summarise a trace: jobs, span, size and runtime distributions, offered load.",
        epilog="example:\n  vjob trace info lublin.swf --nodes 1056 --json",
    )
    info.add_argument("file", help="SWF (plain or .gz) or Torque accounting (file, directory or .tar.gz)")
    info.add_argument("--nodes", metavar="N", type=int, default=None, help="machine size (nodes) for the offered load")
    info.add_argument("--lenient", action="store_true", help="skip and count malformed lines")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_info)


def _add_policy_options(sim: argparse.ArgumentParser) -> None:
    """The policy, the interactive jobs injected, and the cap."""
    sim.add_argument(
        "--policy",
        metavar="POLICY",
        default=None,
        help="vjob, ubis, mms, mms-block or fcfs-easy (comma list with --sweep; default: [scheduling] policy, vjob); "
        "with --subclusters: fcfs-easy (default) or vjob",
    )
    sim.add_argument(
        "--interactive-frac",
        metavar="FRACTION",
        default="0",
        help="share of all jobs injected as interactive (0..1); with --subclusters --policy vjob: share of the "
        "trace's jobs made interactive",
    )
    sim.add_argument(
        "--interactive-mean-size", metavar="NODES", default="100", help="Poisson mean of interactive sizes (nodes)"
    )
    sim.add_argument(
        "--interactive-cap",
        metavar="FRACTION",
        default=None,
        help="share of nodes interactive jobs may hold (0..1; comma list)",
    )
    sim.add_argument(
        "--cap-mode",
        default="preempt",
        choices=("preempt", "hard"),
        help="interactive jobs beyond the cap: preempt = run as ordinary jobs (default); hard = wait until "
        "within the cap (the paper's literal reading)",
    )
    sim.add_argument("--max-preemptions", metavar="N", type=int, default=None, help="vjob: preemptions per job (count)")
    sim.add_argument(
        "--head-slack-s",
        metavar="SECONDS",
        type=float,
        default=None,
        help="vjob: seconds preemptions may delay the queue's first batch job (default: [scheduling])",
    )


def _add_setup_options(sim: argparse.ArgumentParser) -> None:
    """OS images, seeds and the part of the trace replayed."""
    sim.add_argument(
        "--os-count", metavar="N", type=int, default=2, help="OS images (count; jobs draw one with equal shares)"
    )
    sim.add_argument("--os-from-properties", action="store_true", help="job OS from the trace's node type")
    sim.add_argument("--seed", metavar="N", type=int, default=1, help="seed of the set-up (interactive jobs, OS draws)")
    sim.add_argument(
        "--seeds",
        metavar="LIST",
        default=None,
        help="comma list of set-up seeds; --sweep reports mean and 95 %% interval per cell",
    )
    sim.add_argument(
        "--max-jobs", metavar="N", type=int, default=None, help="replay only the first N trace jobs (count)"
    )


def _add_model_options(sim: argparse.ArgumentParser) -> None:
    """The cluster model (ClusterModel) and the pass's depth and priority refresh."""
    sim.add_argument(
        "--os-swap-s", metavar="SECONDS", type=float, default=300.0, help="seconds for a node to switch OS image"
    )
    sim.add_argument(
        "--bandwidth-mb-s", metavar="MB/S", type=float, default=500.0, help="checkpoint write/read MB/s per node"
    )
    sim.add_argument(
        "--memory-mb", metavar="MB", type=int, default=4096, help="VM memory per node (MB) when the trace has none"
    )
    sim.add_argument(
        "--backfill-depth", metavar="N", type=int, default=500, help="queued jobs looked at per backfill pass (count)"
    )
    sim.add_argument(
        "--priority-refresh",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="ubis: reuse priorities for this many simulated seconds (0 = exact; > 0 approximates, faster)",
    )


def _add_run_options(sim: argparse.ArgumentParser) -> None:
    """Outputs, the sweep, UBIS weights, and the heterogeneous farm."""
    sim.add_argument("--lenient", action="store_true", help="skip and count malformed trace lines")
    sim.add_argument(
        "--no-plots",
        action="store_true",
        help="no per-run PNG plots (faster); --sweep still draws its comparison figures",
    )
    sim.add_argument("--sweep", action="store_true", help="run the grid policies × fractions × sizes × caps × seeds")
    sim.add_argument(
        "--workers", metavar="N", type=int, default=None, help="processes for --sweep (default: all cores)"
    )
    sim.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="wN=V[,V...]",
        help="UBIS weight to set, or vary with --sweep: w1..w7 or a [priority.weights] name (repeatable; "
        "e.g. --weight w3=0.05,0.1,0.2)",
    )
    sim.add_argument("--out", metavar="DIR", required=True, help="output directory")
    sim.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    sim.add_argument(
        "--subclusters",
        metavar="FILE",
        default=None,
        help="heterogeneous farm (TOML of sub-clusters and job kinds; docs/remap.md): replay on it instead",
    )
    sim.add_argument(
        "--remap",
        metavar="MODE",
        default="none,arrive-f",
        help="with --subclusters: none (fastest free sub-cluster first) or arrive-f (remapping); comma list",
    )


def _generate(args: argparse.Namespace) -> int:
    from simulator.cli import generate_cmd  # heavy: pydantic

    return generate_cmd(args)


def _info(args: argparse.Namespace) -> int:
    from simulator.cli import info_cmd  # heavy: pydantic

    return info_cmd(args)


def _simulate(args: argparse.Namespace) -> int:
    from simulator.cli import simulate_cmd  # heavy: pydantic

    return simulate_cmd(args)
