"""An independent check of any plan: replay it pool by pool and prove it safe.

Why independent of the planner: a plan that overloads a node during a context switch kills
jobs or the node, so no plan may reach the executor on the planner's word alone. This module
shares nothing with sequencing.py but the input and plan types and the cost function; it
replays every pool from the starting configuration and checks that

* a pinned VM never arrives anywhere but its own node (no migration, no remote resume);
* each action applies to a VM in the right state and place (run a waiting VM, resume a
  sleeping one from the node holding its state, migrate/suspend/stop a running one where it
  runs), with at most one action per VM in a pool;
* every node that receives VMs in a pool has room for them on top of everything on it during
  the pool (a migrating VM counts on both ends); a node that receives nothing may stay
  overloaded until it is relieved, as the starting configuration may be;
* the suspends of one vjob share a pool, and so do its resumes; a suspend is a cut of the
  whole vjob: it takes every VM of the vjob running in that pool (one VM suspended while the
  others run would be moved, or woken, apart from them);
* a vjob that moves only whole (`Instance.whole`) is never migrated VM by VM: it moves by one
  cut (suspend all, resume all on their new nodes) or not at all;
* after the last pool every vjob is in its target state, every node is viable, the running
  VMs are where the plan's placement says, and the announced cost is the model's cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from preemption.planner.instance import Instance
from preemption.planner.plan import Plan, PlanAction, plan_cost
from vjob.errors import VjobError
from vjob.model import Action, VJobState


class PlanInvalidError(VjobError):
    """A plan breaks viability, vjob consistency or the end state; the message lists why."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"invalid plan: {shown}{more}")


def validate(inst: Instance, plan: Plan) -> None:
    """Raise PlanInvalidError listing every problem found; return None for a sound plan."""
    replay = _Replay(inst)
    for i, pool in enumerate(plan.pools):
        replay.pool(i, pool)
    problems = replay.problems
    _check_end(inst, plan, replay)
    if not problems:
        expected = plan_cost(plan.pools, {v.id: v.mem for v in inst.vms})
        if expected != plan.cost:
            problems.append(f"cost {plan.cost} announced, the cost model gives {expected}")
    if problems:
        raise PlanInvalidError(problems)


class _Replay:
    """The configuration as the pools change it, from the starting one, and the problems met on the way."""

    def __init__(self, inst: Instance) -> None:
        self.problems: list[str] = []
        self.vms = inst.vm_by_id
        self.nodes = inst.node_by_id
        self.state = {v.id: v.state for v in inst.vms}
        self.where = {v.id: v.host for v in inst.vms}  # running host, or holder of the sleeping state
        self.used_cpu: dict[str, int] = defaultdict(int)
        self.used_mem: dict[str, int] = defaultdict(int)
        for v in inst.vms:
            if v.state is VJobState.RUNNING and v.host is not None:
                self.used_cpu[v.host] += v.cpu
                self.used_mem[v.host] += v.mem
        self.suspend_pool: dict[str, set[int]] = defaultdict(set)
        self.partial_cuts: dict[str, list[str]] = defaultdict(list)
        """Per vjob, the pools that suspended some of its VMs and left others running; reported
        at the end unless its suspends are split over pools (one problem, said that way)."""
        self.resume_pool: dict[str, set[int]] = defaultdict(set)
        self.whole = inst.whole
        self.vjob_vms = {j: [v.id for v in vs] for j, vs in inst.vjobs().items()}

    def pool(self, i: int, pool: Sequence[PlanAction]) -> None:
        """Pool `i`: each action checked and applied, the room on the receiving nodes, then the moves."""
        touched: set[str] = set()
        leaving: list[tuple[str, str]] = []
        arrivals: list[tuple[str, str]] = []
        for a in pool:
            self._action(i, a, touched, leaving, arrivals)
        self._check_cuts(i, pool)
        self._check_room(i, arrivals)
        self._move(leaving, arrivals)

    def _action(
        self,
        i: int,
        a: PlanAction,
        touched: set[str],
        leaving: list[tuple[str, str]],
        arrivals: list[tuple[str, str]],
    ) -> None:
        """One action of pool `i`: its VM and nodes known, one action per VM, the VM ready for it, pins kept."""
        problems = self.problems
        tag = f"pool {i}: {a.kind.value} {a.vm}"
        vm = self.vms.get(a.vm)
        if vm is None:
            problems.append(f"{tag}: unknown vm")
            return
        if a.vm in touched:
            problems.append(f"{tag}: a second action on the same VM in one pool")
            return
        touched.add(a.vm)
        for n in (a.src, a.dst):
            if n is not None and n not in self.nodes:
                problems.append(f"{tag}: unknown node {n!r}")
        if a.kind is Action.MIGRATE and vm.vjob in self.whole:
            problems.append(
                f"{tag}: vjob {vm.vjob} moves only whole (one cut of all its VMs), not VM by VM: a partial move"
            )
        if not self._apply(i, a, vm.vjob, leaving, arrivals):
            problems.append(f"{tag}: the VM is not {_expected(a.kind)} at {a.src!r} before this pool")
        if vm.pinned and a.dst is not None and a.dst != vm.host:
            problems.append(f"{tag}: the VM is pinned to {vm.host}, the plan moves it to {a.dst}")

    def _apply(
        self, i: int, a: PlanAction, vjob: str, leaving: list[tuple[str, str]], arrivals: list[tuple[str, str]]
    ) -> bool:
        """The action's new state for its VM, its arrival and departure; whether the VM was ready for it."""
        state, where = self.state, self.where
        if a.kind is Action.RUN:
            ok = state[a.vm] is VJobState.WAITING
            arrivals.append((a.vm, a.dst or ""))
            state[a.vm] = VJobState.RUNNING
        elif a.kind is Action.RESUME:
            ok = state[a.vm] is VJobState.SLEEPING and where[a.vm] == a.src
            arrivals.append((a.vm, a.dst or ""))
            self.resume_pool[vjob].add(i)
            state[a.vm] = VJobState.RUNNING
        elif a.kind is Action.MIGRATE:
            ok = state[a.vm] is VJobState.RUNNING and where[a.vm] == a.src and a.src != a.dst
            leaving.append((a.vm, a.src or ""))
            arrivals.append((a.vm, a.dst or ""))
        else:  # stop, suspend
            ok = state[a.vm] is VJobState.RUNNING and where[a.vm] == a.src
            leaving.append((a.vm, a.src or ""))
            if a.kind is Action.SUSPEND:
                self.suspend_pool[vjob].add(i)
                state[a.vm] = VJobState.SLEEPING
            else:
                state[a.vm] = VJobState.TERMINATED
        return ok

    def _check_cuts(self, i: int, pool: Sequence[PlanAction]) -> None:
        """A suspend in pool `i` takes every VM of its vjob still running after the pool's
        actions: some VMs saved while the others run on is a partial cut."""
        suspended = {self.vms[a.vm].vjob for a in pool if a.kind is Action.SUSPEND and a.vm in self.vms}
        for vjob in sorted(suspended):
            running = [v for v in self.vjob_vms.get(vjob, []) if self.state[v] is VJobState.RUNNING]
            if running:
                self.partial_cuts[vjob].append(
                    f"pool {i}: vjob {vjob} is suspended with {', '.join(running)} left running: "
                    "a partial cut (a suspend takes all its VMs at once)"
                )

    def _check_room(self, i: int, arrivals: list[tuple[str, str]]) -> None:
        """Every node receiving VMs in pool `i` holds them on top of all it holds during the pool."""
        vms, nodes = self.vms, self.nodes
        arriving_cpu: dict[str, int] = defaultdict(int)
        arriving_mem: dict[str, int] = defaultdict(int)
        for vm_id, node in arrivals:
            if node in nodes:
                arriving_cpu[node] += vms[vm_id].cpu
                arriving_mem[node] += vms[vm_id].mem
        for node in arriving_cpu.keys() | arriving_mem.keys():
            cpu = self.used_cpu[node] + arriving_cpu[node]
            mem = self.used_mem[node] + arriving_mem[node]
            if cpu > nodes[node].cpu or mem > nodes[node].mem:
                self.problems.append(
                    f"pool {i}: node {node} receives VMs while holding cpu {cpu}/{nodes[node].cpu}, "
                    f"mem {mem}/{nodes[node].mem} MB"
                )

    def _move(self, leaving: list[tuple[str, str]], arrivals: list[tuple[str, str]]) -> None:
        """The end of a pool: the leaving VMs' load off their nodes, the arrivals' on theirs."""
        vms, nodes, where = self.vms, self.nodes, self.where
        for vm_id, node in leaving:
            if node in nodes:
                self.used_cpu[node] -= vms[vm_id].cpu
                self.used_mem[node] -= vms[vm_id].mem
        for vm_id, node in arrivals:
            if node in nodes:
                self.used_cpu[node] += vms[vm_id].cpu
                self.used_mem[node] += vms[vm_id].mem
                where[vm_id] = node
        for vm_id, node in leaving:
            if self.state[vm_id] is VJobState.SLEEPING and node in nodes:
                where[vm_id] = node  # the suspended state stays on the node that wrote it


def _check_end(inst: Instance, plan: Plan, replay: _Replay) -> None:
    """After the last pool: each vjob's suspends and resumes in one pool, viable nodes, the target reached."""
    problems, state, where = replay.problems, replay.state, replay.where
    for vjob, pools in replay.suspend_pool.items():
        if len(pools) > 1:
            problems.append(f"vjob {vjob}: its suspends are split over pools {sorted(pools)}")
        else:
            problems.extend(replay.partial_cuts.get(vjob, []))
    for vjob, pools in replay.resume_pool.items():
        if len(pools) > 1:
            problems.append(f"vjob {vjob}: its resumes are split over pools {sorted(pools)}")
    used_cpu, used_mem = replay.used_cpu, replay.used_mem
    for n in inst.nodes:
        if used_cpu[n.id] > n.cpu or used_mem[n.id] > n.mem:
            problems.append(
                f"end: node {n.id} is not viable (cpu {used_cpu[n.id]}/{n.cpu}, mem {used_mem[n.id]}/{n.mem})"
            )
    for v in inst.vms:
        goal = inst.target_of(v)
        if state[v.id] is not goal:
            problems.append(f"end: vm {v.id} of vjob {v.vjob} is {state[v.id].value}, target {goal.value}")
        elif goal is VJobState.RUNNING and plan.placement.get(v.id) != where[v.id]:
            problems.append(f"end: vm {v.id} runs on {where[v.id]}, the placement says {plan.placement.get(v.id)}")
    extra = set(plan.placement) - {v.id for v in inst.vms if inst.target_of(v) is VJobState.RUNNING}
    if extra:
        problems.append(f"placement names VMs that are not to run: {', '.join(sorted(extra))}")


def _expected(kind: Action) -> str:
    """The state and place a VM must be in for an action of `kind`, as the problem message says it."""
    return {
        Action.RUN: "waiting",
        Action.RESUME: "sleeping with its state",
        Action.MIGRATE: "running",
        Action.STOP: "running",
        Action.SUSPEND: "running",
    }[kind]
