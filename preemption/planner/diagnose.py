"""Explaining why no viable target placement exists: which resource is short, on which nodes.

Why a dedicated explanation: "infeasible" alone leaves an operator guessing whether the
decision module asked for more CPUs than the cluster has, or whether memory is fragmented so
that one big VM fits nowhere. Both cases are told apart here, with figures.
"""

from __future__ import annotations

from preemption.planner.instance import Instance
from preemption.planner.placement import first_fit_decreasing
from vjob.errors import InputError


class NoViablePlacementError(InputError):
    """The target states ask for more than the nodes can hold; the message says what is short."""


def explain(inst: Instance, *, proven: bool) -> str:
    """A one-paragraph diagnosis; `proven` tells whether infeasibility was proven or only not refuted in time."""
    to_run = inst.to_run()
    need_cpu = sum(v.cpu for v in to_run)
    need_mem = sum(v.mem for v in to_run)
    have_cpu = sum(n.cpu for n in inst.nodes)
    have_mem = sum(n.mem for n in inst.nodes)
    head = f"no viable placement for the {len(to_run)} VMs to run" + ("" if proven else " was found in time")
    short = []
    if need_cpu > have_cpu:
        short.append(f"cpu is short on every node: the VMs to run need {need_cpu} CPUs, the nodes offer {have_cpu}")
    if need_mem > have_mem:
        short.append(f"memory is short on every node: the VMs to run need {need_mem} MB, the nodes offer {have_mem} MB")
    if short:
        return f"{head}: " + "; ".join(short)
    placed, left = first_fit_decreasing(inst.nodes, to_run)
    if not left:
        return f"{head} (first-fit decreasing finds one: report this as a bug)"
    vm = left[0]
    vms = inst.vm_by_id
    free_cpu = {n.id: n.cpu for n in inst.nodes}
    free_mem = {n.id: n.mem for n in inst.nodes}
    for vm_id, n in placed.items():
        free_cpu[n] -= vms[vm_id].cpu
        free_mem[n] -= vms[vm_id].mem
    cpu_ok = [n for n in free_cpu if free_cpu[n] >= vm.cpu]
    mem_ok = [n for n in free_mem if free_mem[n] >= vm.mem]
    if not cpu_ok:
        what = f"cpu is short on all nodes (the most free is {max(free_cpu.values())} CPU)"
    elif not mem_ok:
        best = sorted(free_mem, key=lambda n: -free_mem[n])[:5]
        what = "memory is short on all nodes (most free: " + ", ".join(f"{n} {free_mem[n]} MB free" for n in best) + ")"
    else:
        what = (
            "memory is short on the nodes with a free CPU ("
            + ", ".join(f"{n} {free_mem[n]} MB free" for n in cpu_ok[:5])
            + ") and cpu is short on the nodes with free memory ("
            + ", ".join(f"{n} {free_cpu[n]} CPU free" for n in mem_ok[:5])
            + ")"
        )
    return (
        f"{head}: in total cpu {need_cpu}/{have_cpu} and memory {need_mem}/{have_mem} MB would do, but the load "
        f"does not pack: after first-fit decreasing, {len(left)} VM(s) fit nowhere, e.g. vm {vm.id} of vjob "
        f"{vm.vjob} (cpu {vm.cpu}, mem {vm.mem} MB): {what}"
    )
