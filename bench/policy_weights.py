"""The policy grid's cells (docs/ubis-reproduction/policy_grid.py) under chosen UBIS weights.

Why a second script: since the vjob policy orders each tier by the UBIS priority (issue 34
item 1), `[priority.weights]` moves its schedules, and the grid script replays the paper's
weights only. This one replays the same cells, seeds and set-up with the weights given, and
writes the grid's JSON lines (same fields, plus `weights`), so docs/policy.md's tables can
set a weighting beside the paper's:

    .venv/bin/python bench/policy_weights.py --trace lublin_1056_100k.swf --jobs 20000 \\
        --weights os_available=0,free_nodes=0 --out weights.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from vjob.config import PriorityConfig, PriorityWeights
from vjob.errors import InputError

GRID = Path(__file__).resolve().parent.parent / "docs" / "ubis-reproduction" / "policy_grid.py"


def _grid() -> Any:
    """The grid script as a module (it lives beside the docs, not in a package)."""
    spec = importlib.util.spec_from_file_location("policy_grid", GRID)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_weights(text: str) -> PriorityWeights:
    """`name=value,...` over the paper's weights; an unknown name or a bad value is an error
    naming it."""
    values: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in PriorityWeights.model_fields:
            raise InputError(f"--weights {name!r}: not a weight ({', '.join(PriorityWeights.model_fields)})")
        try:
            values[name] = float(value)
        except ValueError:
            raise InputError(f"--weights {name} = {value!r}: not a number") from None
    return PriorityWeights(**values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--nodes", type=int, default=1056)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--policies", default="vjob")
    parser.add_argument("--cells", default="", help="frac:size:cap,... (default: the grid's 18 cells)")
    parser.add_argument("--weights", default="", help="name=value,... over the paper's weights")
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    args = parser.parse_args()
    grid = _grid()
    weights = parse_weights(args.weights)

    def priority(interactive_cap: float) -> PriorityConfig:
        return PriorityConfig(interactive_cap=interactive_cap, weights=weights)

    grid.PriorityConfig = priority  # the grid's replay builds its [priority] through this name
    if args.cells:
        cells = [tuple(float(x) for x in c.split(":")) for c in args.cells.split(",")]
    else:
        cells = [(f, s, c) for f in (0.1, 0.2, 0.3) for s in (50.0, 100.0, 150.0) for c in (0.05, 0.15)]
    with open(args.out, "a", encoding="utf-8") as out:
        for frac, size, cap in cells:
            for seed in (int(s) for s in args.seeds.split(",")):
                for policy in args.policies.split(","):
                    spec = {
                        "trace": args.trace,
                        "lenient": False,
                        "jobs": args.jobs,
                        "nodes": args.nodes,
                        "frac": frac,
                        "size": size,
                        "cap": cap,
                        "seed": seed,
                        "policy": policy,
                        "label": policy,
                        "variant": {},
                        "cap_mode": "preempt",
                        "backfill_depth": 500,
                    }
                    line = grid.run(spec) | {"weights": weights.model_dump()}
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    print(f"policy_weights: {policy} {frac}/{size}/{cap} seed {seed}", flush=True)


if __name__ == "__main__":
    main()
