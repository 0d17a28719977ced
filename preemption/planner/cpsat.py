"""CP-SAT placement over the VMs that must move (Entropy's reduction), built from arrays.

Why a reduced model: a running VM that stays running on a node its staying neighbours do not
overload needs no action, and a starting placement that leaves it there is viable; such VMs
are fixed in place and only take capacity, as Entropy does. Variables exist only for the VMs
that must move: those to run or resume, those on nodes their staying neighbours overload, and
those the starting placement (the hint) moves. Each of them is offered every node on small
instances, or, above `full_model_limit` (VM, node) pairs, its home, the hints' nodes and a
few of the roomiest nodes; the hint stays inside the model, so the model is never infeasible
when a hint is given. The model's arrays (candidate edges, costs, demands) are computed with
numpy; Python only walks the edges once to create the variables.

The objective is the sum of the actions' own costs (stay = 0, migrate = memory, resume local =
memory, remote = 2 × memory) plus, on every node whose arrivals do not fit on top of all it
holds at the start, a charge per arrival for the first pool it would wait for.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from preemption.planner.instance import Instance, VMSpec
from preemption.planner.placement import Placement
from vjob.model import VJobState

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

FULL_MODEL_LIMIT = 10_000
"""Up to this many (movable VM, node) pairs every movable VM is offered every node."""


@dataclass(frozen=True)
class CpsatResult:
    """What the solver found: a placement (None if nothing in time), its status and bound, model figures."""

    placement: Placement | None
    status: str
    bound: float | None = None
    objective: float | None = None
    stats: Mapping[str, float] = field(default_factory=dict)
    full: bool = False
    """Every VM to run was a variable offered every node (an INFEASIBLE status is then a proof)."""


def split_movable(
    inst: Instance, to_run: Sequence[VMSpec], start: Placement | None
) -> tuple[list[VMSpec], list[VMSpec]]:
    """(movable, fixed): a running VM stays fixed at home unless its node is overloaded or `start` moves it."""
    node_by_id = inst.node_by_id
    stay_cpu: dict[str, int] = {}
    stay_mem: dict[str, int] = {}
    for vm in to_run:
        if vm.state is VJobState.RUNNING and vm.host is not None:
            stay_cpu[vm.host] = stay_cpu.get(vm.host, 0) + vm.cpu
            stay_mem[vm.host] = stay_mem.get(vm.host, 0) + vm.mem
    overloaded = {n for n in stay_cpu if stay_cpu[n] > node_by_id[n].cpu or stay_mem[n] > node_by_id[n].mem}
    movable: list[VMSpec] = []
    fixed: list[VMSpec] = []
    for vm in to_run:
        stays = (
            vm.state is VJobState.RUNNING
            and vm.host not in overloaded
            and (start is None or start.get(vm.id) == vm.host)
        )
        (fixed if stays else movable).append(vm)
    return movable, fixed


def cpsat_placement(
    inst: Instance,
    *,
    deadline: float,
    hints: Sequence[Placement] = (),
    workers: int = 2,
    full_model_limit: int = FULL_MODEL_LIMIT,
    extra_candidates: int = 6,
    reduce: bool = True,
    seed: int = 0,
) -> CpsatResult:
    """Minimise the objective above over viable placements, until `deadline` (time.perf_counter()).

    `hints[0]`, when given, must be viable: it fixes which running VMs may stay out of the
    model and is CP-SAT's starting solution; the other hints only add candidate nodes.
    `reduce=False` makes every VM to run a variable (when no viable start is known, fixing
    the running VMs in place could make the model infeasible).
    """
    # OR-Tools is the optional heavy dependency of the `planner` extra: imported on use.
    from ortools.sat.python import cp_model

    built = time.perf_counter()
    to_run = inst.to_run()
    if not to_run:
        return CpsatResult({}, "OPTIMAL", 0.0, 0.0, full=True)
    start = hints[0] if hints else None
    movable, fixed = split_movable(inst, to_run, start) if reduce else (list(to_run), [])
    nodes = _node_arrays(inst, fixed)
    out: Placement = {vm.id: vm.host for vm in fixed if vm.host is not None}
    if not movable:
        return CpsatResult(out, "OPTIMAL", 0.0, 0.0, {"movable": 0, "pairs": 0}, full=not fixed)
    edges = _edges(movable, hints, nodes, full_model_limit, extra_candidates)
    built_model = _build_model(cp_model.CpModel(), inst, to_run, edges, nodes)
    if built_model is None:
        stats = {"movable": len(movable), "pairs": edges.size}
        return CpsatResult(None, "INFEASIBLE", None, None, stats, full=edges.full)
    if start is not None:
        _add_hints(built_model, movable, start, edges, nodes)
    stats = {"movable": len(movable), "pairs": edges.size, "build_seconds": round(time.perf_counter() - built, 3)}
    full = edges.full and not fixed
    left = deadline - time.perf_counter()
    if left <= 0.05:
        return CpsatResult(None, "NOT_RUN (time budget spent)", None, None, stats, full=full)
    return _solve(built_model, movable, edges, nodes, out, stats, full, left=left, workers=workers, seed=seed)


@dataclass(frozen=True)
class _Nodes:
    """The nodes as arrays: capacities, the room the fixed VMs leave, the load held at the start."""

    ids: list[str]
    index: dict[str, int]
    cap_cpu: np.ndarray
    cap_mem: np.ndarray
    free_cpu: np.ndarray
    free_mem: np.ndarray
    start_cpu: np.ndarray
    """Every running VM's load on its node, VMs leaving it included (they count during the first pool)."""
    start_mem: np.ndarray


def _node_arrays(inst: Instance, fixed: Sequence[VMSpec]) -> _Nodes:
    """The node arrays of `inst` with the `fixed` VMs' load taken off the free room."""
    node_ids = [n.id for n in inst.nodes]
    index = {n: i for i, n in enumerate(node_ids)}
    cap_cpu = np.array([n.cpu for n in inst.nodes], dtype=np.int64)
    cap_mem = np.array([n.mem for n in inst.nodes], dtype=np.int64)
    free_cpu = cap_cpu.copy()
    free_mem = cap_mem.copy()
    for vm in fixed:
        assert vm.host is not None
        free_cpu[index[vm.host]] -= vm.cpu
        free_mem[index[vm.host]] -= vm.mem
    start_cpu = np.zeros(len(node_ids), dtype=np.int64)
    start_mem = np.zeros(len(node_ids), dtype=np.int64)
    for vm in inst.vms:
        if vm.state is VJobState.RUNNING and vm.host is not None:
            start_cpu[index[vm.host]] += vm.cpu
            start_mem[index[vm.host]] += vm.mem
    return _Nodes(node_ids, index, cap_cpu, cap_mem, free_cpu, free_mem, start_cpu, start_mem)


@dataclass(frozen=True)
class _Edges:
    """The (movable VM, node) pairs the model may choose, grouped by VM, and what each costs."""

    vm_of: np.ndarray
    node_of: np.ndarray
    cpu: np.ndarray
    """Per movable VM (index by `vm_of`), as `mem`."""
    mem: np.ndarray
    cost: np.ndarray
    """Per edge: the action's own cost (stay 0, migrate memory, resume local memory, remote twice)."""
    arrival: np.ndarray
    """Per edge: the VM arrives on the node (all but a running VM staying home)."""
    full: bool
    """Every movable VM was offered every node."""

    @property
    def size(self) -> int:
        """The number of edges, hence of the model's Boolean variables."""
        return int(self.vm_of.size)


def _edges(
    movable: Sequence[VMSpec], hints: Sequence[Placement], nodes: _Nodes, full_model_limit: int, extra: int
) -> _Edges:
    """Every node for each movable VM on small instances, else the candidates; minus those that cannot hold it."""
    m = len(movable)
    n_nodes = len(nodes.ids)
    cpu = np.array([vm.cpu for vm in movable], dtype=np.int64)
    mem = np.array([vm.mem for vm in movable], dtype=np.int64)
    home = np.array([nodes.index[vm.host] if vm.host is not None else -1 for vm in movable], dtype=np.int64)
    running = np.array([vm.state is VJobState.RUNNING for vm in movable])
    sleeping = np.array([vm.state is VJobState.SLEEPING for vm in movable])
    full = m * n_nodes <= full_model_limit
    if full:
        vm_of = np.repeat(np.arange(m), n_nodes)
        node_of = np.tile(np.arange(n_nodes), m)
    else:
        vm_of, node_of = _candidate_edges(movable, hints, nodes.index, home, nodes.free_cpu, nodes.free_mem, extra)
    # Drop the edges to nodes that cannot hold the VM even empty of every movable VM, and a
    # pinned VM's edges to any node but its own.
    pinned = np.array([vm.pinned for vm in movable])
    keep = (cpu[vm_of] <= nodes.free_cpu[node_of]) & (mem[vm_of] <= nodes.free_mem[node_of])
    keep &= ~pinned[vm_of] | (node_of == home[vm_of])
    vm_of, node_of = vm_of[keep], node_of[keep]
    at_home = node_of == home[vm_of]
    cost = np.where(
        running[vm_of],
        np.where(at_home, 0, mem[vm_of]),
        np.where(sleeping[vm_of], np.where(at_home, mem[vm_of], 2 * mem[vm_of]), 0),
    )
    arrival = ~(running[vm_of] & at_home)
    return _Edges(vm_of, node_of, cpu, mem, cost, arrival, full)


@dataclass
class _Model:
    """The CP-SAT model, its edge literals and, per node that may be late, (early, late, arrival edges)."""

    model: cp_model.CpModel
    x: list[cp_model.IntVar]
    early_of: dict[int, tuple[cp_model.IntVar, cp_model.IntVar, np.ndarray]]


def _build_model(
    model: cp_model.CpModel, inst: Instance, to_run: Sequence[VMSpec], edges: _Edges, nodes: _Nodes
) -> _Model | None:
    """`model` filled over `edges` with its objective; None when a movable VM has no edge left."""
    from ortools.sat.python import cp_model

    x = [model.new_bool_var("") for _ in range(edges.size)]
    m = len(edges.cpu)
    # Edges are grouped by VM (generated VM by VM): one node per VM.
    bounds = np.searchsorted(edges.vm_of, np.arange(m + 1))
    for i in range(m):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if lo == hi:
            return None
        model.add_exactly_one(x[lo:hi])
    wait = max(
        [v.mem for v in inst.vms if v.state is VJobState.RUNNING and inst.target_of(v) is VJobState.SLEEPING]
        + [v.mem for v in to_run if v.state is not VJobState.WAITING]
        + [1]
    )
    built = _Model(model, x, {})
    lates = _node_constraints(built, edges, nodes)
    paid = np.flatnonzero(edges.cost)
    objective = cp_model.LinearExpr.weighted_sum([x[e] for e in paid], edges.cost[paid].tolist())
    if lates:
        objective = objective + wait * cp_model.LinearExpr.sum(lates)
    model.minimize(objective)
    return built


def _node_constraints(built: _Model, edges: _Edges, nodes: _Nodes) -> list[cp_model.IntVar]:
    """Every node's capacity, and its early/late switch when its arrivals may not fit at once; the lates."""
    from ortools.sat.python import cp_model

    model, x = built.model, built.x
    cpu, mem, vm_of = edges.cpu, edges.mem, edges.vm_of
    by_node = np.argsort(edges.node_of, kind="stable")
    node_bounds = np.searchsorted(edges.node_of[by_node], np.arange(len(nodes.ids) + 1))
    lates: list[cp_model.IntVar] = []
    for j in range(len(nodes.ids)):
        node_edges = by_node[node_bounds[j] : node_bounds[j + 1]]
        if node_edges.size == 0:
            continue
        lits = [x[e] for e in node_edges]
        e_cpu = cpu[vm_of[node_edges]]
        e_mem = mem[vm_of[node_edges]]
        if e_cpu.sum() > nodes.free_cpu[j]:
            model.add(cp_model.LinearExpr.weighted_sum(lits, e_cpu.tolist()) <= int(nodes.free_cpu[j]))
        if e_mem.sum() > nodes.free_mem[j]:
            model.add(cp_model.LinearExpr.weighted_sum(lits, e_mem.tolist()) <= int(nodes.free_mem[j]))
        arr = node_edges[edges.arrival[node_edges]]
        if arr.size == 0:
            continue
        a_cpu = cpu[vm_of[arr]]
        a_mem = mem[vm_of[arr]]
        room_cpu = int(nodes.cap_cpu[j] - nodes.start_cpu[j])
        room_mem = int(nodes.cap_mem[j] - nodes.start_mem[j])
        if a_cpu.sum() <= room_cpu and a_mem.sum() <= room_mem:
            continue  # every arrival fits at once: the node is always early
        a_lits = [x[e] for e in arr]
        early = model.new_bool_var("")
        model.add(cp_model.LinearExpr.weighted_sum(a_lits, a_cpu.tolist()) <= room_cpu).only_enforce_if(early)
        model.add(cp_model.LinearExpr.weighted_sum(a_lits, a_mem.tolist()) <= room_mem).only_enforce_if(early)
        late = model.new_int_var(0, int(arr.size), "")
        model.add(late >= cp_model.LinearExpr.sum(a_lits) - int(arr.size) * early)
        lates.append(late)
        built.early_of[j] = (early, late, arr)
    return lates


def _add_hints(built: _Model, movable: Sequence[VMSpec], start: Placement, edges: _Edges, nodes: _Nodes) -> None:
    """`start` as CP-SAT's starting solution: its edges, and each node's early/late switch under it."""
    chosen = np.array([nodes.index.get(start.get(vm.id, ""), -1) for vm in movable], dtype=np.int64)
    picked = chosen[edges.vm_of] == edges.node_of
    for e in range(edges.size):
        built.model.add_hint(built.x[e], bool(picked[e]))
    for j, (early, late, arr) in built.early_of.items():
        came = arr[picked[arr]]
        fits = (
            nodes.start_cpu[j] + edges.cpu[edges.vm_of[came]].sum() <= nodes.cap_cpu[j]
            and nodes.start_mem[j] + edges.mem[edges.vm_of[came]].sum() <= nodes.cap_mem[j]
        )
        built.model.add_hint(early, bool(fits))
        built.model.add_hint(late, 0 if fits else int(came.size))


def _solve(
    built: _Model,
    movable: Sequence[VMSpec],
    edges: _Edges,
    nodes: _Nodes,
    out: Placement,
    stats: dict[str, float],
    full: bool,
    *,
    left: float,
    workers: int,
    seed: int,
) -> CpsatResult:
    """Run CP-SAT for `left` seconds; `out` (the fixed VMs) completed with the movable VMs' nodes."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(left)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    if len(movable) > 2000:
        # Large models: the time goes to presolve (probing, symmetries) before any search;
        # cut it short so the hint is found at once and improved by local search.
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.symmetry_level = 0
    status = solver.solve(built.model)
    name = solver.status_name(status)
    stats["solve_seconds"] = round(solver.wall_time, 3)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpsatResult(None, name, None, None, stats, full=full)
    values = np.fromiter((solver.boolean_value(v) for v in built.x), dtype=bool, count=edges.size)
    for e in np.flatnonzero(values):
        out[movable[int(edges.vm_of[e])].id] = nodes.ids[int(edges.node_of[e])]
    return CpsatResult(out, name, solver.best_objective_bound, solver.objective_value, stats, full=full)


def _candidate_edges(
    movable: Sequence[VMSpec],
    hints: Sequence[Placement],
    index: Mapping[str, int],
    home: np.ndarray,
    free_cpu: np.ndarray,
    free_mem: np.ndarray,
    extra: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(vm index, node index) per edge, grouped by VM: home, every hint's node, `extra` roomy nodes.

    The roomy nodes are those with the most room left by the fixed VMs and the first hint,
    handed out in turn so that not every VM competes for the same few.
    """
    m = len(movable)
    cpu_left = free_cpu.copy()
    mem_left = free_mem.copy()
    if hints:
        for vm in movable:
            n = hints[0].get(vm.id)
            if n is not None and n in index:
                cpu_left[index[n]] -= vm.cpu
                mem_left[index[n]] -= vm.mem
    n_roomy = min(len(cpu_left), max(extra, 1) * 4)
    roomy = np.lexsort((np.arange(len(cpu_left)), -mem_left, -cpu_left))[:n_roomy]
    cols = [home]
    for h in hints:
        cols.append(np.array([index.get(h.get(vm.id, ""), -1) for vm in movable], dtype=np.int64))
    for k in range(min(extra, n_roomy)):
        cols.append(roomy[(np.arange(m) + k) % n_roomy])
    table = np.stack(cols, axis=1)  # m × candidates, -1 for none
    # One edge per distinct node per VM, in VM order.
    table = np.sort(table, axis=1)
    distinct = np.ones_like(table, dtype=bool)
    distinct[:, 1:] = table[:, 1:] != table[:, :-1]
    distinct &= table >= 0
    vm_of = np.repeat(np.arange(m), distinct.sum(axis=1))
    return vm_of, table[distinct]
