"""The grid behind docs/policy.md: MMS, UBIS and vjob per cell, seed and cap mode, as JSON lines.

Why a script next to `vjob simulate --sweep`: the policy page compares figures the sweep does
not tabulate one by one (large batch jobs, interactive jobs started within the cap, the
ablation's variants of `[scheduling]`), over many seeds, and must be re-runnable as is:

    .venv/bin/python docs/ubis-reproduction/policy_grid.py --trace lublin_1056_100k.swf \\
        --jobs 20000 --seeds 1 --out grid20k.jsonl
    .venv/bin/python docs/ubis-reproduction/policy_grid.py --ablation --cells 0.2:100:0.15 ...

Each line: the cell, the seed, the policy (with its `[scheduling]` variant) and the run's
summary figures (simulator/metrics.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from simulator.cli import read_trace
from simulator.engine import simulate
from simulator.metrics import summary
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from vjob.config import PriorityConfig, SchedulingConfig

ABLATION: dict[str, dict[str, Any]] = {
    "vjob": {},
    "no guard (slack 1e9)": {"head_slack_s": 1e9},
    "slack 1800 s": {"head_slack_s": 1800.0},
    "slack 0 s": {"head_slack_s": 0.0},
    "no preemption bound": {"max_preemptions": 1000},
    "bound 1": {"max_preemptions": 1},
    "over-cap interactive: off": {"interactive_ahead": "off"},
    "over-cap interactive: queue": {"interactive_ahead": "queue"},
    "over-cap interactive: guarded": {"interactive_ahead": "guarded"},
    "never preempt": {"max_preemptions": 0},
    "victims harmless to the guard first": {"victims": "guard"},
    "interactive reserve 25 nodes": {"interactive_reserve_nodes": 25},
    "interactive reserve 50 nodes": {"interactive_reserve_nodes": 50},
    "adaptive reserve 50 nodes from 1 arrival/h": {"interactive_reserve_nodes": 50, "interactive_reserve_arrivals": 1},
    "adaptive reserve 50 nodes from 2 arrivals/h": {"interactive_reserve_nodes": 50, "interactive_reserve_arrivals": 2},
    "adaptive reserve 100 nodes from 2 arrivals/h": {
        "interactive_reserve_nodes": 100,
        "interactive_reserve_arrivals": 2,
    },
    "UBIS in the interactive tier": {"tier_order": "ubis-interactive"},
    "UBIS in the interactive tier + slack 300 s": {"tier_order": "ubis-interactive", "head_slack_s": 300.0},
    "UBIS in the interactive tier + slack 0 s": {"tier_order": "ubis-interactive", "head_slack_s": 0.0},
    "UBIS in the interactive tier + slack 1800 s": {"tier_order": "ubis-interactive", "head_slack_s": 1800.0},
    "UBIS in the interactive tier + bound 1": {"tier_order": "ubis-interactive", "max_preemptions": 1},
    "UBIS in the interactive tier + slack 0 s + bound 1": {
        "tier_order": "ubis-interactive",
        "head_slack_s": 0.0,
        "max_preemptions": 1,
    },
    "UBIS in the interactive tier + victims harmless to the guard first": {
        "tier_order": "ubis-interactive",
        "victims": "guard",
    },
    "UBIS in every tier": {"tier_order": "ubis"},
}
_TRACE: dict[str, Any] = {}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One replay from a picklable spec; returns its JSON line."""
    if spec["trace"] not in _TRACE:
        _TRACE[spec["trace"]] = read_trace(spec["trace"], lenient=spec["lenient"])
    base = _TRACE[spec["trace"]].take(slice(0, spec["jobs"]))
    w = apply(base, spec["nodes"], UbisSetup(spec["frac"], spec["size"], os_count=2, seed=spec["seed"]))
    model = ClusterModel(nodes=spec["nodes"], backfill_depth=spec["backfill_depth"])
    t0 = time.perf_counter()
    result = simulate(
        w,
        model,
        spec["policy"],
        PriorityConfig(interactive_cap=spec["cap"]),
        scheduling=SchedulingConfig(**spec["variant"]),
        cap_mode=spec["cap_mode"],
    )
    doc = summary(result)
    return {
        k: spec[k] for k in ("frac", "size", "cap", "seed", "policy", "label", "cap_mode", "jobs", "backfill_depth")
    } | {
        "utilization": doc["utilization"],
        "batch_mean_response_s": doc["by_class"]["batch"]["mean_response_s"],
        "batch_by_size": doc["batch_by_size"],
        "interactive_mean_wait_s": doc["by_class"]["interactive"].get("mean_wait_s"),
        "interactive_within_cap_mean_wait_s": doc["interactive_within_cap_mean_wait_s"],
        "interactive_within_cap": doc["interactive_within_cap"],
        "interactive_admitted": doc["interactive_admitted"],
        "max_interactive_nodes": doc["max_interactive_nodes"],
        "preemptions": doc["preemptions"],
        "preempted_jobs": doc["preempted_jobs"],
        "wall_seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="SWF trace (the 1,056-node Lublin trace of the reproduction)")
    parser.add_argument("--nodes", type=int, default=1056, help="machine size (nodes)")
    parser.add_argument("--jobs", type=int, default=20000, help="batch jobs of the trace replayed (window)")
    parser.add_argument("--seeds", default="1", help="comma list of set-up seeds")
    parser.add_argument("--policies", default="mms,ubis,vjob", help="comma list of policies")
    parser.add_argument("--cap-modes", default="preempt", help="comma list: preempt, hard")
    parser.add_argument("--cells", default="", help="frac:size:cap,... (default: the 36-cell grid's 18 x 2 caps)")
    parser.add_argument("--backfill-depth", type=int, default=500, help="EASY window (jobs); 0 = unbounded")
    parser.add_argument("--ablation", action="store_true", help="vjob's [scheduling] variants instead of policies")
    parser.add_argument("--variants", default="", help="with --ablation: comma list of variant labels (default: all)")
    parser.add_argument("--lenient", action="store_true", help="skip malformed trace lines (wagap-2013 has 2)")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    args = parser.parse_args()
    if args.cells:
        cells = [tuple(float(x) for x in c.split(":")) for c in args.cells.split(",")]
    else:
        cells = list(itertools.product((0.1, 0.2, 0.3), (50.0, 100.0, 150.0), (0.05, 0.15)))
    runs = (
        [
            ("vjob", label, variant)
            for label, variant in ABLATION.items()
            if not args.variants or label in args.variants.split(",")
        ]
        if args.ablation
        else [(p, p, {}) for p in args.policies.split(",")]
    )
    specs = [
        {
            "trace": args.trace,
            "nodes": args.nodes,
            "jobs": args.jobs,
            "frac": frac,
            "size": size,
            "cap": cap,
            "seed": int(seed),
            "policy": policy,
            "label": label,
            "variant": variant,
            "cap_mode": mode,
            "backfill_depth": args.backfill_depth or None,
            "lenient": args.lenient,
        }
        for (frac, size, cap), seed, (policy, label, variant), mode in itertools.product(
            cells, args.seeds.split(","), runs, args.cap_modes.split(",")
        )
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool, open(args.out, "a") as out:
        futures = [pool.submit(run, s) for s in specs]
        for k, fut in enumerate(as_completed(futures), 1):
            line = fut.result()
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(
                f"policy_grid: {k}/{len(specs)} {line['label']} {line['frac']}/{line['size']}/{line['cap']}", flush=True
            )
    print(
        json.dumps(
            {
                "bench": "policy_grid",
                "runs": len(specs),
                "out": args.out,
                "seconds": round(time.perf_counter() - started),
            }
        )
    )


if __name__ == "__main__":
    main()
