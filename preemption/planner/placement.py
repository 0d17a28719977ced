"""Choosing the target placement: first-fit decreasing, a keep-in-place greedy, CP-SAT, repairs.

Why several: FFD is the paper's baseline (it packs the VMs to run from scratch, blind to where
they are, so it migrates and resumes remotely a lot); the keep-in-place greedy gives CP-SAT a
cheap first solution (its hint); CP-SAT then searches placements that minimise the sum of the
actions' own costs (keep running VMs where they are, resume where the state lies) plus a
charge for arrivals that must wait for a later pool, within the time limit. On large
instances every VM is offered only a few candidate nodes (its own, the nodes the heuristics
chose, and the emptiest ones), which keeps the model linear in the number of VMs while the
heuristics' solutions remain inside it. Two repairs improve a viable placement without
breaking it: `move_home` (VMs back where they are) and `pull_early` (VMs that would wait
moved to nodes with room at once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from preemption.planner.instance import Instance, NodeSpec, VMSpec
from vjob.model import VJobState

Placement = dict[str, str]
FULL_MODEL_LIMIT = 5_000
"""Above this many (VM, node) pairs, CP-SAT is offered a few candidate nodes per VM only."""


def _order(vms: Iterable[VMSpec]) -> list[VMSpec]:
    """Decreasing memory then CPU demand (the paper's FFD order), ties by id for determinism."""
    return sorted(vms, key=lambda v: (-v.mem, -v.cpu, v.id))


def first_fit_decreasing(
    nodes: Sequence[NodeSpec],
    vms: Iterable[VMSpec],
    used: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[Placement, list[VMSpec]]:
    """Place `vms` on the first node with room, biggest first; returns (placement, VMs left out)."""
    ids = [n.id for n in nodes]
    base = used or {}
    free_cpu = np.array([n.cpu - base.get(n.id, (0, 0))[0] for n in nodes], dtype=np.int64)
    free_mem = np.array([n.mem - base.get(n.id, (0, 0))[1] for n in nodes], dtype=np.int64)
    out: Placement = {}
    left: list[VMSpec] = []
    for vm in _order(vms):
        fits = np.flatnonzero((free_cpu >= vm.cpu) & (free_mem >= vm.mem))
        if fits.size == 0:
            left.append(vm)
            continue
        i = int(fits[0])
        free_cpu[i] -= vm.cpu
        free_mem[i] -= vm.mem
        out[vm.id] = ids[i]
    return out, left


def home(vm: VMSpec) -> str | None:
    """Where placing the VM costs least: its running host, or the node holding its state."""
    return vm.host


def action_cost(vm: VMSpec, node: str) -> int:
    """The local cost of getting `vm` running on `node` (migrate, resume local/remote, run)."""
    if vm.state is VJobState.RUNNING:
        return 0 if node == vm.host else vm.mem
    if vm.state is VJobState.SLEEPING:
        return vm.mem if node == vm.host else 2 * vm.mem
    return 0


def staying_saves(vm: VMSpec) -> int:
    """How much cheaper it is to place `vm` at home than anywhere else."""
    return action_cost(vm, "") - action_cost(vm, vm.host) if vm.host is not None else 0


def keep_in_place(inst: Instance) -> tuple[Placement, list[VMSpec]]:
    """Greedy: every VM to run stays home when it fits there (dearest first); the rest go where room is largest."""
    nodes = inst.node_by_id
    free_cpu = {n.id: n.cpu for n in inst.nodes}
    free_mem = {n.id: n.mem for n in inst.nodes}
    out: Placement = {}
    rest: list[VMSpec] = []
    for vm in sorted(inst.to_run(), key=lambda v: (-staying_saves(v), v.id)):
        h = home(vm)
        if h is not None and h in nodes and free_cpu[h] >= vm.cpu and free_mem[h] >= vm.mem:
            out[vm.id] = h
            free_cpu[h] -= vm.cpu
            free_mem[h] -= vm.mem
        else:
            rest.append(vm)
    left: list[VMSpec] = []
    ids = list(free_cpu)
    cpu_arr = np.array([free_cpu[n] for n in ids], dtype=np.int64)
    mem_arr = np.array([free_mem[n] for n in ids], dtype=np.int64)
    for vm in _order(rest):
        fits = np.flatnonzero((cpu_arr >= vm.cpu) & (mem_arr >= vm.mem))
        if fits.size == 0:
            left.append(vm)
            continue
        # Best fit on memory (then CPU): keep large holes for large VMs; ties to the first node.
        slack = (mem_arr[fits] - vm.mem) * 1024 + (cpu_arr[fits] - vm.cpu)
        i = int(fits[int(np.argmin(slack))])
        cpu_arr[i] -= vm.cpu
        mem_arr[i] -= vm.mem
        out[vm.id] = ids[i]
    return out, left


def move_home(inst: Instance, placement: Placement) -> Placement:
    """Improve a viable placement: move VMs back to their home node while it has room, best savings first.

    Why: a placement found by packing (FFD, the decision module's) ignores where VMs are; on
    a nearly full cluster it may be the only one known, and every VM it sends home saves a
    migration or a remote resume. Each move keeps the placement viable.
    """
    vms = inst.vm_by_id
    free_cpu = {n.id: n.cpu for n in inst.nodes}
    free_mem = {n.id: n.mem for n in inst.nodes}
    out = dict(placement)
    for vm_id, n in out.items():
        free_cpu[n] -= vms[vm_id].cpu
        free_mem[n] -= vms[vm_id].mem
    movable = sorted(
        (vms[v] for v, n in out.items() if vms[v].host is not None and vms[v].host != n and vms[v].host in free_cpu),
        key=lambda vm: (-staying_saves(vm), vm.id),
    )
    changed = True
    while changed:
        changed = False
        for vm in movable:
            home_node = vm.host
            cur = out[vm.id]
            if home_node is None or cur == home_node:
                continue
            if free_cpu[home_node] >= vm.cpu and free_mem[home_node] >= vm.mem:
                free_cpu[home_node] -= vm.cpu
                free_mem[home_node] -= vm.mem
                free_cpu[cur] += vm.cpu
                free_mem[cur] += vm.mem
                out[vm.id] = home_node
                changed = True
    return out


def pull_early(inst: Instance, placement: Placement) -> Placement:
    """Send VMs that would wait for a later pool to nodes that can take them in the first one.

    Why: every action after the first pool pays for the pools before it, so on a crowded
    cluster a placement with chains of VMs waiting for others to leave costs far more than
    the sum of its actions. A VM arriving at a node that has no room for it at the start
    (everything there still counts during the first pool) is moved, if it is not already
    home, to a node with room both at the start and in the end. The result stays viable.
    """
    vms = inst.vm_by_id
    nodes = inst.node_by_id
    start_cpu = {n: 0 for n in nodes}
    start_mem = {n: 0 for n in nodes}
    for vm in inst.vms:
        if vm.state is VJobState.RUNNING and vm.host is not None:
            start_cpu[vm.host] += vm.cpu
            start_mem[vm.host] += vm.mem
    end_cpu = {n: 0 for n in nodes}
    end_mem = {n: 0 for n in nodes}
    for vm_id, n in placement.items():
        end_cpu[n] += vms[vm_id].cpu
        end_mem[n] += vms[vm_id].mem
    out = dict(placement)
    arriving: dict[str, list[VMSpec]] = {}
    for vm_id, n in placement.items():
        vm = vms[vm_id]
        if not (vm.state is VJobState.RUNNING and vm.host == n):
            arriving.setdefault(n, []).append(vm)
    # What each node takes in the first pool: start load plus the arrivals that fit, biggest first.
    first_cpu = dict(start_cpu)
    first_mem = dict(start_mem)
    late: list[tuple[VMSpec, str]] = []
    for n, group in arriving.items():
        for vm in _order(group):
            if first_cpu[n] + vm.cpu <= nodes[n].cpu and first_mem[n] + vm.mem <= nodes[n].mem:
                first_cpu[n] += vm.cpu
                first_mem[n] += vm.mem
            else:
                late.append((vm, n))
    for vm, n in sorted(late, key=lambda pair: (-pair[0].mem, pair[0].id)):
        best: str | None = None
        for m in nodes:
            if m == n:
                continue
            fits_first = first_cpu[m] + vm.cpu <= nodes[m].cpu and first_mem[m] + vm.mem <= nodes[m].mem
            fits_end = end_cpu[m] + vm.cpu <= nodes[m].cpu and end_mem[m] + vm.mem <= nodes[m].mem
            if fits_first and fits_end and (best is None or action_cost(vm, m) < action_cost(vm, best)):
                best = m
                if m == vm.host:
                    break
        if best is None:
            continue
        out[vm.id] = best
        end_cpu[n] -= vm.cpu
        end_mem[n] -= vm.mem
        end_cpu[best] += vm.cpu
        end_mem[best] += vm.mem
        first_cpu[best] += vm.cpu
        first_mem[best] += vm.mem
    return out


def cpsat_placement(
    inst: Instance,
    *,
    time_limit_s: float,
    hints: Sequence[Placement] = (),
    workers: int = 2,
    full_model_limit: int = FULL_MODEL_LIMIT,
    extra_candidates: int = 6,
    seed: int = 0,
) -> tuple[Placement | None, str, float | None]:
    """Minimise Σ local action costs over viable placements; returns (placement, status, bound)."""
    from ortools.sat.python import cp_model

    to_run = inst.to_run()
    if not to_run:
        return {}, "OPTIMAL", 0.0
    node_ids = [n.id for n in inst.nodes]
    full = len(to_run) * len(node_ids) <= full_model_limit
    candidates = _candidates(inst, to_run, hints, extra_candidates) if not full else None

    model = cp_model.CpModel()
    x: dict[tuple[str, str], cp_model.IntVar] = {}
    per_node: dict[str, list[tuple[VMSpec, cp_model.IntVar]]] = {n: [] for n in node_ids}
    objective = []
    for vm in to_run:
        nodes_of_vm = node_ids if candidates is None else candidates[vm.id]
        lits = []
        for n in nodes_of_vm:
            if vm.cpu > inst.node_by_id[n].cpu or vm.mem > inst.node_by_id[n].mem:
                continue
            var = model.new_bool_var(f"x[{vm.id},{n}]")
            x[(vm.id, n)] = var
            per_node[n].append((vm, var))
            lits.append(var)
            cost = action_cost(vm, n)
            if cost:
                objective.append(cost * var)
        model.add_exactly_one(lits)
    for node in inst.nodes:
        items = per_node[node.id]
        if not items:
            continue
        if sum(vm.cpu for vm, _ in items) > node.cpu:
            model.add(sum(vm.cpu * var for vm, var in items if vm.cpu) <= node.cpu)
        if sum(vm.mem for vm, _ in items) > node.mem:
            model.add(sum(vm.mem * var for vm, var in items) <= node.mem)
    # One pool is cheapest: every later pool makes all its actions wait for the dearest action
    # of the pools before. A node can take arrivals in the first pool only if they fit on top
    # of everything on it at the start (VMs being suspended, stopped or migrated away still
    # count). `early[n]` says it does; each arrival at a node that is not early is charged the
    # likely cost of the first pool, which it would have to wait for.
    start_cpu = {n: 0 for n in node_ids}
    start_mem = {n: 0 for n in node_ids}
    for vm in inst.vms:
        if vm.state is VJobState.RUNNING and vm.host is not None:
            start_cpu[vm.host] += vm.cpu
            start_mem[vm.host] += vm.mem
    wait = max(
        [v.mem for v in inst.vms if v.state is VJobState.RUNNING and inst.target_of(v) is VJobState.SLEEPING]
        + [v.mem for v in to_run if v.state is not VJobState.WAITING]
        + [1]
    )
    pool_vars: dict[str, tuple[list[tuple[VMSpec, cp_model.IntVar]], cp_model.IntVar, cp_model.IntVar]] = {}
    for node in inst.nodes:
        arriving = [
            (vm, var) for vm, var in per_node[node.id] if not (vm.state is VJobState.RUNNING and vm.host == node.id)
        ]
        if not arriving:
            continue
        early = model.new_bool_var(f"early[{node.id}]")
        model.add(start_cpu[node.id] + sum(vm.cpu * var for vm, var in arriving) <= node.cpu).only_enforce_if(early)
        model.add(start_mem[node.id] + sum(vm.mem * var for vm, var in arriving) <= node.mem).only_enforce_if(early)
        late = model.new_int_var(0, len(arriving), f"late[{node.id}]")
        model.add(late >= sum(var for _, var in arriving) - len(arriving) * early)
        objective.append(wait * late)
        pool_vars[node.id] = (arriving, early, late)
    model.minimize(sum(objective))
    if hints:
        # A complete hint (placement and the first-pool indicators) lets CP-SAT start from it.
        best = hints[0]
        for (vm_id, n), var in x.items():
            model.add_hint(var, 1 if best.get(vm_id) == n else 0)
        nodes = inst.node_by_id
        for n, (arriving, early, late) in pool_vars.items():
            came = [vm for vm, _ in arriving if best.get(vm.id) == n]
            fits = (
                start_cpu[n] + sum(vm.cpu for vm in came) <= nodes[n].cpu
                and start_mem[n] + sum(vm.mem for vm in came) <= nodes[n].mem
            )
            model.add_hint(early, 1 if fits else 0)
            model.add_hint(late, 0 if fits else len(came))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    if len(to_run) > 2000:
        # Large models: the time goes to presolve (probing, symmetries) before any search;
        # cut it short so the hint is found at once and improved by local search.
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.symmetry_level = 0
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, None
    out: Placement = {}
    for (vm_id, n), var in x.items():
        if solver.boolean_value(var):
            out[vm_id] = n
    return out, name, solver.best_objective_bound


def _candidates(inst: Instance, to_run: list[VMSpec], hints: Sequence[Placement], extra: int) -> dict[str, list[str]]:
    """Per VM: its home, every hint's node, and the `extra` nodes with the most room left by the first hint."""
    free_cpu = {n.id: n.cpu for n in inst.nodes}
    free_mem = {n.id: n.mem for n in inst.nodes}
    vms = inst.vm_by_id
    if hints:
        for vm_id, n in hints[0].items():
            free_cpu[n] -= vms[vm_id].cpu
            free_mem[n] -= vms[vm_id].mem
    roomy = sorted(free_mem, key=lambda n: (-free_cpu[n], -free_mem[n], n))[: max(extra, 1) * 4]
    out: dict[str, list[str]] = {}
    for i, vm in enumerate(to_run):
        cands: list[str] = []
        for n in [home(vm), *(h.get(vm.id) for h in hints)]:
            if n is not None and n not in cands:
                cands.append(n)
        # Spread VMs over the roomy nodes so that not every VM competes for the same few.
        added = 0
        for k in range(len(roomy)):
            n = roomy[(i + k) % len(roomy)]
            if added >= extra:
                break
            if n not in cands:
                cands.append(n)
                added += 1
        out[vm.id] = cands
    return out
