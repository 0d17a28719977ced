"""How well the vjob guard's model of "after a preemption" predicts what the replay does.

Why (issue 34 item 5): the guard refuses a preemption when its model says the head's reserved
start would move past the slack. The model is pessimistic by design (`guard.returning`: each
victim holds its nodes again only from the interactive job's estimated end), while the replay
resumes a victim as soon as enough nodes are free. If the model were far from the replay, a
more faithful one could let preemptions through that do not in fact move the head. This
replays one cell and, at every check of a preemption with victims, computes the guard's
reserved start before, after by today's model, and after by the faithful one
(policy_prototypes.faithful_after: victims resume at their EASY earliest start on the profile
the preemption leaves); then it compares the predictions with the guard's realised first start
(for the preemptions made) and counts the checks where the two models decide differently.
The watching changes nothing (the pass calls the same method and gets its answer back).

    nice -n 19 .venv/bin/python bench/policy_guard_model.py --trace lublin_1056_100k.swf \\
        --jobs 20000 --cell 0.3:50:0.15 --seed 1 --tier-order ubis-interactive

One JSON line per run (medians in seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
from pathlib import Path
from typing import Any

from preemption.scheduling.easy import reservation
from preemption.scheduling.guard import reserved_after
from simulator.cli import read_trace
from simulator.engine import Simulation
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from vjob.config import PriorityConfig, SchedulingConfig


def _prototypes() -> Any:
    """bench/policy_prototypes.py (a script beside this one, not a package)."""
    spec = importlib.util.spec_from_file_location("policy_prototypes", Path(__file__).with_name("policy_prototypes.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


faithful_after = _prototypes().faithful_after


class Watched(Simulation):
    """A replay that records, for every guard check with victims: (guard, before, today's
    after, faithful after, anchor, slack, allowed)."""

    checks: list[tuple[int, float, float, float, float, float, bool]]

    def _keeps_guard(self, j: int, now: float, victims: list[int], taken_free: int) -> bool:
        if not victims:
            return super()._keeps_guard(j, now, victims, taken_free)
        ready = max(now + self.jobs.ckpt_s[v] for v in victims)
        gone = [(*self.cluster.holds[(0, v)], self.jobs.ckpt_s[v]) for v in victims]
        guard, holds, end = self.book.guard, self._guard_holds(), ready + self.jobs.est_left[j]
        need = self.jobs.need[guard]
        before, _ = reservation(now, self.cluster.free, need, holds)
        today = reserved_after(now, self.cluster.free, need, holds, gone, taken_free, end)
        faithful = faithful_after(now, self.cluster.free, need, holds, gone, taken_free, end, self.jobs.need[j], ready)
        anchor = self.book.anchors.get(guard, before)
        ok = super()._keeps_guard(j, now, victims, taken_free)
        self.checks.append((guard, before, today, faithful, anchor, self.rules.head_slack_s, ok))
        return ok


def _median(values: list[float]) -> float | None:
    values = [v for v in values if math.isfinite(v)]
    return round(statistics.median(values)) if values else None


def report(sim: Watched) -> dict[str, Any]:
    """The checks' figures: how often the models disagree, and their error on the preemptions made."""
    first = sim.out.first_start
    made = [c for c in sim.checks if c[6] and math.isfinite(c[1]) and not math.isnan(first[c[0]])]
    refused = [c for c in sim.checks if not c[6] and math.isfinite(c[1])]
    err_today = [first[g] - today for g, _, today, *_ in made]
    err_faithful = [first[g] - faithful for g, _, _, faithful, *_ in made]
    return {
        "checks": len(sim.checks),
        "made": len(made),
        "refused": len(refused),
        "faithful_decides_otherwise": sum(1 for c in sim.checks if (c[3] <= c[4] + c[5]) != c[6]),
        "refused_faithful_would_pass": sum(1 for c in refused if c[3] <= c[4] + c[5]),
        "made_faithful_would_refuse": sum(1 for c in made if c[3] > c[4] + c[5]),
        "made_move_today_s": _median([c[2] - c[1] for c in made]),
        "made_move_realised_s": _median([first[c[0]] - c[1] for c in made]),
        "made_abs_error_today_s": _median([abs(e) for e in err_today]),
        "made_abs_error_faithful_s": _median([abs(e) for e in err_faithful]),
        "made_realised_before_today": round(sum(1 for e in err_today if e < 0) / max(1, len(err_today)), 3),
        "refused_move_today_s": _median([c[2] - c[1] for c in refused]),
        "refused_move_faithful_s": _median([c[3] - c[1] for c in refused]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="SWF trace (the 1,056-node Lublin trace)")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--cell", default="0.2:100:0.15", help="frac:size:cap")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tier-order", default="submit", help="[scheduling] tier_order")
    args = parser.parse_args()
    frac, size, cap = (float(x) for x in args.cell.split(":"))
    base = read_trace(args.trace).take(slice(0, args.jobs))
    w = apply(base, 1056, UbisSetup(frac, size, os_count=2, seed=args.seed))
    scheduling = SchedulingConfig(tier_order=args.tier_order)
    model = ClusterModel(nodes=1056, backfill_depth=500)
    sim = Watched(w, model, "vjob", PriorityConfig(interactive_cap=cap), scheduling=scheduling)
    sim.checks = []
    sim.run()
    head = {"bench": "policy_guard_model", "cell": args.cell, "seed": args.seed, "jobs": args.jobs}
    print(json.dumps(head | {"tier_order": args.tier_order} | report(sim)))


if __name__ == "__main__":
    main()
