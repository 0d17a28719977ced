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
- A job moves whole: every move belongs to one decision (`Move.decision`: a swap's two jobs,
  or one job going home) and a decision is carried out whole or not at all
  (preemption.remap.claims.allowed_moves drops it whole). A job of several VMs goes home only
  when all its VMs away can, in one step; its move is one cut (`switch_plan`: all its VMs
  suspended in one pool, resumed on their new nodes in the next), never VM by VM.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from preemption.planner.plan import Plan, PlanAction, plan_cost
from preemption.remap.models import Profile, SubCluster, migration_cost_s, subcluster_of
from preemption.remap.policy import Decision, RemapParams, RunningJob, decide, running_job
from vjob.model import Action, Node


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
    decision: str = ""
    """The decision it carries out, shared by all its moves ("swap j+k", "home j"); "" = its job's own."""

    @property
    def key(self) -> str:
        """What is carried out whole: the decision, else the job."""
        return self.decision or f"job {self.job}"


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
        key = f"swap {j.job}+{k.job}"
        for a, b in ((j, k), (k, j)):
            for (vm, src), dst in zip(sorted(a.vms, key=lambda v: v[1]), sorted(b.hosts), strict=True):
                out.append(Move(a.job, vm, src, dst, why, key))
    return out


def homeward(placements: Sequence[Placement]) -> list[Move]:
    """VMs off their job's allocation sent back to it once the node they sit on is no longer
    lent: no running job away from its own nodes holds that node in the RMS any more (the swap
    partner ended, so the RMS has freed the node or given it to someone else). Going home is
    always what the RMS expects, whoever else it placed there. A job goes home whole: all its
    VMs away in one step, or none of them while one of them still sits on a lent node."""
    out: list[Move] = []
    current = list(placements)
    while True:  # a VM going home may end the lending of the node another one sits on (chains)
        lent = {h for q in current for h in q.allocated if h not in q.hosts}
        step: list[Move] = []
        for p in sorted(current, key=lambda p: p.job):
            homes = [n for n in sorted(p.allocated) if n not in p.hosts]
            away = [(vm, node) for vm, node in sorted(p.vms) if p.allocated and node not in p.allocated]
            if not away or len(homes) < len(away) or any(node in lent for _, node in away):
                continue
            legs = zip(away, homes[: len(away)], strict=True)
            step.extend(Move(p.job, vm, node, home, "home", f"home {p.job}") for (vm, node), home in legs)
        if not step:  # each round puts at least one VM on its own node: this ends
            return out
        out.extend(step)
        dst = {m.vm: m.dst for m in step}
        current = [replace(p, vms=tuple((vm, dst.get(vm, h)) for vm, h in p.vms)) for p in current]


def switch_plan(moves: Sequence[Move], placements: Iterable[Placement]) -> Plan:
    """The moves as one switch: a one-VM job's move is a live migration in the first pool; a
    job of several VMs moves by one cut — all its VMs suspended in the first pool (the ones
    not moving too: the cut is the whole job's), all resumed in the second, each on its new
    node (the others where they slept): never VM by VM. Raises ValueError for a job moved by
    two decisions, or a move of a VM that is not where the job's placement says it runs."""
    by_job = {p.job: p for p in placements}
    grouped: dict[str, list[Move]] = {}
    for m in moves:
        grouped.setdefault(m.job, []).append(m)
    first: list[PlanAction] = []
    second: list[PlanAction] = []
    mem: dict[str, int] = {}
    placement: dict[str, str] = {}
    for job, ms in grouped.items():
        p = by_job.get(job)
        if p is None:
            raise ValueError(f"job {job}: moved but not a running placement")
        _check_whole(job, ms, p)
        dst = {m.vm: m.dst for m in ms}
        for vm, node in p.vms:
            mem[vm] = p.memory_mb
            placement[vm] = dst.get(vm, node)
        if len(p.vms) == 1:
            first.extend(PlanAction(Action.MIGRATE, m.vm, job, m.src, m.dst) for m in ms)
            continue
        first.extend(PlanAction(Action.SUSPEND, vm, job, node) for vm, node in p.vms)
        second.extend(PlanAction(Action.RESUME, vm, job, node, dst.get(vm, node)) for vm, node in p.vms)
    pools = tuple(tuple(pool) for pool in (first, second) if pool)
    return Plan(pools=pools, placement=placement, cost=plan_cost(pools, mem), optimizer="remap")


def _check_whole(job: str, moves: Sequence[Move], p: Placement) -> None:
    """A job's moves: one decision, each of its VMs at most once, from where it runs."""
    keys = sorted({m.key for m in moves})
    if len(keys) > 1:
        raise ValueError(f"job {job}: moved by {len(keys)} decisions ({', '.join(keys)}): a job moves whole, once")
    where = dict(p.vms)
    seen: set[str] = set()
    for m in moves:
        if where.get(m.vm) != m.src or m.vm in seen:
            raise ValueError(f"job {job}: move of {m.vm} {m.src}->{m.dst}: not one of its VMs where it runs")
        seen.add(m.vm)


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
    "switch_plan",
]
