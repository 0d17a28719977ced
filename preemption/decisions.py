"""Decision modules: which vjobs run in the next configuration (Entropy section 3.2).

Why these are separate from the planner: a decision module only says *what* the next state of
every vjob is; the planner then works out *how* to get there cheaply. Both modules solve the
paper's Running Job Selection Problem the same way: walk a queue in priority order and keep a
vjob running when first-fit decreasing can still place all its VMs beside those of the vjobs
already kept; a vjob that does not fit sleeps (if it ran or slept) or keeps waiting. They
differ only in the order of the queue: arrival order for FCFS, UBIS priority for the UBIS
variant. Priorities are a plain mapping vjob → float (from ubis_priority, or anything else).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from preemption.planner.instance import Instance, VMSpec
from preemption.planner.placement import first_fit_decreasing
from vjob.errors import InputError
from vjob.model import VJobState


@dataclass(frozen=True)
class Selection:
    """A decision: the target state of every vjob, and the viable placement that proved it.

    Pass `placement` to make_plan as `hint`: first-fit decreasing run vjob by vjob is not the
    same as one first-fit decreasing over all the selected VMs, which may fail to pack them.
    """

    target: dict[str, VJobState]
    placement: dict[str, str] = field(default_factory=dict)


def running_job_selection(inst: Instance, queue: Sequence[str], *, sticky: bool = True) -> Selection:
    """Target state of every vjob of `inst` for the queue order given (first = served first).

    Vjobs targeted `terminated` in `inst` stay so and take no room; every other vjob must be
    in `queue` exactly once. `sticky`: in the temporary configuration a VM first tries the
    node it runs on (or holds its state), and FFD places the others — the same vjobs fit
    more often where they are, and the placement handed to the planner moves fewer VMs.
    With `sticky=False` every VM is placed by FFD, as in the paper.
    """
    vjobs = inst.vjobs()
    finished = {j for j in vjobs if inst.target[j] is VJobState.TERMINATED}
    seen: set[str] = set()
    for j in queue:
        if j not in vjobs:
            raise InputError(f"queue: unknown vjob {j!r}")
        if j in seen:
            raise InputError(f"queue: vjob {j!r} listed twice")
        seen.add(j)
    missing = set(vjobs) - finished - seen
    if missing:
        raise InputError(f"queue: vjob(s) {', '.join(sorted(missing))} missing from the queue")
    target: dict[str, VJobState] = dict.fromkeys(finished, VJobState.TERMINATED)
    placement: dict[str, str] = {}
    used: dict[str, tuple[int, int]] = {n.id: (0, 0) for n in inst.nodes}
    # The homes of the pinned VMs (multi-node vjobs) not considered yet: a vjob served before
    # them is placed around them when it can be, so it does not take the only place they have.
    reserved = {j: [vm for vm in vms if vm.pinned] for j, vms in vjobs.items() if j not in finished}
    for j in queue:
        if j in finished:
            continue
        reserved.pop(j, None)
        # The temporary configuration: the vjobs kept so far, plus this one placed by FFD.
        placed: dict[str, str] = {}
        left: list[VMSpec] = vjobs[j]
        if any(reserved.values()):
            placed, left = _place(inst, vjobs[j], _plus(used, reserved), sticky)
        if left:
            placed, left = _place(inst, vjobs[j], used, sticky)
        if not left:
            vms = {vm.id: vm for vm in vjobs[j]}
            for vm_id, n in placed.items():
                cpu, mem = used[n]
                used[n] = (cpu + vms[vm_id].cpu, mem + vms[vm_id].mem)
            placement.update(placed)
            target[j] = VJobState.RUNNING
        else:
            current = vjobs[j][0].state
            target[j] = VJobState.WAITING if current is VJobState.WAITING else VJobState.SLEEPING
    return Selection(target, placement)


def fcfs_selection(inst: Instance, queue: Sequence[str], *, sticky: bool = True) -> Selection:
    """The paper's sample module: FCFS queue order (the caller gives vjobs by arrival)."""
    return running_job_selection(inst, queue, sticky=sticky)


def ubis_selection(
    inst: Instance,
    priorities: Mapping[str, float],
    *,
    keep_running: Iterable[str] = (),
    sticky: bool = True,
) -> Selection:
    """UBIS variant: the highest priority first (ties by vjob id).

    `keep_running` lists running vjobs that must not be preempted (for instance batch jobs
    when only interactive jobs may preempt): they are served before everyone else.
    """
    vjobs = inst.vjobs()
    active = [j for j in vjobs if inst.target[j] is not VJobState.TERMINATED]
    missing = [j for j in active if j not in priorities]
    if missing:
        raise InputError(f"priorities: no priority for vjob(s) {', '.join(sorted(missing))}")
    pinned = set(keep_running)
    for j in pinned:
        if j not in vjobs:
            raise InputError(f"keep_running: unknown vjob {j!r}")
    queue = sorted(
        active,
        key=lambda j: (0 if j in pinned and vjobs[j][0].state is VJobState.RUNNING else 1, -priorities[j], j),
    )
    return running_job_selection(inst, queue, sticky=sticky)


def _plus(used: Mapping[str, tuple[int, int]], reserved: Mapping[str, list[VMSpec]]) -> dict[str, tuple[int, int]]:
    """`used` plus the load of the reserved VMs on their homes."""
    out = dict(used)
    for vms in reserved.values():
        for vm in vms:
            assert vm.host is not None  # Instance checks a pinned VM has a node
            cpu, mem = out[vm.host]
            out[vm.host] = (cpu + vm.cpu, mem + vm.mem)
    return out


def _place(
    inst: Instance, vms: list[VMSpec], used: Mapping[str, tuple[int, int]], sticky: bool
) -> tuple[dict[str, str], list[VMSpec]]:
    """Place one vjob's VMs on top of `used`: at home first when `sticky`, then by FFD.

    A pinned VM (a multi-node vjob's) is placed at home or not at all, sticky or not: a vjob
    that cannot run where its pinned VMs are is not selected (it sleeps, whole)."""
    extra = dict(used)
    home: dict[str, str] = {}
    rest: list[VMSpec] = []
    out_left: list[VMSpec] = []
    for vm in sorted(vms, key=lambda v: (-v.mem, -v.cpu, v.id)):
        node = inst.node_by_id.get(vm.host) if vm.host is not None and (sticky or vm.pinned) else None
        if node is not None:
            cpu, mem = extra[node.id]
            if cpu + vm.cpu <= node.cpu and mem + vm.mem <= node.mem:
                extra[node.id] = (cpu + vm.cpu, mem + vm.mem)
                home[vm.id] = node.id
                continue
        (out_left if vm.pinned else rest).append(vm)
    placed, left = first_fit_decreasing(inst.nodes, rest, extra)
    return {**home, **placed}, out_left + left
