"""From the agent's view of running vjobs to remapping decisions and VM moves (pure).

Why these rules — the RMS view (docs/remap.md, "Live remapping in the agent"): an RMS such as
Slurm cannot change a running job's nodes, so each job keeps its allocation in the RMS and vjob
records where its VMs really run (the journal's migrations, the store's `vms` rows).
- A slot is a node: one vjob VM per node, as the RMS allocates them. A job's size is its node
  count, so a swap is only possible between two jobs of the same node count (no free slot is
  offered: `decide`'s fit test then demands equal sizes) and the RMS's node counts and
  accounting stay exact — only the hosts of the two jobs are crossed.
- No move onto idle nodes: the RMS does not hold them for the job and would start another job
  there. Every sub-cluster is offered 0 free slots (the simulator, which owns its nodes,
  keeps moves).
- Going home: when a job's VM runs on a node outside its allocation (a swap) and no running
  job away from its own nodes holds that node in the RMS any more (the partner ended), the VM
  goes back to its own node at once, whatever the gain or the migration bound — the RMS has
  freed the node it sits on, or given it to another job.
- A job on nodes of several sub-clusters, or of a node of no known sub-cluster, is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from preemption.remap.models import Profile, SubCluster, migration_cost_s, subcluster_of
from preemption.remap.policy import Decision, RemapParams, RunningJob, decide, running_job
from vjob.model import Node


@dataclass(frozen=True, slots=True)
class Placement:
    """A running vjob as the agent sees it: its VMs and where each runs, and the RMS's nodes."""

    job: str
    vms: tuple[tuple[str, str], ...]
    """(VM name, node it runs on), one per VM."""
    allocated: tuple[str, ...]
    """The nodes the RMS allocated to the job (what `squeue` shows)."""
    memory_mb: int = 0
    """Memory of one of its VMs."""
    remaining_s: float | None = None
    migrations: int = 0
    """Live migrations made so far (from the journal)."""

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(node for _, node in self.vms)


@dataclass(frozen=True, slots=True)
class Move:
    """One VM's live migration, and why (a decision's kind and reason, or "home")."""

    job: str
    vm: str
    src: str
    dst: str
    why: str


def node_subclusters(nodes: Iterable[Node], farm: Mapping[str, SubCluster]) -> dict[str, str]:
    """Node name → its sub-cluster, from the RMS node features; nodes of none are left out."""
    out = {}
    for n in nodes:
        sc = subcluster_of(n.features, farm)
        if sc is not None:
            out[n.name] = sc
    return out


def job_subcluster(p: Placement, node_sc: Mapping[str, str]) -> str | None:
    """The one sub-cluster all of a job's VMs run in, None when mixed or unknown."""
    kinds = {node_sc.get(h) for h in p.hosts}
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def running_jobs(
    placements: Iterable[Placement],
    profiles: Mapping[str, Profile | None],
    node_sc: Mapping[str, str],
    farm: Mapping[str, SubCluster],
    params: RemapParams,
    migrate_bandwidth_mb_s: float,
) -> list[RunningJob]:
    """The policy's view of every placement inside one sub-cluster; its size is its VM count
    (one VM per node) and its memory per slot that of one VM."""
    out = []
    for p in placements:
        sc = job_subcluster(p, node_sc)
        if sc is None or not p.vms:
            continue
        out.append(
            running_job(
                p.job,
                sc,
                len(p.vms),
                profiles.get(p.job),
                farm,
                params,
                memory_mb_per_slot=p.memory_mb,
                migrations=p.migrations,
                remaining_s=p.remaining_s,
                migrate_s=migration_cost_s(p.memory_mb, migrate_bandwidth_mb_s),
            )
        )
    return out


def released(ended: Mapping[str, Sequence[str]], placements: Iterable[Placement]) -> list[str]:
    """The ended jobs (job → the nodes the RMS allocated it) whose nodes no VM of another job runs
    on any more (`placements`: where every running vjob VM is, root's record): their pilots, which
    hold the nodes while a VM a swap lent them is still there, may now let the RMS free them."""
    on: dict[str, set[str]] = {}
    for p in placements:
        for _, node in p.vms:
            on.setdefault(node, set()).add(p.job)
    return sorted(j for j, nodes in ended.items() if not any(on.get(n, set()) - {j} for n in nodes))


def seen_memory(
    placements: Iterable[Placement], memory_mib: Mapping[str, int]
) -> tuple[list[Placement], dict[str, str]]:
    """Each placement with the memory the hypervisor holds for its VMs (`memory_mib`: VM → MiB,
    root's reading through libvirt) instead of the one its pilot declares: the pilot's state file
    is the job user's, and the memory prices a job's migration (T^M) and its fit on a node kind.
    A job with a VM libvirt gave no figure for is left out, with the reason: unpriced, it is in
    no decision."""
    out: list[Placement] = []
    left: dict[str, str] = {}
    for p in placements:
        seen = [memory_mib.get(vm) for vm, _ in p.vms]
        if not seen or any(m is None or m <= 0 for m in seen):
            left[p.job] = "its VM's memory is not known from libvirt yet (no sample): its migration cannot be priced"
            continue
        out.append(replace(p, memory_mb=max(m for m in seen if m is not None)))
    return out, left


def decide_swaps(jobs: Sequence[RunningJob], farm: Mapping[str, SubCluster], params: RemapParams) -> list[Decision]:
    """The policy with no free slot anywhere: swaps only, between jobs of equal node counts."""
    free = {name: 0 for name in farm}
    memory = {name: sc.memory_mb_per_node for name, sc in farm.items()}
    return decide(jobs, free, memory, params)


def moves_for(decisions: Iterable[Decision], placements: Iterable[Placement]) -> list[Move]:
    """The VM migrations that carry out swaps: each job's VMs onto the other's hosts, host by
    host in name order. A move decision has no nodes to go to live (see the module docstring)."""
    by_job = {p.job: p for p in placements}
    out: list[Move] = []
    for d in decisions:
        if d.kind != "swap":
            continue
        j, k = by_job[d.jobs[0]], by_job[d.jobs[1]]
        if len(j.vms) != len(k.vms):
            raise ValueError(f"swap of jobs {j.job} and {k.job}: {len(j.vms)} and {len(k.vms)} VMs")
        why = f"swap ({d.reason}, {d.gain_s:.0f} VM-s)"
        for a, b in ((j, k), (k, j)):
            for (vm, src), dst in zip(sorted(a.vms, key=lambda v: v[1]), sorted(b.hosts), strict=True):
                out.append(Move(a.job, vm, src, dst, why))
    return out


def homeward(placements: Sequence[Placement]) -> list[Move]:
    """VMs off their job's allocation sent back to it once the node they sit on is no longer
    lent: no running job away from its own nodes holds that node in the RMS any more (the swap
    partner ended, so the RMS has freed the node or given it to someone else). Going home is
    always what the RMS expects, whoever else it placed there."""
    out: list[Move] = []
    current = list(placements)
    while True:  # a VM going home may end the lending of the node another one sits on (chains)
        lent = {h for q in current for h in q.allocated if h not in q.hosts}
        step: list[Move] = []
        for p in sorted(current, key=lambda p: p.job):
            homes = [n for n in sorted(p.allocated) if n not in p.hosts]
            for vm, node in sorted(p.vms):
                if not p.allocated or node in p.allocated or node in lent or not homes:
                    continue
                step.append(Move(p.job, vm, node, homes.pop(0), "home"))
        if not step:  # each round puts at least one VM on its own node: this ends
            return out
        out.extend(step)
        dst = {m.vm: m.dst for m in step}
        current = [replace(p, vms=tuple((vm, dst.get(vm, h)) for vm, h in p.vms)) for p in current]


__all__ = [
    "Move",
    "Placement",
    "decide_swaps",
    "homeward",
    "job_subcluster",
    "moves_for",
    "node_subclusters",
    "released",
    "running_jobs",
    "seen_memory",
]
