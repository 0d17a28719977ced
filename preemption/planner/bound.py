"""A proven lower bound on the cost of any valid plan for an instance, to measure plans against.

Why a bound of our own: CP-SAT's bound is on its proxy objective (the actions' own costs plus
a charge for the first wait), not on the plan cost the validator checks, and the first bound
the benchmark used (the suspends the target forces plus every resume made locally) ignores
that a VM cannot arrive on a node that is full at the start: such a resume is either remote
(twice its memory) or waits for a later pool, and a later pool pays for every pool before it.
At 200 nodes / 500 VMs that blind spot was nearly all of the 1.4 points between the plans and
the old bound.

Every term below is a lower bound on the cost of one distinct action of any plan the
validator accepts (an action's cost is its local cost plus the cost of the pools before it),
so their sum is a lower bound on the plan cost:

* a VM the target suspends pays at least its memory;
* a vjob to resume has all its resumes in one pool p; `W` = the cost of the pools before p.
  A VM resumed on the node `h` holding its state pays its memory; it needs room on `h` on top
  of everything still on it, so when the VMs running on `h` at the start leave no room for
  it, some of them must have left in pools before p: W is at least the smallest threshold t
  such that the departures of local cost <= t (stop: 0; suspend or migrate: the VM's memory)
  free enough room (`_Waits.on`). A VM resumed elsewhere pays twice its memory, and W is at least
  the same threshold for the roomiest choice of node. Each VM of the vjob pays W. The bound
  takes the cheapest W for the vjob;
* the vjobs that resume without waiting (W = 0) share one pool and the nodes' room at the
  start; a vjob that waits pays W >= the smallest VM's memory, and more after a pool that
  resumed bigger VMs (`_joint_resume_bound`, a small CP-SAT model whose proven objective bound
  is taken: the larger of this and the vjob-by-vjob bound counts);
* a VM to run pays at least the threshold of the node that needs the cheapest departures;
* the VMs that stay running on a node that cannot hold them all at the end (an overloaded
  start) include migrations whose memory covers the excess: the cheapest set of them that
  frees enough (exact for up to 12 VMs on the node, else the larger of the memory excess and
  the fractional knapsack of the CPU excess).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from preemption.planner.instance import Instance, NodeSpec, VMSpec
from vjob.model import VJobState

R, S, W, T = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING, VJobState.TERMINATED
EXACT_MAX_VMS = 12


def lower_bound(inst: Instance, *, time_limit_s: float = 2.0) -> int:
    """No plan taking `inst` to its target costs less than this (see the module docstring).

    `time_limit_s` bounds the small CP-SAT model of the resumes sharing a node's room
    (`_joint_resume_bound`); 0 skips it and keeps the vjob-by-vjob bound.
    """
    on_node: dict[str, list[VMSpec]] = defaultdict(list)
    for v in inst.vms:
        if v.state is R and v.host is not None:
            on_node[v.host].append(v)
    waits = _Waits(inst, on_node)
    total = 0
    resumers: dict[str, list[VMSpec]] = defaultdict(list)
    for v in inst.vms:
        goal = inst.target_of(v)
        if v.state is R and goal is S:
            total += v.mem
        elif v.state is S and goal is R:
            resumers[v.vjob].append(v)
        elif v.state is W and goal is R:
            t = waits.anywhere(v)
            total += int(t) if t < math.inf else 0
    separate = sum(_finite(_resume_bound(vms, waits), vms) for vms in resumers.values())
    joint = _joint_resume_bound(list(resumers.values()), waits, time_limit_s) if time_limit_s > 0 else 0
    total += max(separate, joint)
    for node in inst.nodes:
        staying = [v for v in on_node[node.id] if inst.target_of(v) is R]
        total += _evictions(node, staying)
    return total


def _finite(bound: float, vms: list[VMSpec]) -> int:
    """inf means no plan resumes the vjob (never asked of a feasible target): its local costs then."""
    return int(bound) if bound < math.inf else sum(v.mem for v in vms)


class _Waits:
    """The cheapest departure threshold for one VM to arrive on a node, cached by VM size."""

    def __init__(self, inst: Instance, on_node: dict[str, list[VMSpec]]) -> None:
        self.nodes = inst.node_by_id
        self.all_vms = inst.vms
        self.used = {n: (sum(v.cpu for v in on_node[n]), sum(v.mem for v in on_node[n])) for n in self.nodes}
        # Departures sorted by their local cost: stop 0, suspend or migrate the VM's memory.
        self.departures = {
            n: sorted((0 if inst.target_of(v) is T else v.mem, v.cpu, v.mem) for v in on_node[n]) for n in self.nodes
        }
        self.cache: dict[tuple[str, int, int], float] = {}
        self.anywhere_cache: dict[tuple[int, int], float] = {}

    def on(self, node: str, cpu: int, mem: int) -> float:
        """Smallest t such that the departures from `node` of cost <= t make room for (cpu, mem); inf if none do."""
        key = (node, cpu, mem)
        if key not in self.cache:
            spec = self.nodes[node]
            need_cpu = self.used[node][0] + cpu - spec.cpu
            need_mem = self.used[node][1] + mem - spec.mem
            t: float = math.inf
            if cpu <= spec.cpu and mem <= spec.mem:
                if need_cpu <= 0 and need_mem <= 0:
                    t = 0.0
                else:
                    for cost, c, m in self.departures[node]:
                        need_cpu -= c
                        need_mem -= m
                        if need_cpu <= 0 and need_mem <= 0:
                            t = float(cost)
                            break
            self.cache[key] = t
        return self.cache[key]

    def anywhere(self, v: VMSpec) -> float:
        """The threshold of the node where `v` can arrive after the cheapest departures."""
        key = (v.cpu, v.mem)
        if key not in self.anywhere_cache:
            self.anywhere_cache[key] = min((self.on(n, v.cpu, v.mem) for n in self.nodes), default=math.inf)
        return self.anywhere_cache[key]


def _resume_bound(vms: list[VMSpec], waits: _Waits, *, at_least: float = 0.0) -> float:
    """Lower bound on the cost of the resumes of one vjob, all in one pool after pools costing W.

    `at_least`: only W >= at_least (e.g. 1: the vjob waits for a pool that costs something;
    W is a sum of pool costs, integers). inf when no such W lets every VM arrive somewhere.
    The cost is |vjob| x W plus a step function of W that only decreases at the thresholds,
    so its minimum over W >= at_least is at `at_least` or at a threshold above it.
    """
    local = [waits.on(v.host, v.cpu, v.mem) if v.host is not None else math.inf for v in vms]
    remote = [waits.anywhere(v) for v in vms]
    best = math.inf
    for w in {t for t in local + remote if at_least <= t < math.inf} | {at_least}:
        cost = len(vms) * w
        for v, t_local, t_remote in zip(vms, local, remote, strict=True):
            if t_local <= w:
                cost += v.mem
            elif t_remote <= w:
                cost += 2 * v.mem
            else:
                cost = math.inf
                break
        best = min(best, cost)
    return best


def _joint_resume_bound(vjobs: list[list[VMSpec]], waits: _Waits, time_limit_s: float) -> int:
    """A bound on all the resumes together, where the vjobs that do not wait share the room.

    Why it is still a lower bound. Call *now* the vjobs whose resumes pay W = 0. They resume
    in one same pool p* (a pool holding a resume costs at least its memory, so a later one
    would pay for it), after pools of cost-0 actions only (runs and stops): their local
    resumes onto a node must fit together in its room at the start plus what its stopped VMs
    free. Every other vjob pays W >= 1, and resumes after p* (before it, p* would pay for its
    pool), so W >= the cost of p* >= the memory of any VM resumed in p*: its cost is at
    least `_resume_bound(at_least=that)`. Everything else is relaxed (a remote resume takes no
    room, the suspends' and runs' place in the pools is ignored). CP-SAT's proven objective
    bound of this relaxation is returned, so a time-out still gives a valid (weaker) bound.
    """
    from ortools.sat.python import cp_model  # heavy: ortools

    model = cp_model.CpModel()
    objective: list[tuple[int, object]] = []
    constant = 0
    mems = sorted({v.mem for vms in vjobs for v in vms})
    # A pool that costs anything holds a suspend, migration or resume: at least the smallest VM.
    least = float(min(v.mem for v in waits.all_vms))
    # big[m]: some now vjob resumes a VM of >= m MB (so every waiting vjob pays W >= m).
    big = {m: model.NewBoolVar(f"big{m}") for m in mems}
    room_users: dict[str, list[tuple[object, VMSpec]]] = defaultdict(list)
    for j, vms in enumerate(vjobs):
        waiting = [_resume_bound(vms, waits, at_least=max(least, m)) for m in [least, *mems]]
        if waiting[0] == math.inf:
            waiting[0] = float(sum(v.mem for v in vms))  # no way to wait: it must resume now
        waiting = [min(w, 10**15) for w in waiting]  # inf: that W is impossible for this vjob
        local0 = [v.host is not None and waits.on(v.host, v.cpu, v.mem) == 0 for v in vms]
        can_now = all(ok or waits.anywhere(v) == 0 for v, ok in zip(vms, local0, strict=True))
        constant += int(waiting[0])
        if not can_now:
            now = None
        else:
            now = model.NewBoolVar(f"now{j}")
            # now: 2 x memory each, minus memory for every VM resumed locally; else waiting.
            objective.append((2 * sum(v.mem for v in vms) - int(waiting[0]), now))
            for m in mems:
                if any(v.mem >= m for v in vms):
                    model.AddImplication(now, big[m])
            for k, (v, ok) in enumerate(zip(vms, local0, strict=True)):
                if ok:
                    x = model.NewBoolVar(f"x{j}_{k}")
                    model.AddImplication(x, now)
                    objective.append((-v.mem, x))
                    room_users[v.host or ""].append((x, v))
        # Waiting after a now vjob of >= m MB costs more: big[m] and not now -> pay the step.
        for k, m in enumerate(mems, start=1):
            step = int(waiting[k] - waiting[k - 1])
            if step <= 0:
                continue
            z = model.NewBoolVar(f"z{j}_{m}")
            if now is None:
                model.AddImplication(big[m], z)
            else:
                model.AddBoolOr([big[m].Not(), now, z])
            objective.append((step, z))
    for node, users in room_users.items():
        spec = waits.nodes[node]
        freed = [(c, m) for cost, c, m in waits.departures[node] if cost == 0]
        room_cpu = spec.cpu - waits.used[node][0] + sum(c for c, _ in freed)
        room_mem = spec.mem - waits.used[node][1] + sum(m for _, m in freed)
        model.Add(sum(v.cpu * x for x, v in users) <= room_cpu)
        model.Add(sum(v.mem * x for x, v in users) <= room_mem)
    if not objective:
        return constant
    model.Minimize(sum(c * x for c, x in objective))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0  # nothing proven in time: the caller keeps the vjob-by-vjob bound
    return constant + math.ceil(solver.best_objective_bound - 1e-6)


def _evictions(node: NodeSpec, staying: list[VMSpec]) -> int:
    """The least memory that must migrate off `node` so that the VMs left running on it fit."""
    ex_cpu = sum(v.cpu for v in staying) - node.cpu
    ex_mem = sum(v.mem for v in staying) - node.mem
    if ex_cpu <= 0 and ex_mem <= 0:
        return 0
    if len(staying) <= EXACT_MAX_VMS:
        best = math.inf
        for k in range(1, len(staying) + 1):
            for moved in itertools.combinations(staying, k):
                if sum(v.cpu for v in moved) >= ex_cpu and sum(v.mem for v in moved) >= ex_mem:
                    best = min(best, sum(v.mem for v in moved))
        return int(best) if best < math.inf else 0
    frac = 0.0  # fractional knapsack: cover the CPU excess with the least memory per CPU first
    left = float(ex_cpu)
    for v in sorted((v for v in staying if v.cpu > 0), key=lambda v: v.mem / v.cpu):
        if left <= 0:
            break
        take = min(1.0, left / v.cpu)
        frac += take * v.mem
        left -= take * v.cpu
    return max(ex_mem, math.floor(frac), 0)
