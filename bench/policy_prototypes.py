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
  goes on and the first batch job keeps the reservation;
* `walk=F`: the same, but only for a refused job whose own EASY start (on the estimates) is
  more than F x its estimate away; one whose nodes free up sooner heads the queue as today;
* `faithful`: the guard's "after" with the victims' return as the replay makes it (`faithful_after`):
  each victim, ahead of the guard, resumes at its EASY earliest start over the holds once the
  preemption is made (the interactive job's included), for its remaining estimate plus a remote
  resume, instead of from the interactive job's estimated end;
* `ckpt=short|small`: the checkpointed tier shortest remaining estimate (or fewest nodes)
  first instead of by submission;
* `bf=short`: EASY looks at the batch jobs of its window (the first 500 behind the head,
  interactive ones first as today) shortest estimate first instead of in queue order.

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

from preemption.scheduling.easy import backfill_arrays, reservation
from preemption.scheduling.guard import returning
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


def _profile_start(now: float, base: int, events: list[tuple[float, int]], need: int) -> float:
    """The earliest time from which the free nodes (`base` now, then `events` (time, change))
    stay at `need` or more: a reservation on a profile where returning victims take nodes."""
    times, avail, a = [now], [base], base
    for t, delta in sorted(events):
        a += delta
        if max(t, now) == times[-1]:
            avail[-1] = a
        else:
            times.append(max(t, now))
            avail.append(a)
    if avail[-1] < need:
        return float("inf")
    k = len(avail) - 1
    while k > 0 and avail[k - 1] >= need:
        k -= 1
    return times[k]


def faithful_after(
    now: float,
    free: int,
    need: int,
    holds: list[tuple[float, int]],
    victims: list[tuple[float, int, float]],
    taken_free: int,
    preemptor_end: float,
    preemptor_nodes: int,
    ready: float,
) -> float:
    """The guard's reserved start after the preemption, the victims returning as the replay
    resumes them: the preemptor holds all its nodes until `preemptor_end`, the victims' nodes
    it does not take are free once their checkpoints are written (`ready`), and each victim
    (checkpointed tier, ahead of the guard) resumes at its earliest start on that profile and
    holds its nodes for its remaining estimate plus a remote resume (2 x its checkpoint)."""
    held = list(holds)
    for end, nodes, _ in victims:
        held.remove((end, nodes))
    events = [(max(end, now), nodes) for end, nodes in held]
    events.append((preemptor_end, preemptor_nodes))
    left = sum(nodes for _, nodes, _ in victims) - (preemptor_nodes - taken_free)
    if left:
        events.append((ready, left))
    base = free - taken_free
    for end, nodes, ckpt_s in victims:
        back = _profile_start(now, base, events, nodes)
        back = preemptor_end if back == float("inf") else back
        events += [(back, -nodes), (back + max(end - now, 0.0) + 2.0 * ckpt_s, nodes)]
    return _profile_start(now, base, events, need)


def _faithful_keeps_guard(self: Any, j: int, now: float, victims: list[int], taken_free: int) -> bool:
    """`Preempting._keeps_guard` with `faithful_after` for a preemption (a plain start: as is)."""
    if not victims:
        return plain_keeps_guard(self, j, now, victims, taken_free)
    ready = max(now + self.jobs.ckpt_s[v] for v in victims)
    gone = [(*self.cluster.holds[(0, v)], self.jobs.ckpt_s[v]) for v in victims]
    guard, holds, end = self.book.guard, self._guard_holds(), ready + self.jobs.est_left[j]
    before, _ = reservation(now, self.cluster.free, self.jobs.need[guard], holds)
    anchor = self.book.anchors.setdefault(guard, before)
    if before == float("inf"):
        ok = True
    else:
        after = faithful_after(
            now, self.cluster.free, self.jobs.need[guard], holds, gone, taken_free, end, self.jobs.need[j], ready
        )
        ok = after <= anchor + self.rules.head_slack_s
    if ok:
        self.book.returning += returning(now, gone, end)
        if taken_free:
            self.book.returning.append((end, taken_free))
    return ok


plain_keeps_guard = engine_preempt.Preempting._keeps_guard


def _walk_reserving_soon(factor: float) -> Any:
    """`_walk_without_reservation`, where a refused job whose EASY start is within `factor`
    x its estimate still heads the queue (holds the reservation) as today."""

    def _walk(self: Any, order: np.ndarray, ranking: Any, now: float) -> tuple[list[int], int, int, bool]:
        jobs, cluster, rules = self.jobs, self.cluster, self.rules
        started: list[int] = []
        for pos, j in enumerate(engine_pass._leading(order) if ranking is None else order.tolist()):
            n = jobs.need[j]
            priv = jobs.inter[j] and within_cap(cluster.held_interactive, n, rules.cap_nodes)
            if (n <= cluster.free) if priv else self._fits_beside(n):
                self._start(j, now, priv)
                started.append(j)
                continue
            if priv and rules.policy.preempts and self._preempt_for(j, now):
                started.append(j)
                continue
            if priv and reservation(now, cluster.free, n, cluster.held)[0] - now > factor * jobs.est_left[j]:
                continue
            return started, j, pos, priv
        return started, -1, 0, False

    return _walk


def _checkpointed_by(key: str) -> Any:
    """`SchedulingPass._vjob_order` (submission order but for the interactive tier's UBIS
    ranking under `ubis-interactive`) with the checkpointed tier ranked by `key`."""

    def _vjob_order(self: Any, qa: np.ndarray, now: float) -> np.ndarray:
        jobs = self.jobs
        prio = np.zeros(qa.shape[0])
        priv = self._privileged(qa)
        if self.rules.ubis_interactive and priv.any():
            prio[priv] = self._priorities(qa[priv], now)
        back = (jobs.pc_a[qa] > 0) & ~jobs.inter_a[qa]
        prio[back] = -(jobs.est_a if key == "short" else jobs.need_a)[qa[back]]
        self.book.guard = vjob_queue_order(
            qa,
            jobs.inter_a,
            jobs.need_a,
            jobs.pc_a,
            jobs.submit_a,
            prio,
            self.cluster.held_interactive,
            float(self.rules.cap_nodes),
            AHEAD_OFF,
            self.scratch.vorder,
            self.scratch.vtier,
            self.scratch.vprio,
        )
        return self.scratch.vorder[: qa.shape[0]]

    return _vjob_order


NAMES = "smallest, wait=SECONDS, noresv, walk=FACTOR, faithful, ckpt=short, ckpt=small, bf=short"


def _backfill_shortest(
    self: Any, now: float, order: np.ndarray, ranking: Any, head: int, head_at: int, head_priv: bool
) -> np.ndarray:
    """`SchedulingPass._backfill` (vjob, no reserve) with the window's batch jobs by estimate."""
    jobs, free = self.jobs, self.cluster.free
    shadow, extra = reservation(now, free, jobs.need[head], self.cluster.held)
    rest = order[head_at + 1 :]
    inter = jobs.inter_a[rest]
    rest = np.concatenate((rest[inter], rest[~inter]))[: self.model.backfill_depth]
    first = jobs.inter_a[rest]
    batch = rest[~first]
    rest = np.concatenate((rest[first], batch[np.argsort(jobs.est_a[batch], kind="stable")]))
    return backfill_arrays(now, free, shadow, extra, rest, jobs.need_a[rest], jobs.est_a[rest], -1)


def patch(prototypes: list[str]) -> None:
    """Install the named prototypes into the simulator's pass (this process and its forks)."""
    for name in prototypes:
        if name == "smallest":
            engine_pass.SchedulingPass._vjob_order = _smallest_first  # type: ignore[method-assign]
        elif name.startswith("wait="):
            engine_preempt.Preempting._preempt_for = _waiting(float(name[5:]))  # type: ignore[method-assign]
        elif name == "noresv":
            engine_pass.SchedulingPass._walk = _walk_without_reservation  # type: ignore[method-assign]
        elif name.startswith("walk="):
            engine_pass.SchedulingPass._walk = _walk_reserving_soon(float(name[5:]))  # type: ignore[method-assign]
        elif name == "faithful":
            engine_preempt.Preempting._keeps_guard = _faithful_keeps_guard  # type: ignore[method-assign]
        elif name == "bf=short":
            engine_pass.SchedulingPass._backfill = _backfill_shortest  # type: ignore[method-assign]
        elif name in ("ckpt=short", "ckpt=small"):
            engine_pass.SchedulingPass._vjob_order = _checkpointed_by(name[5:])  # type: ignore[method-assign]
        else:
            raise SystemExit(f"--prototype {name!r}: one of {NAMES}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="SWF trace (the 1,056-node Lublin trace)")
    parser.add_argument("--jobs", type=int, default=20000, help="batch jobs of the trace replayed")
    parser.add_argument("--seeds", default="1", help="comma list of set-up seeds")
    parser.add_argument("--cells", default=CELLS, help="frac:size:cap,... (default: the 12 admitting cells)")
    parser.add_argument("--prototype", required=True, help=f"comma list: {NAMES}")
    parser.add_argument("--tier-order", default="submit", help="[scheduling] tier_order beside the prototype")
    parser.add_argument("--slack", type=float, default=None, help="[scheduling] head_slack_s beside it")
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
            "variant": {"tier_order": args.tier_order} | ({} if args.slack is None else {"head_slack_s": args.slack}),
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
