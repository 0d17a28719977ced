"""What the admitted interactive jobs wait for under `vjob`: a breakdown of their admitted wait.

Why: the issue's goal wants the interactive jobs admitted within the cap to wait ≤ 60 s
(their victims' checkpoints) and the Lublin grid measures 1,269–1,865 s. The summary says
how long, not why. This replays one cell with a `Simulation` that watches its own pass and
files every second of each admitted job's admitted wait (`Result.fit_wait`: queued with
room under the cap) under the reason its last pass gave:

* `checkpoint`: its victims' checkpoints (what the goal allows);
* `no_room`: the free nodes plus every running batch job's nodes are fewer than it needs
  (the rest is held by interactive jobs beyond the cap, or being checkpointed);
* `bound`: enough batch nodes run, but not on jobs below `max_preemptions`;
* `guard_past_slack`: the guard refused, and its reserved start was already beyond its
  anchor + slack before this preemption (no preemption that costs it anything can pass);
* `guard_moved`: the guard refused because this preemption would move it past the slack;
  `guard_moved_alt` counts the refusals where another set of victims (a greedy knapsack on
  the guard's own model, `_alternative`) would have passed;
* `..._large_victim`: the same, when the refused victims include a job of more than 1/4 of
  the machine (the interactive job needs a few nodes of it; a checkpoint frees all of them);
* `behind`: the pass never reached it (an earlier job in vjob's order, an interactive job
  within the cap, could not start and ended the pass);
* `unseen`: no pass looked at it yet (it fitted between passes).

The shares must add up to the run's admitted mean wait (`total_check`, checked here), so
the breakdown is the metric's own, not an estimate. Usage:

    nice -n 19 .venv/bin/python bench/policy_admitted_wait.py --trace lublin_1056_100k.swf \\
        --jobs 20000 --cell 0.2:100:0.15 --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from typing import Any

import numpy as np

from preemption.scheduling.easy import reservation
from preemption.scheduling.guard import keeps_reservation, returning
from simulator.cli import read_trace
from simulator.engine import Simulation
from simulator.metrics import admitted, summary
from simulator.replay import ClusterModel, Result
from simulator.setup import UbisSetup, apply
from vjob.config import PriorityConfig, SchedulingConfig

REASONS = (
    "checkpoint",
    "no_room",
    "bound",
    "guard_past_slack",
    "guard_moved",
    "guard_past_slack_large_victim",
    "guard_moved_large_victim",
    "behind",
    "unseen",
    "other",
)


class Watched(Simulation):
    """A vjob replay that files each admitted job's admitted wait under a reason."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reason: dict[int, str] = {}
        self.since: dict[int, float] = {}
        self.by_job: dict[int, Counter[str]] = {}
        self.now = 0.0
        self.tried: set[int] = set()
        self.guard_said: str | None = None
        self.refusals = Counter[str]()
        self.overshoot: list[int] = []
        self.guard_ahead: list[float] = []
        self.moved: list[float] = []
        self.preemptor_est: list[float] = []

    # -- accounting -----------------------------------------------------------------------
    def _fit(self, j: int) -> bool:
        return not math.isnan(self.queue.fit_since[j])

    def _flush(self, j: int, now: float) -> None:
        if j in self.since and self._fit(j):
            self.by_job.setdefault(j, Counter())[self.reason[j]] += now - self.since[j]
        self.since[j] = now

    def _file(self, j: int, why: str) -> None:
        self._flush(j, self.now)
        self.reason[j] = why

    def _enqueue(self, j: int, now: float) -> None:
        super()._enqueue(j, now)
        if self.jobs.inter[j] and j not in self.reason:
            self.reason[j], self.since[j] = "unseen", now

    def _cap_moved(self, before: int, now: float) -> None:
        for jobs in self.queue.waiting.values():
            for j in jobs:
                self._flush(j, now)
        super()._cap_moved(before, now)

    def _started_waiting(self, j: int, alloc: float) -> None:
        self._flush(j, self.now)
        if self._fit(j):
            self.by_job.setdefault(j, Counter())["checkpoint"] += alloc - self.now
        super()._started_waiting(j, alloc)
        self.since.pop(j, None)

    def _waiting_fit(self) -> list[int]:
        return [j for jobs in self.queue.waiting.values() for j in jobs if self._fit(j)]

    # -- the pass -------------------------------------------------------------------------
    def _may_start(self) -> bool:
        ok = super()._may_start()
        if not ok:
            for j in self._waiting_fit():
                self._file(j, "no_room")
        return ok

    def _schedule(self, now: float) -> None:
        self.now = now
        self.tried = set()
        waiting = self._waiting_fit()
        super()._schedule(now)
        for j in waiting:
            if j in self.queue.waiting.get(self.jobs.need[j], {}) and j not in self.tried:
                self._file(j, "behind")

    def _preempt_for(self, j: int, now: float) -> bool:
        self.tried.add(j)
        want = self.jobs.need[j] - self.cluster.free
        batch = [v for v in self.cluster.running if not self.jobs.inter[v]]
        eligible = [v for v in batch if self.jobs.pc_a[v] < self.rules.max_preemptions]
        self.guard_said = None
        ok = super()._preempt_for(j, now)
        if ok:
            return True
        if sum(self.jobs.need[v] for v in batch) < want:
            why = "no_room"
        elif sum(self.jobs.need[v] for v in eligible) < want:
            why = "bound"
        elif self.guard_said is not None:
            why = self.guard_said
        else:
            why = "other"
        self._file(j, why)
        return False

    def _keeps_guard(self, j: int, now: float, victims: list[int], taken_free: int) -> bool:
        held = self._guard_holds()
        anchor = self.book.anchors.get(self.book.guard)
        ok = super()._keeps_guard(j, now, victims, taken_free)
        if ok or not victims:
            return ok
        before, _ = reservation(now, self.cluster.free, self.jobs.need[self.book.guard], held)
        past = anchor is not None and before > anchor + self.rules.head_slack_s
        self.guard_said = "guard_past_slack" if past else "guard_moved"
        self.refusals[self.guard_said] += 1
        if 4 * max(self.jobs.need[v] for v in victims) > self.model.nodes:
            self.guard_said += "_large_victim"
        self.overshoot.append(sum(self.jobs.need[v] for v in victims) - (self.jobs.need[j] - self.cluster.free))
        self.guard_ahead.append(before - now)
        self.moved.append(self._after(j, now, victims, taken_free, held) - max(before, anchor or before))
        self.preemptor_est.append(self.jobs.est_left[j])
        if self._alternative(j, now, held, anchor if anchor is not None else before):
            self.refusals[self.guard_said + "_alt"] += 1
        return False

    def _after(self, j: int, now: float, victims: list[int], taken_free: int, held: list[tuple[float, int]]) -> float:
        """The guard's reserved start had the preemption happened (guard.keeps_reservation's model)."""
        gone = [(*self.cluster.holds[(0, v)], self.jobs.ckpt_s[v]) for v in victims]
        end = now + max(self.jobs.ckpt_s[v] for v in victims) + self.jobs.est_left[j]
        after = list(held)
        for hold_end, nodes, _ in gone:
            after.remove((hold_end, nodes))
        after += returning(now, gone, end)
        if taken_free:
            after.append((end, taken_free))
        return reservation(now, self.cluster.free - taken_free, self.jobs.need[self.book.guard], after)[0]

    def _alternative(self, j: int, now: float, held: list[tuple[float, int]], anchor: float) -> bool:
        """Whether some other victim set passes the guard: greedy by least harm (the guard's
        reserved start after preempting that victim alone), smallest first on ties."""
        want = self.jobs.need[j] - self.cluster.free
        cands = [
            v for v in self.cluster.running if not self.jobs.inter[v] and self.jobs.pc_a[v] < self.rules.max_preemptions
        ]
        need_g = self.jobs.need[self.book.guard]

        def after(vs: list[int]) -> tuple[bool, float]:
            gone = [(*self.cluster.holds[(0, v)], self.jobs.ckpt_s[v]) for v in vs]
            ready = now + max(self.jobs.ckpt_s[v] for v in vs)
            taken = max(0, self.jobs.need[j] - sum(self.jobs.need[v] for v in vs))
            return keeps_reservation(
                now,
                self.cluster.free,
                need_g,
                held,
                gone,
                min(taken, self.cluster.free),
                ready + self.jobs.est_left[j],
                self.rules.head_slack_s,
                anchor,
            )

        scored = sorted(cands, key=lambda v: (not after([v])[0], self.jobs.need[v]))
        chosen: list[int] = []
        got = 0
        for v in scored:
            chosen.append(v)
            got += self.jobs.need[v]
            if got >= want:
                return after(chosen)[0]
        return False


def admitted_jobs(result: Result) -> list[int]:
    """The jobs `metrics.admitted` averages over: interactive, ran within the cap, ended."""
    m = result.workload.interactive & result.ran_privileged & np.isfinite(result.end)
    return np.flatnonzero(m).tolist()


def breakdown(sim: Watched, jobs: list[int]) -> Counter[str]:
    """Seconds of admitted wait per reason, summed over `jobs`."""
    total = Counter[str]()
    for j in jobs:
        total.update(sim.by_job.get(j, Counter()))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="SWF trace (the 1,056-node Lublin trace)")
    parser.add_argument("--nodes", type=int, default=1056)
    parser.add_argument("--jobs", type=int, default=20000, help="batch jobs of the trace replayed (window)")
    parser.add_argument("--cell", default="0.2:100:0.15", help="interactive share:mean size:cap")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slack", type=float, default=None, help="[scheduling] head_slack_s (default: the config's)")
    parser.add_argument("--reserve", type=int, default=0, help="[scheduling] interactive_reserve_nodes (default 0)")
    parser.add_argument(
        "--reserve-arrivals", type=int, default=0, help="[scheduling] interactive_reserve_arrivals (default 0: always)"
    )
    parser.add_argument(
        "--reserve-window", type=float, default=3600.0, help="[scheduling] interactive_reserve_window_s (s)"
    )
    args = parser.parse_args()
    frac, size, cap = (float(x) for x in args.cell.split(":"))
    w = apply(
        read_trace(args.trace).take(slice(0, args.jobs)),
        args.nodes,
        UbisSetup(frac, size, os_count=2, seed=args.seed),
    )
    sched = SchedulingConfig(
        interactive_reserve_nodes=args.reserve,
        interactive_reserve_arrivals=args.reserve_arrivals,
        interactive_reserve_window_s=args.reserve_window,
    )
    if args.slack is not None:
        sched = sched.model_copy(update={"head_slack_s": args.slack})
    t0 = time.perf_counter()
    sim = Watched(w, ClusterModel(nodes=args.nodes), "vjob", PriorityConfig(interactive_cap=cap), scheduling=sched)
    result = sim.run()
    adm = admitted(result)
    jobs = admitted_jobs(result)
    total = breakdown(sim, jobs)
    count = max(len(jobs), 1)
    per_job = {r: round(total[r] / count, 1) for r in REASONS}
    waited = [j for j in jobs if result.fit_wait[j] > 60.0]
    main_reason = Counter(max(sim.by_job[j], key=sim.by_job[j].__getitem__) for j in waited if j in sim.by_job)
    doc = summary(result)
    line = {
        "bench": "policy_admitted_wait",
        "cell": args.cell,
        "seed": args.seed,
        "jobs": args.jobs,
        "head_slack_s": sched.head_slack_s,
        "interactive_reserve_nodes": sched.interactive_reserve_nodes,
        "interactive_reserve_arrivals": sched.interactive_reserve_arrivals,
        "interactive_reserve_window_s": sched.interactive_reserve_window_s,
        "admitted": adm["count"],
        "admitted_mean_wait_s": adm["mean_wait_s"],
        "breakdown_mean_s": per_job,
        "total_check": round(sum(per_job.values()), 1),
        "over_60s": len(waited),
        "over_60s_main_reason": dict(main_reason.most_common()),
        "guard_refusals": dict(sim.refusals),
        "refused_overshoot_nodes_median": float(np.median(sim.overshoot)) if sim.overshoot else None,
        "refused_guard_ahead_s_median": float(np.median(sim.guard_ahead)) if sim.guard_ahead else None,
        "refused_guard_move_s_median": float(np.median(sim.moved)) if sim.moved else None,
        "refused_preemptor_estimate_s_median": float(np.median(sim.preemptor_est)) if sim.preemptor_est else None,
        "utilization": doc["utilization"],
        "batch_mean_response_s": doc["by_class"]["batch"]["mean_response_s"],
        "large_batch_mean_response_s": doc["batch_by_size"]["large"]["mean_response_s"],
        "interactive_mean_wait_s": doc["by_class"]["interactive"].get("mean_wait_s"),
        "preemptions": result.preemptions,
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
