"""The control loop's decision: which vjobs run, and where, from the CPU demand measured.

Why measured demand and not the requested size: the Entropy paper's gain comes from VMs that do
not compute all the time (a vjob of 9 VMs whose phases leave most of them idle). Planning with
the requested size keeps a CPU per VM booked while it waits on its neighbours; planning with
what each VM used over the last interval lets idle VMs share a node and more vjobs run, and
shows a node whose VMs all compute at once as overloaded: the planner relieves it (its plan
must end with every node viable), by migration when another node has room.

Everything here is a pure function of the observed state (nodes, each VM's place, state,
memory and CPU counters) and the queue: the agent (agent.consolidate) and the simulator both
call it, and a test can replay any state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from preemption.decisions import Selection, fcfs_selection, ubis_selection
from preemption.planner.instance import Instance, NodeSpec, VMSpec
from preemption.planner.optimizer import Optimizer, make_plan
from preemption.planner.plan import Plan
from vjob.errors import InputError
from vjob.model import VJobState


def cpu_demand(
    cpu_s: float, at: float, prev_cpu_s: float | None, prev_at: float | None, vcpus: int, *, busy: float = 0.5
) -> int:
    """CPUs a VM needs, from two readings of its CPU time (seconds) at two instants.

    A vCPU counts as busy when it used at least `busy` of the interval (the paper's VMs
    compute or idle; a half-busy one is rounded up so it is never starved). Without a previous
    reading (a VM just started or resumed) the VM is taken as fully busy: its requested size.
    """
    if not 0 < busy <= 1:
        raise InputError(f"busy = {busy!r}: must be in (0, 1]")
    if prev_cpu_s is None or prev_at is None or at <= prev_at or cpu_s < prev_cpu_s:
        return vcpus
    used = (cpu_s - prev_cpu_s) / (at - prev_at)
    return max(0, min(vcpus, int(used + 1 - busy)))


@dataclass(frozen=True)
class ObservedVM:
    """One VM as observed: its state, place, memory, requested vCPUs and measured demand."""

    vm: str
    vjob: str
    state: VJobState
    host: str | None
    mem: int
    vcpus: int
    demand: int
    """CPUs it used over the last interval (cpu_demand); a sleeping VM: what it used before."""


@dataclass(frozen=True)
class ControlDecision:
    """The decision of one control step: the instance as measured, the decision module's
    selection, the overloaded nodes, and whether any vjob changes state or place."""

    instance: Instance
    selection: Selection
    overloaded: tuple[str, ...]
    changes: bool


def decide(
    nodes: Sequence[NodeSpec],
    observed: Sequence[ObservedVM],
    queue: Sequence[str],
    *,
    priorities: Mapping[str, float] | None = None,
    terminated: Sequence[str] = (),
) -> ControlDecision:
    """One control step: FCFS over `queue` (arrival order), or UBIS when `priorities` are given.

    Each VM weighs its measured demand, not its requested size; vjobs in `terminated` end.
    """
    vms = tuple(VMSpec(o.vm, o.vjob, o.demand, o.mem, o.state, o.host) for o in observed)
    target = dict.fromkeys(terminated, VJobState.TERMINATED)
    inst = Instance(tuple(nodes), vms, target)
    if priorities is not None:
        selection = ubis_selection(inst, priorities)
    else:
        selection = fcfs_selection(inst, [j for j in queue if j not in target])
    inst = inst.with_target(selection.target)
    moved = any(
        (vm.state is VJobState.RUNNING) != (selection.target[vm.vjob] is VJobState.RUNNING)
        or (vm.state is VJobState.RUNNING and selection.placement.get(vm.id, vm.host) != vm.host)
        for vm in vms
    )
    overloaded = _overloaded(inst)
    return ControlDecision(inst, selection, overloaded, bool(moved or overloaded or target))


def plan_for(decision: ControlDecision, *, optimizer: Optimizer = "cpsat", time_limit_s: float = 2.0) -> Plan | None:
    """The switch to the decision's target (None when nothing changes)."""
    if not decision.changes:
        return None
    plan = make_plan(decision.instance, optimizer=optimizer, time_limit_s=time_limit_s,
                     hint=decision.selection.placement)  # fmt: skip
    return plan if plan.actions else None


def _overloaded(inst: Instance) -> tuple[str, ...]:
    load: dict[str, list[int]] = {n.id: [0, 0] for n in inst.nodes}
    for vm in inst.vms:
        if vm.state is VJobState.RUNNING and vm.host in load:
            load[vm.host][0] += vm.cpu
            load[vm.host][1] += vm.mem
    return tuple(n.id for n in inst.nodes if load[n.id][0] > n.cpu or load[n.id][1] > n.mem)


__all__ = ["ControlDecision", "ObservedVM", "cpu_demand", "decide", "plan_for"]
