"""The control loop's decision: which vjobs run, and where, from the CPU and memory demand measured.

Why measured demand and not the requested size: the Entropy paper's gain comes from VMs that do
not compute all the time (a vjob of 9 VMs whose phases leave most of them idle). Planning with
the requested size keeps a CPU per VM booked while it waits on its neighbours; planning with
what each VM used over the last interval lets idle VMs share a node and more vjobs run, and
shows a node whose VMs all compute at once as overloaded: the planner relieves it (its plan
must end with every node viable), by migration when another node has room. A node whose VMs
hold more memory than it has is overloaded too.

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
    cpu_s: float,
    at: float,
    prev_cpu_s: float | None,
    prev_at: float | None,
    vcpus: int,
    *,
    busy: float = 0.5,
    delay_s: float | None = None,
    prev_delay_s: float | None = None,
) -> int:
    """CPUs a VM needs, from two readings of its CPU time (seconds) at two instants.

    A vCPU counts as busy when it used at least `busy` of the interval (the paper's VMs
    compute or idle; a half-busy one is rounded up so it is never starved). Without a previous
    reading (a VM just started or resumed) the VM is taken as fully busy: its requested size.

    `delay_s` (with `prev_delay_s`): the time its vCPUs were runnable but waited for a host CPU
    (libvirt's vcpu.N.delay). Used time plus waited time is what the VM *wanted*: on an
    oversubscribed host a computing vCPU may get a third of a core and wait the rest, and it
    is starved, not idle; an idle vCPU (halted in the guest) is not runnable and waits for
    nothing. Without it (a host that does not report it) only the time used counts.
    """
    if not 0 < busy <= 1:
        raise InputError(f"busy = {busy!r}: must be in (0, 1]")
    if prev_cpu_s is None or prev_at is None or at <= prev_at or cpu_s < prev_cpu_s:
        return vcpus
    wanted = cpu_s - prev_cpu_s
    if delay_s is not None and prev_delay_s is not None and delay_s >= prev_delay_s:
        wanted += delay_s - prev_delay_s
    return max(0, min(vcpus, int(wanted / (at - prev_at) + 1 - busy)))


@dataclass(frozen=True)
class ObservedVM:
    """One VM as observed: its state, place, memory (MiB it holds, as measured), requested vCPUs
    and measured demand."""

    vm: str
    vjob: str
    state: VJobState
    host: str | None
    mem: int
    vcpus: int
    demand: int
    """CPUs it wanted over the last interval, used or waited for (cpu_demand); a sleeping VM: what
    it wanted before."""
    pinned: bool = False
    """It may not change node (a VM of a multi-node vjob: its pilot moves its VMs together or not
    at all); it may still be suspended or resumed in place with the rest of its vjob."""


@dataclass(frozen=True)
class ControlDecision:
    """The decision of one control step: the instance as measured, the decision module's
    selection, the overloaded nodes, and whether any vjob changes state or place."""

    instance: Instance
    selection: Selection
    overloaded: tuple[str, ...]
    changes: bool
    why: tuple[str, ...] = ()
    """For each overloaded node, in the same order, what it is short of (e.g. `cpu 2 > 1`,
    `memory 1300 > 1024 MB`): CPU and memory demand both count."""


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
    vms = tuple(VMSpec(o.vm, o.vjob, o.demand, o.mem, o.state, o.host, o.pinned) for o in observed)
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
    why = _overloaded(inst)
    overloaded = tuple(why)
    return ControlDecision(inst, selection, overloaded, bool(moved or overloaded or target), tuple(why.values()))


def plan_for(decision: ControlDecision, *, optimizer: Optimizer = "cpsat", time_limit_s: float = 2.0) -> Plan | None:
    """The switch to the decision's target (None when nothing changes)."""
    if not decision.changes:
        return None
    plan = make_plan(
        decision.instance, optimizer=optimizer, time_limit_s=time_limit_s, hint=decision.selection.placement
    )
    return plan if plan.actions else None


def _overloaded(inst: Instance) -> dict[str, str]:
    """Node → what its running VMs' measured demand exceeds (CPUs, memory or both)."""
    load: dict[str, list[int]] = {n.id: [0, 0] for n in inst.nodes}
    for vm in inst.vms:
        if vm.state is VJobState.RUNNING and vm.host in load:
            load[vm.host][0] += vm.cpu
            load[vm.host][1] += vm.mem
    out = {}
    for n in inst.nodes:
        cpu, mem = load[n.id]
        short = ([f"cpu {cpu} > {n.cpu}"] if cpu > n.cpu else []) + (
            [f"memory {mem} > {n.mem} MB"] if mem > n.mem else []
        )
        if short:
            out[n.id] = ", ".join(short)
    return out


__all__ = ["ControlDecision", "ObservedVM", "cpu_demand", "decide", "plan_for"]
