"""The planner's entry point: choose a placement, sequence it, validate it, return the cheapest plan.

Why the optimiser compares several plans: CP-SAT minimises the sum of the actions' own costs
plus a charge for every VM that would have to wait for a later pool, a proxy for the plan
cost (which charges every action for all the pools before it). So the plans of every
placement found (CP-SAT's, the keep-in-place greedy's, the decision module's, FFD's as the
baseline and safety net, and variants of the first ones) are built and validated, and the
cheapest is returned: CP-SAT's result is never dearer than FFD's, and when CP-SAT finds
nothing in time the heuristics' best plan is returned with a warning. There is no plan only
when no viable placement exists, and then the error says what is short.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from preemption.planner.diagnose import NoViablePlacementError, explain
from preemption.planner.instance import Instance
from preemption.planner.placement import (
    FULL_MODEL_LIMIT,
    Placement,
    cpsat_placement,
    first_fit_decreasing,
    keep_in_place,
    move_home,
    pull_early,
)
from preemption.planner.plan import Plan, local_cost
from preemption.planner.sequencing import SequencingError, build_plan
from preemption.planner.validator import validate
from vjob import log
from vjob.errors import InputError, VjobError

Optimizer = Literal["cpsat", "ffd"]


def make_plan(
    inst: Instance,
    *,
    optimizer: Optimizer = "cpsat",
    time_limit_s: float = 10.0,
    workers: int = 2,
    hint: Mapping[str, str] | None = None,
) -> Plan:
    """The cheapest validated plan found taking `inst` to its target (see module docstring).

    `hint` is a viable placement already known (a decision module's); it is used as one more
    candidate and as CP-SAT's starting point. A hint that is not viable is ignored with a warning.
    """
    if optimizer not in ("cpsat", "ffd"):
        raise InputError(f"optimizer = {optimizer!r}: must be cpsat or ffd")
    started = time.perf_counter()
    to_run = inst.to_run()
    ffd, ffd_left = first_fit_decreasing(inst.nodes, to_run)
    warnings: list[str] = []
    stats: dict[str, object] = {"vms": len(inst.vms), "nodes": len(inst.nodes), "to_run": len(to_run)}
    candidates: list[tuple[str, Placement]] = []
    known = _viable(inst, hint, warnings) if hint else None
    if optimizer == "ffd":
        if not ffd_left:
            candidates.append(("ffd", ffd))
        elif known is not None:
            warnings.append("first-fit decreasing cannot pack the VMs to run: the hint placement is used")
            candidates.append(("hint", known))
        else:
            raise NoViablePlacementError(explain(inst, proven=False) + " (first-fit decreasing)")
    else:
        greedy, greedy_left = keep_in_place(inst)
        if greedy_left:
            # The greedy could not pack: send home what it can from a placement known to fit.
            start = known if known is not None else (None if ffd_left else ffd)
            if start is not None:
                greedy, greedy_left = move_home(inst, start), []
        pairs = ((greedy, not greedy_left), (known, known is not None), (ffd, not ffd_left))
        hints = [p for p, ok in pairs if ok and p is not None]
        # Keep a fifth of the limit for sequencing and validating the candidate plans.
        budget = max(0.05, 0.8 * time_limit_s - (time.perf_counter() - started))
        placement, status, bound = cpsat_placement(inst, time_limit_s=budget, hints=hints, workers=workers)
        every_node = len(to_run) * len(inst.nodes) <= FULL_MODEL_LIMIT
        if placement is None and not hints and not every_node:
            # Without a starting solution the candidate nodes may be too few: offer every node.
            budget = max(0.05, 0.8 * time_limit_s - (time.perf_counter() - started))
            placement, status, bound = cpsat_placement(
                inst, time_limit_s=budget, workers=workers, full_model_limit=len(to_run) * len(inst.nodes)
            )
            every_node = True
        stats.update({"cpsat_status": status, "cpsat_bound": bound})
        if placement is not None:
            candidates.append(("cpsat", placement))
        elif status == "INFEASIBLE" and every_node:
            raise NoViablePlacementError(explain(inst, proven=True))
        else:
            msg = f"CP-SAT found no placement within {time_limit_s:g} s (status {status}): falling back"
            warnings.append(msg)
            log.get("planner").warning("cpsat_fallback", status=status, time_limit_s=time_limit_s)
        if not greedy_left:
            candidates.append(("keep-in-place", greedy))
        if known is not None:
            candidates.append(("hint", known))
        if not ffd_left:
            candidates.append(("ffd", ffd))
        if not candidates:
            raise NoViablePlacementError(explain(inst, proven=False))
        # Variants of the first two placements with the VMs that would wait moved to roomier nodes.
        candidates += [(f"{name}+early", pull_early(inst, p)) for name, p in candidates[:2]]

    best: Plan | None = None
    errors: list[str] = []
    for name, placement in candidates:
        try:
            plan = build_plan(inst, placement, optimizer=name)
            validate(inst, plan)
        except SequencingError as exc:
            errors.append(f"{name}: {exc}")
            continue
        stats[f"cost_{name}"] = plan.cost
        if best is None or plan.cost < best.cost:
            best = plan
    if best is None:
        raise VjobError("no viable sequence of actions for any placement found: " + "; ".join(errors))
    if optimizer == "cpsat" and len(best.pools) > 1:
        best = _defer_dear_actions(inst, best, stats)
    stats["seconds"] = round(time.perf_counter() - started, 3)
    log.get("planner").info(
        "plan", cost=best.cost, pools=len(best.pools), placement_by=best.optimizer, seconds=stats["seconds"]
    )
    return Plan(
        pools=best.pools,
        placement=best.placement,
        cost=best.cost,
        optimizer=best.optimizer,
        warnings=tuple(warnings),
        stats=stats,
    )


def _viable(inst: Instance, hint: Mapping[str, str], warnings: list[str]) -> Placement | None:
    """`hint` restricted to the VMs to run, if it places each of them and overloads no node."""
    nodes = inst.node_by_id
    to_run = inst.to_run()
    missing = [vm.id for vm in to_run if hint.get(vm.id) not in nodes]
    if missing:
        warnings.append(f"hint ignored: it places no known node for vm {missing[0]} ({len(missing)} such VM(s))")
        return None
    cpu = dict.fromkeys(nodes, 0)
    mem = dict.fromkeys(nodes, 0)
    for vm in to_run:
        cpu[hint[vm.id]] += vm.cpu
        mem[hint[vm.id]] += vm.mem
    over = [n for n in nodes if cpu[n] > nodes[n].cpu or mem[n] > nodes[n].mem]
    if over:
        warnings.append(f"hint ignored: it overloads node {over[0]} ({len(over)} such node(s))")
        return None
    return {vm.id: hint[vm.id] for vm in to_run}


def _defer_dear_actions(inst: Instance, plan: Plan, stats: dict[str, object]) -> Plan:
    """The same placement sequenced with dear actions held back to later pools, if that is cheaper.

    Why: a pool costs as much as its dearest action and every later action pays for it, so
    one remote resume of a big VM in the first pool can make a thousand later actions wait
    longer. Each distinct action cost is tried as the threshold; the validator checks the winner.
    """
    mem = {v.id: v.mem for v in inst.vms}
    thresholds = sorted({local_cost(a, mem[a.vm]) for a in plan.actions})[:-1]
    best = plan
    for limit in thresholds:
        try:
            candidate = build_plan(inst, plan.placement, optimizer=plan.optimizer, defer_above=limit)
        except SequencingError:
            continue
        if candidate.cost < best.cost:
            best = candidate
            stats["defer_above"] = limit
    if best is not plan:
        validate(inst, best)
        stats[f"cost_{plan.optimizer}_deferred"] = best.cost
    return best
