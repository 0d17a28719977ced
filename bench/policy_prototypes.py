"""Prototype vjob variants that are not in the code, replayed on the policy grid (issue 34
item 5, docs/policy.md "Interactive start at scale").

Why a script that patches the simulator's pass instead of options: these variants were
measured and not kept (none improves on today's vjob without costing batch work), so they
have no place in `tick.decide`; their figures are in docs/policy.md, and this reproduces them.
Each prototype replaces one method of the simulator's pass for the run only (the live pass is
untouched, so tests/test_decision_differential.py does not cover them):

* `smallest`: the interactive tier (jobs within the cap) smallest job first (then
  submission, then job), the other tiers in submission order;
* `wait=S`: an admitted interactive job whose EASY start on the estimates is at most S
  seconds away waits instead of preempting;
* `noresv`: an admitted interactive job the guard refuses does not become the head; the pass
  goes on and the first batch job keeps the reservation.

    nice -n 19 .venv/bin/python bench/policy_prototypes.py --trace lublin_1056_100k.swf \\
        --jobs 100000 --seeds 1,2,3 --prototype smallest,wait=60 --out proto.jsonl

Lines as docs/ubis-reproduction/policy_grid.py writes them, with `prototype` added; the run
ends with one line of JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from preemption.scheduling.easy import reservation
from simulator import engine_pass, engine_preempt
from simulator.vjob_order import AHEAD_OFF, AHEAD_QUEUE, vjob_queue_order
from ubis_priority.interactive import within_cap

GRID = Path(__file__).resolve().parents[1] / "docs" / "ubis-reproduction" / "policy_grid.py"
CELLS = "0.1:50:0.05,0.1:50:0.15,0.1:100:0.15,0.1:150:0.15,0.2:50:0.05,0.2:50:0.15,0.2:100:0.15,0.2:150:0.15,"
CELLS += "0.3:50:0.05,0.3:50:0.15,0.3:100:0.15,0.3:150:0.15"
"""The 12 cells where interactive jobs fit the cap (the six others admit none)."""


def _grid() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_grid", GRID)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["policy_grid"] = module  # the workers unpickle `run` by its module's name
    spec.loader.exec_module(module)
    return module


def _smallest_first(self: Any, qa: np.ndarray, now: float) -> np.ndarray:
    """`SchedulingPass._vjob_order` with the interactive tier ranked by -nodes."""
    jobs = self.jobs
    prio = np.zeros(qa.shape[0])
    priv = self._privileged(qa)
    prio[priv] = -jobs.need_a[qa[priv]]
    ahead = self.rules.ahead in ("queue", "guarded")
    self.book.guard = vjob_queue_order(
        qa,
        jobs.inter_a,
        jobs.need_a,
        jobs.pc_a,
        jobs.submit_a,
        prio,
        self.cluster.held_interactive,
        float(self.rules.cap_nodes),
        AHEAD_QUEUE if ahead else AHEAD_OFF,
        self.scratch.vorder,
        self.scratch.vtier,
        self.scratch.vprio,
    )
    return self.scratch.vorder[: qa.shape[0]]


def _waiting(window: float) -> Any:
    plain = engine_preempt.Preempting._preempt_for

    def _preempt_for(self: Any, j: int, now: float) -> bool:
        start, _ = reservation(now, self.cluster.free, self.jobs.need[j], self.cluster.held)
        return False if start - now <= window else plain(self, j, now)

    return _preempt_for


def _walk_without_reservation(
    self: Any, order: np.ndarray, ranking: Any, now: float
) -> tuple[list[int], int, int, bool]:
    """`SchedulingPass._walk` where a refused admitted interactive job is passed over."""
    jobs, cluster, rules = self.jobs, self.cluster, self.rules
    started: list[int] = []
    for pos, j in enumerate(engine_pass._leading(order) if ranking is None else order.tolist()):
        n = jobs.need[j]
        priv = jobs.inter[j] and within_cap(cluster.held_interactive, n, rules.cap_nodes)
        if (n <= cluster.free) if priv else self._fits_beside(n):
            self._start(j, now, priv)
            started.append(j)
        elif priv and rules.policy.preempts and self._preempt_for(j, now):
            started.append(j)
        elif not priv:
            return started, j, pos, priv
    return started, -1, 0, False


def patch(prototypes: list[str]) -> None:
    """Install the named prototypes into the simulator's pass (this process and its forks)."""
    for name in prototypes:
        if name == "smallest":
            engine_pass.SchedulingPass._vjob_order = _smallest_first  # type: ignore[method-assign]
        elif name.startswith("wait="):
            engine_preempt.Preempting._preempt_for = _waiting(float(name[5:]))  # type: ignore[method-assign]
        elif name == "noresv":
            engine_pass.SchedulingPass._walk = _walk_without_reservation  # type: ignore[method-assign]
        else:
            raise SystemExit(f"--prototype {name!r}: one of smallest, wait=SECONDS, noresv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="SWF trace (the 1,056-node Lublin trace)")
    parser.add_argument("--jobs", type=int, default=20000, help="batch jobs of the trace replayed")
    parser.add_argument("--seeds", default="1", help="comma list of set-up seeds")
    parser.add_argument("--cells", default=CELLS, help="frac:size:cap,... (default: the 12 admitting cells)")
    parser.add_argument("--prototype", required=True, help="comma list: smallest, wait=SECONDS, noresv")
    parser.add_argument("--tier-order", default="submit", help="[scheduling] tier_order beside the prototype")
    parser.add_argument("--label", default="", help="label of the lines (default: prototype: <names>)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    args = parser.parse_args()
    names = [p.strip() for p in args.prototype.split(",") if p.strip()]
    patch(names)
    grid = _grid()
    cells = [tuple(float(x) for x in c.split(":")) for c in args.cells.split(",")]
    specs = [
        {
            "trace": args.trace,
            "nodes": 1056,
            "jobs": args.jobs,
            "frac": frac,
            "size": size,
            "cap": cap,
            "seed": int(seed),
            "policy": "vjob",
            "label": args.label or f"prototype: {'+'.join(names)}",
            "variant": {"tier_order": args.tier_order},
            "cap_mode": "preempt",
            "backfill_depth": 500,
            "lenient": False,
        }
        for (frac, size, cap), seed in itertools.product(cells, args.seeds.split(","))
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool, open(args.out, "a") as out:
        for k, fut in enumerate(as_completed([pool.submit(grid.run, s) for s in specs]), 1):
            line = fut.result() | {"prototype": "+".join(names)}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(f"policy_prototypes: {k}/{len(specs)} {line['frac']}/{line['size']}/{line['cap']} s{line['seed']}")
    print(
        json.dumps(
            {
                "bench": "policy_prototypes",
                "prototype": names,
                "runs": len(specs),
                "out": args.out,
                "seconds": round(time.perf_counter() - started),
            }
        )
    )


if __name__ == "__main__":
    main()
