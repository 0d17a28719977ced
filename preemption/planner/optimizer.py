"""The planner's entry point: choose a placement, sequence it, validate it, return the cheapest plan.

Why the time limit is a wall-clock budget for the whole call: an operator who runs
`vjob plan --time-limit 60` or an agent with a 10 s planning slot needs an answer by then,
not a solver that got 60 s after minutes of model building. So the first viable placement
comes from fast heuristics (packing, keep-in-place, the caller's known placement) in well
under a second; CP-SAT improves on it over the VMs that must move only, for the time left
minus a reserve for sequencing; and the candidate plans are sequenced and validated until the
budget ends (at least one always is).

Why several plans are compared: CP-SAT minimises the sum of the actions' own costs plus a
charge for every VM that would have to wait for a later pool, a proxy for the plan cost
(which charges every action for all the pools before it). So the plans of every placement
found (CP-SAT's, the keep-in-place greedy's, the caller's, FFD's as the baseline and safety
net, and variants of the first ones) are built and validated, and the cheapest is returned:
CP-SAT's result is never dearer than FFD's, and when CP-SAT finds nothing in time the
heuristics' best plan is returned with a warning. There is no plan only when no viable
placement exists (or none was found in time), and then the error says what is short.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from preemption.planner.clock import default_workers
from preemption.planner.cpsat import cpsat_placement
from preemption.planner.diagnose import NoViablePlacementError, explain
from preemption.planner.improve import pull_forward
from preemption.planner.instance import Instance, NodeSpec, VMSpec
from preemption.planner.placement import (
    Load,
    Placement,
    first_fit_decreasing,
    keep_in_place,
    move_home,
    pack,
    pinned_home,
    pull_early,
    sticky_pack,
)
from preemption.planner.plan import Plan, local_cost
from preemption.planner.sequencing import SequencingError, build_plan
from preemption.planner.staged import staged_placement
from preemption.planner.validator import validate
from vjob import log
from vjob.errors import InputError

Optimizer = Literal["cpsat", "ffd"]


def sequencing_reserve(inst: Instance, time_limit_s: float) -> float:
    """Seconds kept after CP-SAT for sequencing and validating the candidate plans.

    Measured: one candidate plan (sequence + validate) takes about 15 µs per VM on an idle
    core; about ten are built (candidates, repairs, deferral thresholds) and the machine may be
    busy, hence 1 ms per VM; the improvement phase (`pull_forward`) takes up to 0.25 ms per VM
    more on a busy machine (1.2 s at 5,000 VMs, load 4), hence 1.5 ms per VM; and never more
    than a quarter of the budget. On large crowded clusters CP-SAT gains little in those last
    seconds (measured: its placement's plan within 1 % of the best heuristic's) and the phase
    much more.
    """
    return min(0.25 * time_limit_s, 0.1 + 0.0015 * len(inst.vms))


def answer_reserve(inst: Instance) -> float:
    """Seconds kept at the end of the budget for the caller to print the plan and exit.

    Measured at 30,000 VMs: the plan's JSON (indented) about 0.4 s and the process's exit
    (freeing the model, OR-Tools' threads) a few tenths more on a loaded machine, hence 40 µs
    per VM (1.05 s measured at load 3-5). The exit alone, once OR-Tools is imported (its native
    library's teardown), took 0.3-0.75 s at load 9-13 against 0.02 s without it, and 1.3-1.5 s
    after a 5,000-VM plan, hence 0.5 s on top (it was 0.2 s: a 10 s plan of 5,000 VMs ended at
    10.05 s at load 8.8).
    """
    return 0.5 + 40e-6 * len(inst.vms)


def make_plan(
    inst: Instance,
    *,
    optimizer: Optimizer = "cpsat",
    time_limit_s: float = 10.0,
    workers: int | None = None,
    hint: Mapping[str, str] | None = None,
    started: float | None = None,
    phases: Mapping[str, float] | None = None,
) -> Plan:
    """The cheapest validated plan found taking `inst` to its target (see module docstring).

    `time_limit_s` is the budget of the whole call, counted from `started` (a
    time.perf_counter() value; default: now), so a caller can include its own parsing.
    `hint` is a viable placement already known (a decision module's, `vjob plan --start`); it
    is one more candidate and CP-SAT's starting point. A hint that is not viable is ignored
    with a warning. `workers`: CP-SAT's, by default one per CPU this process may use (at most
    8). `phases`: the caller's own phases (seconds), reported with the planner's in
    `stats["phases"]`; the planner keeps `answer_reserve` of the budget for printing the plan.
    """
    if optimizer not in ("cpsat", "ffd"):
        raise InputError(f"optimizer = {optimizer!r}: must be cpsat or ffd")
    called = time.perf_counter()
    started = called if started is None else started
    workers = default_workers() if workers is None else workers
    deadline = started + time_limit_s - answer_reserve(inst)
    to_run = inst.to_run()
    ffd, ffd_left = _around_pinned(inst, to_run, first_fit_decreasing)
    ffd_packs = not ffd_left
    warnings: list[str] = []
    stats: dict[str, object] = {"vms": len(inst.vms), "nodes": len(inst.nodes), "to_run": len(to_run)}
    stats["workers"] = workers
    plans: dict[str, Plan] = {}
    errors: list[str] = []
    known = _viable(inst, hint, warnings) if hint else None
    if optimizer == "ffd":
        candidates = _ffd_candidates(inst, ffd if ffd_packs else None, known, warnings)
    else:
        reserve = sequencing_reserve(inst, time_limit_s)
        starts = _heuristic_starts(inst, known, ffd_packs, plans, errors, deadline - reserve)
        stats["heuristics_seconds"] = round(time.perf_counter() - called, 3)
        ffd_start = ffd if ffd_packs else None
        ends = (deadline - reserve, deadline)
        candidates = _cpsat_candidates(inst, starts, ffd_start, stats, warnings, ends, time_limit_s, workers)
    slowest = _sequence_candidates(inst, candidates, plans, errors, stats, deadline)
    # Cheapest first; on a tie, the earlier candidate (CP-SAT's before the heuristics').
    ranked = [plans[name] for name, _ in candidates if name in plans]
    best = min(ranked, key=lambda p: p.cost, default=None)
    if best is None:
        # A placement exists but no candidate could be ordered (e.g. FFD's only placement has a
        # migration cycle with no pivot): a sequencing failure, which callers tell from a bug.
        raise SequencingError("no viable sequence of actions for any placement found: " + "; ".join(errors))
    if optimizer == "cpsat" and len(best.pools) > 1:
        best = _improve(inst, best, stats, deadline, slowest)
    done = time.perf_counter()
    stats["seconds"] = round(done - started, 3)
    stats["phases"] = _phases(stats, phases or {}, done - called)
    stats["done_epoch"] = round(time.time(), 3)  # for a caller timing the answer (bench/planner_scale.py)
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


def _phases(stats: Mapping[str, object], before: Mapping[str, float], call: float) -> dict[str, float]:
    """Seconds per phase: the caller's (start-up, parse), then heuristics, model, solver, the rest."""
    out = {k: round(float(v), 3) for k, v in before.items()}
    parts = {k: float(stats.get(s, 0.0)) for k, s in (("heuristics", "heuristics_seconds"),)}  # type: ignore[arg-type]
    parts["model_build"] = float(stats.get("cpsat_build_seconds", 0.0))  # type: ignore[arg-type]
    parts["solve"] = float(stats.get("cpsat_solve_seconds", 0.0))  # type: ignore[arg-type]
    parts["sequencing"] = max(0.0, call - sum(parts.values()))
    return out | {k: round(v, 3) for k, v in parts.items()}


def _ffd_candidates(
    inst: Instance, ffd: Placement | None, known: Placement | None, warnings: list[str]
) -> list[tuple[str, Placement]]:
    """`--optimizer ffd`: FFD's placement (None when it cannot pack), else the hint's, else no plan."""
    if ffd is not None:
        return [("ffd", ffd)]
    if known is not None:
        warnings.append("first-fit decreasing cannot pack the VMs to run: the hint placement is used")
        return [("hint", known)]
    raise NoViablePlacementError(explain(inst, proven=False) + " (first-fit decreasing)")


def _heuristic_starts(
    inst: Instance,
    known: Placement | None,
    ffd_packs: bool,
    plans: dict[str, Plan],
    errors: list[str],
    deadline: float,
) -> list[tuple[str, Placement]]:
    """Fast heuristic starts (each viable), their plans put in `plans`, ranked by those plans' cost.

    `staged` (preemption.planner.staged) is the one built for the pools; it gives up at `deadline`.
    """
    starts: list[tuple[str, Placement]] = []
    heuristics = (
        ("staged", lambda: staged_placement(inst, deadline=deadline)),
        ("keep-in-place", lambda: keep_in_place(inst)),
        ("sticky", lambda: sticky_pack(inst)),
    )
    for name, heuristic in heuristics:
        placed, left = heuristic()
        if not left:
            starts.append((name, placed))
    if known is not None:
        starts += [("hint", known), ("hint+home", move_home(inst, known))]
    if not starts and not ffd_packs:
        placed, left = _around_pinned(inst, inst.to_run(), pack)
        if not left:
            starts.append(("pack", move_home(inst, placed)))
    for name, placed in starts:
        plan = _sequenced(inst, placed, name, errors)
        if plan is not None:
            plans[name] = plan
    starts.sort(key=lambda s: plans[s[0]].cost if s[0] in plans else float("inf"))
    return starts


def _cpsat_candidates(
    inst: Instance,
    starts: list[tuple[str, Placement]],
    ffd: Placement | None,
    stats: dict[str, object],
    warnings: list[str],
    deadlines: tuple[float, float],
    time_limit_s: float,
    workers: int,
) -> list[tuple[str, Placement]]:
    """CP-SAT's placement (until the first deadline, from the starts), then the starts, FFD's and early
    variants (these only in the first half of the time left for sequencing, before the second deadline)."""
    deadline, final = deadlines
    hints = [p for _, p in starts] + ([] if ffd is None else [ffd])
    result = cpsat_placement(
        inst,
        deadline=deadline,
        hints=hints,
        workers=workers,
        reduce=bool(hints),
        extra_candidates=6 if hints else 16,
    )
    placement, status = result.placement, result.status
    stats.update(
        {"cpsat_status": status, "cpsat_bound": result.bound, **{f"cpsat_{k}": v for k, v in result.stats.items()}}
    )
    candidates: list[tuple[str, Placement]] = []
    if placement is not None:
        candidates.append(("cpsat", placement))
    elif status == "INFEASIBLE" and result.full:
        raise NoViablePlacementError(explain(inst, proven=True))
    else:
        msg = f"CP-SAT found no placement within the {time_limit_s:g} s budget (status {status}): falling back"
        warnings.append(msg)
        log.get("planner").warning("cpsat_fallback", status=status, time_limit_s=time_limit_s)
    candidates += starts
    if ffd is not None:
        candidates.append(("ffd", ffd))
    if not candidates:
        raise NoViablePlacementError(explain(inst, proven=False))
    # Variants of the first two placements with the VMs that would wait moved to roomier nodes
    # (0.2 s each at 30,000 VMs): only while the budget for sequencing is not spent.
    for name, p in candidates[:2]:
        if time.perf_counter() < final - 0.5 * (final - deadline):
            candidates.append((f"{name}+early", pull_early(inst, p)))
    return candidates


def _sequence_candidates(
    inst: Instance,
    candidates: list[tuple[str, Placement]],
    plans: dict[str, Plan],
    errors: list[str],
    stats: dict[str, object],
    deadline: float,
) -> float:
    """Put in `plans` the plan of every candidate not planned yet, while the budget lasts; the slowest's seconds."""
    skipped = 0
    slowest = 0.0  # the longest candidate so far: one more is started only if it fits the budget
    for name, placement in candidates:
        if name in plans:
            continue
        t0 = time.perf_counter()
        if plans and t0 + slowest > deadline:
            skipped += 1
            continue
        plan = _sequenced(inst, placement, name, errors)
        slowest = max(slowest, time.perf_counter() - t0)
        if plan is not None:
            plans[name] = plan
    if skipped:
        stats["candidates_skipped"] = skipped  # the budget ran out before their plans
    for name, plan in plans.items():
        stats[f"cost_{name}"] = plan.cost
    return slowest


def _improve(inst: Instance, best: Plan, stats: dict[str, object], deadline: float, slowest: float) -> Plan:
    """The improvement phase on the cheapest plan: dear actions deferred, then actions pulled forward.

    `slowest` (one candidate's sequencing and validation) is the time kept to validate the result.
    """
    # The deferral leaves time for the improvement phase and its validation.
    best = _defer_dear_actions(inst, best, stats, deadline - 2 * slowest - 0.01)
    stats["cost_before_pull"] = best.cost
    t0 = time.perf_counter()
    # It stops early enough to validate its result within the budget (a validation takes
    # less than the slowest candidate's sequencing and validation).
    pulled = pull_forward(inst, best, deadline - slowest - 0.01)
    if pulled is not best:
        validate(inst, pulled)
        stats[f"cost_{best.optimizer}_pulled"] = pulled.cost
        stats["pulled_forward"] = pulled.stats["pulled_forward"]
        best = pulled
    stats["pull_seconds"] = round(time.perf_counter() - t0, 3)
    return best


def _around_pinned(
    inst: Instance,
    vms: list[VMSpec],
    fill: Callable[[Sequence[NodeSpec], Sequence[VMSpec], Load], tuple[Placement, list[VMSpec]]],
) -> tuple[Placement, list[VMSpec]]:
    """A packing heuristic blind to where VMs are (`fill`: FFD, `pack`), run on top of the pinned VMs kept home."""
    placed, used, rest, left = pinned_home(inst, vms)
    more, missed = fill(inst.nodes, rest, used)
    return {**placed, **more}, left + missed


def _sequenced(inst: Instance, placement: Placement, name: str, errors: list[str]) -> Plan | None:
    """The validated plan of one candidate placement, or None (with the reason in `errors`)."""
    try:
        plan = build_plan(inst, placement, optimizer=name)
    except SequencingError as exc:
        errors.append(f"{name}: {exc}")
        return None
    validate(inst, plan)
    return plan


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
    moved = [vm.id for vm in to_run if vm.pinned and hint[vm.id] != vm.host]
    if moved:
        warnings.append(f"hint ignored: it moves pinned vm {moved[0]} ({len(moved)} such VM(s))")
        return None
    over = [n for n in nodes if cpu[n] > nodes[n].cpu or mem[n] > nodes[n].mem]
    if over:
        warnings.append(f"hint ignored: it overloads node {over[0]} ({len(over)} such node(s))")
        return None
    return {vm.id: hint[vm.id] for vm in to_run}


def _defer_dear_actions(inst: Instance, plan: Plan, stats: dict[str, object], deadline: float) -> Plan:
    """The same placement sequenced with dear actions held back to later pools, if that is cheaper.

    Why: a pool costs as much as its dearest action and every later action pays for it, so
    one remote resume of a big VM in the first pool can make a thousand later actions wait
    longer. Each distinct action cost is tried as the threshold (dearest first, while the
    budget lasts); the validator checks the winner.
    """
    mem = {v.id: v.mem for v in inst.vms}
    thresholds = sorted({local_cost(a, mem[a.vm]) for a in plan.actions}, reverse=True)[1:]
    best = plan
    slowest = 0.0  # one more threshold only if it and the winner's validation fit the budget
    for limit in thresholds:
        t0 = time.perf_counter()
        if t0 + 3 * slowest > deadline:  # the build, the validation, a margin for a busy machine
            stats["defer_thresholds_skipped"] = True
            break
        try:
            candidate = build_plan(inst, plan.placement, optimizer=plan.optimizer, defer_above=limit)
        except SequencingError:
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - t0)
        if candidate.cost < best.cost:
            best = candidate
            stats["defer_above"] = limit
    if best is not plan:
        validate(inst, best)
        stats[f"cost_{plan.optimizer}_deferred"] = best.cost
    return best
