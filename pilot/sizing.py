"""How big a job's VM is on one node: the pilot's choice from what the RMS allocated there.

Why the allocation and not a flag: the RMS already decided what the job may use on the node
(`sbatch -c 64 --mem 200G`), and a VM smaller than that wastes the allocation while one larger
would take what other jobs were given. So the VM gets the node's allocated CPUs as vCPUs and
the node's memory minus QEMU's own resident memory beyond guest RAM (`[provisioning]
vm_overhead_mib`, measured by bench/vm_overhead.py), so that QEMU as a whole stays within what
the job holds. An explicit `vjob run --cpus/--memory` (an operator's or a user's override) wins
but never exceeds the allocation. Where the RMS gives no memory figure (Slurm without `--mem`
on a site with no DefMemPerCPU, OAR), the VM keeps vjob's default and the log says so; where it
gives no allocation at all (a pilot started by hand with --job-id), the VM is sized as before:
one vCPU and the default memory.

A job whose memory cannot hold the overhead and the guest's minimum is refused here, before
anything starts, with the numbers: a guest that cannot boot would only fail later, unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass

from vjob import log
from vjob.allocation import Allocation
from vjob.errors import InputError

_log = log.get("pilot")


@dataclass(frozen=True)
class VMSize:
    """The VM of one node: vCPUs and guest memory (MiB)."""

    vcpus: int
    memory_mib: int


def choose(
    alloc: Allocation | None,
    *,
    node: str,
    asked_cpus: int | None,
    asked_memory: int | None,
    overhead_mib: int,
    floor_mib: int,
    default_mib: int,
) -> VMSize:
    """The VM on `node` for allocation `alloc` (None: the RMS said nothing). `asked_*`: the
    explicit --cpus/--memory (None: not given); a guest gets at least `floor_mib`."""
    if asked_cpus is not None and asked_cpus < 1:
        raise InputError(f"--cpus {asked_cpus}: must be at least 1")
    if alloc is None:
        memory = max(asked_memory or default_mib, floor_mib)
        _log.info("no allocation in the job's environment: the VM gets the default size", node=node, memory_mib=memory)
        return VMSize(asked_cpus or 1, memory)
    vcpus = alloc.cpus
    if asked_cpus is not None:
        if asked_cpus > alloc.cpus:
            _log.warning("--cpus above the allocation: capped", node=node, asked=asked_cpus, allocated=alloc.cpus)
        vcpus = min(asked_cpus, alloc.cpus)
    if alloc.memory_mib is None:
        memory = max(asked_memory or default_mib, floor_mib)
        _log.warning("the RMS gives this job no memory figure: the VM gets the default", node=node, memory_mib=memory)
        return VMSize(vcpus, memory)
    room = alloc.memory_mib - overhead_mib
    if room < floor_mib:
        raise InputError(
            f"node {node}: the job's {alloc.memory_mib} MiB minus the VM's overhead of {overhead_mib} MiB leaves"
            f" {room} MiB, below the guest's minimum of {floor_mib} MiB: ask for at least"
            f" {floor_mib + overhead_mib} MiB per node (e.g. sbatch --mem={floor_mib + overhead_mib}M)"
        )
    memory = room
    if asked_memory is not None:
        if asked_memory > room:
            _log.warning(
                "--memory above the allocation minus the VM's overhead: capped",
                node=node,
                asked=asked_memory,
                allocated=alloc.memory_mib,
                overhead=overhead_mib,
            )
        memory = max(min(asked_memory, room), floor_mib)
    _log.info("VM sized to the allocation", node=node, vcpus=vcpus, memory_mib=memory, allocated=alloc.memory_mib)
    return VMSize(vcpus, memory)
