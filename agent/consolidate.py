"""The Entropy control loop in the agent: every `planner.interval_s`, re-plan from measured demand.

Why here: the agent already observes the pilots and knows every node's libvirt connection.
Each step samples, as root, every domain running on each node that holds a vjob's VM
(libvirt's domain statistics, provisioning.profiling: CPU time, the vCPUs' wait for a host CPU,
current memory and QEMU's resident set); two samples give each VM's measured demand. The pure
control step (preemption.planner.control) decides which vjobs run and where, FCFS by
submission time; the planner's switch is carried out live through the pilots
(agent.pilot_performer) and journalled like every switch (`vjob status` lists it with its plan).

Why not the pilot's own CPU counter: the pilot's state file is owned by the job's user, who
could report an idle VM to get a node to itself, or a tiny one to be packed beside others. The
pilot file now only says which VMs exist, their state and the node to look on; a VM root cannot
find there weighs what root knows of it — the RMS's allocation (the store's record of it for a
job the RMS forgot), or more if root measured more — and is logged: the pilot's `memory_mb` and
`vcpus` are advisory and weigh nothing (issue 39, item 9). A vjob the RMS does not list comes
after every vjob it does in the FCFS queue, so it cannot push another user's VM out.

A multi-node vjob (one pilot holding `<vm>-0`, `<vm>-1`…, pilot.multinode) is each of its
VMs, measured on the node its pilot's `member_nodes` names, so the planner weighs its real size.
When its pilot can resume its VMs on other nodes (agent.remap_whole.unmovable: a root job's
leader-mode pilot without the node service's job network) the vjob is `whole` in the planner's
instance: the planner moves it only by one cut (all its VMs suspended in one pool, resumed on
their new nodes in a later one), which its pilot takes as one suspend and one resume naming
every VM's node. Otherwise its VMs are pinned to their nodes (they may sleep and wake in place,
together, never move), so the planner relieves an overload by moving another vjob or by
suspending the multi-node one whole. Its plan actions are coalesced into the one request its
pilot takes (agent.pilot_coalesce), which still refuses, journalled, a plan that would move
its VMs one by one (a safety net: the validator already rejects such a plan).

Every step leaves what it decided in a small root-owned record (STATUS_NAME in the data
directory, agent.status_file) that `vjob status` shows: each vjob's target and why (its place in
the FCFS queue, its measured size, whether it fits beside the vjobs before it), the overloaded
nodes, and the plan (its actions and cost, "no change", or why there is none) with the switch
that carried it out.

Scope: the vjobs that have a pilot (running, or asleep after a live suspend). Starting a new
job stays the RMS's decision; the loop packs, relieves and wakes the vjobs it already holds.

A step is two halves with the agent's arbiter between them (agent.arbiter, one plan per tick):
`propose` measures and plans (the switch it wants, or None), `carry_out` journals and executes
the switch the arbiter took; the agent asks for a proposal only when its interval has passed
and the tick's plan lets it consolidate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agent.observe import Observation
from agent.pilot_coalesce import MembersMoved, WholeMovePerformer, coalesce, journal_refusal, whole_moves
from agent.pilot_performer import EXECUTOR_TAG, live_performer
from agent.ports import Ports
from agent.remap_whole import unmovable
from agent.status_file import write_status_file
from preemption.executor import ExecutionReport
from preemption.planner import Instance, NodeSpec, Plan
from preemption.planner.control import ControlDecision, ObservedVM, cpu_demand, decide, plan_for
from vjob import log
from vjob.errors import InputError, StoreError, VjobError
from vjob.model import Action, Node, VJobState
from vjob.pilot_files import PilotState, PilotStatus, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import vms as store_vms

if TYPE_CHECKING:
    from provisioning.profiling import DomainSample

_log = log.get(__name__)

STATUS_NAME = "control.json"
"""The control loop's last step, for `vjob status` (agent.status_cmd.read_control_status)."""

Sampler = Callable[[str], Mapping[str, "DomainSample"]]
"""node → one sample of every domain running there (provisioning.profiling.node_sampler)."""


@dataclass
class ControlState:
    """What the loop carries between steps: the last sample, demand and memory of each VM
    (measured by root), and the last decision and plan (for the log and tests)."""

    sampler: Sampler | None = None
    """libvirt's domain statistics through the provisioning driver's connections by default."""
    samples: dict[str, DomainSample] = field(default_factory=dict)
    """Each running VM's last sample: the start of its next window (a VM asleep has none, so
    the first window after a resume starts at the resume)."""
    demand: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    """MiB each VM was last measured holding; what a sleeping VM will need when resumed."""
    unmeasured: tuple[str, ...] = ()
    """VMs the last step could not find on the node their pilot names (weighed at their
    requested size)."""
    members: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Each multi-node vjob seen by the last step: (VM, node) of each of its VMs, its pilot's first."""
    whole: frozenset[str] = frozenset()
    """The multi-node vjobs of the last step whose pilots move them whole (not pinned)."""
    refused: str = ""
    """Why the last plan was refused (a multi-node vjob moved VM by VM); the same refusal again
    is logged, not journalled a second time."""
    last_step: float = 0.0
    decision: ControlDecision | None = None
    plan: Plan | None = None
    published: dict[str, Any] | None = None
    """The record last written for `vjob status` (STATUS_NAME)."""


def measured_mib(sample: DomainSample) -> int | None:
    """MiB a VM holds on its node: its current memory (what a save or a migration moves), or
    QEMU's resident set when that is larger (the emulator's own memory, e.g. TCG's code cache).
    None when libvirt says neither."""
    kib = max(sample.memory_kib or 0, sample.rss_kib or 0)
    return math.ceil(kib / 1024) if kib else None


def vm_demand(now: DomainSample, prev: DomainSample | None, *, busy: float) -> int:
    """CPUs a VM wanted between two samples: time used plus time its vCPUs waited for a host
    CPU (control.cpu_demand); its vCPUs when there is no earlier sample."""
    vcpus = max(1, now.vcpus)
    if prev is None:
        return vcpus
    delay = None if now.vcpu_delay_ns is None else now.vcpu_delay_ns / 1e9
    prev_delay = None if prev.vcpu_delay_ns is None else prev.vcpu_delay_ns / 1e9
    return cpu_demand(
        now.cpu_time_ns / 1e9,
        now.t,
        prev.cpu_time_ns / 1e9,
        prev.t,
        vcpus,
        busy=busy,
        delay_s=delay,
        prev_delay_s=prev_delay,
    )


def members_of(st: PilotStatus) -> list[tuple[str, str]]:
    """(VM, node) of each VM a pilot holds: its own on its node, or each `<vm>-<rank>` of a
    multi-node job on the node `member_nodes` names (vjob.pilot_files.vms_of: the names the
    agent derived from the job id when it read the state)."""
    return vms_of(st)


def allotments(obs: Observation, forgotten: Mapping[str, tuple[int, int]] | None = None) -> dict[str, Allotment]:
    """What root knows each VM of each vjob may hold, per VM (one per node): the RMS's allocation
    per node (Job.memory_mb, Job.cores) of the jobs it lists, else `forgotten` — (MiB, CPUs) the
    store recorded from the RMS for a job it no longer lists. Never the pilot's file."""
    out = {job_id: Allotment(mem, cpus) for job_id, (mem, cpus) in (forgotten or {}).items()}
    out |= {j.id: Allotment(j.memory_mb, j.cores) for j in obs.view.jobs}
    return out


@dataclass(frozen=True)
class Allotment:
    """A vjob's VM size as root knows it: MiB (0: the RMS was asked for none) and CPUs per VM."""

    memory_mb: int
    cpus: int


def root_size(allotment: Allotment | None, node: Node | None) -> tuple[int, int]:
    """(MiB, CPUs) an unmeasured VM weighs: its allotment; with no memory asked, its CPUs' share
    of the node's memory (what a node shared by cores gives it); a vjob neither the RMS nor the
    store knows, the whole node (root knows nothing smaller: it is last in the queue, so only
    its own VMs give way). Why not the pilot's claim: the job's user writes it, and a small
    claim packs the VM beside others, a large one (first in the queue) pushes others out."""
    if allotment is None:
        return (node.memory_mb, node.cpus) if node is not None else (1, 1)
    cpus = max(1, allotment.cpus)
    if allotment.memory_mb > 0 or node is None:
        return max(1, allotment.memory_mb), cpus
    return max(1, math.ceil(node.memory_mb * min(cpus, node.cpus) / max(1, node.cpus))), cpus


def observed_vms(
    obs: Observation,
    state: ControlState,
    *,
    busy: float,
    forgotten: Mapping[str, tuple[int, int]] | None = None,
    whole: Collection[str] = (),
) -> list[ObservedVM]:
    """The vjobs with a pilot, each running VM weighing what root measured on its node since
    the previous step; a sleeping VM keeps what it was last measured. A VM root has not measured
    (not found where its pilot says, or asleep since before a restart) weighs no less than root
    knows (root_size: the RMS's allocation, the store's record of it for a job the RMS forgot,
    what root last measured); the pilot's `memory_mb` and `vcpus` play no part. The VMs of a
    multi-node vjob are pinned unless it is in `whole` (its pilot moves them whole)."""
    if state.sampler is None:
        raise VjobError("control loop: no sampler to measure the VMs with")
    sizes = allotments(obs, forgotten)
    node_of = {n.name: n for n in obs.view.nodes}
    running: dict[str, list[tuple[str, str, int, bool]]] = {}
    out = []
    state.members = {}
    for job_id, st in sorted(obs.pilots.items()):
        if st.state not in (PilotState.RUNNING, PilotState.SAVED) or (
            st.state is PilotState.SAVED and not st.memory_saved
        ):
            continue
        vms = members_of(st)
        if len(vms) > 1:
            state.members[job_id] = tuple(vms)
        pinned = len(vms) > 1 and job_id not in whole
        for vm, node in vms:
            root_mem, cpus = root_size(sizes.get(job_id), node_of.get(node))
            if st.state is PilotState.SAVED:
                mem = state.memory.get(vm) or root_mem  # never measured (a restarted agent): root's figure
                out.append(
                    ObservedVM(
                        vm, job_id, VJobState.SLEEPING, node, mem, cpus, state.demand.get(vm, cpus), pinned=pinned
                    )
                )
            else:
                running.setdefault(node, []).append((job_id, vm, cpus, pinned))
    fresh: dict[str, DomainSample] = {}
    unmeasured = []
    for node, members in sorted(running.items()):
        try:
            on_node = state.sampler(node)
        except VjobError as exc:  # a node unreachable: its VMs are weighed at what root knows of them
            _log.warning("control loop: cannot sample a node's VMs", node=node, error=str(exc))
            on_node = {}
        for job_id, vm, cpus, pinned in members:
            root_mem = max(state.memory.get(vm, 0), root_size(sizes.get(job_id), node_of.get(node))[0])
            sample = on_node.get(vm)
            if sample is None:  # booting, moving, or not where its pilot says
                unmeasured.append(vm)
                out.append(ObservedVM(vm, job_id, VJobState.RUNNING, node, root_mem, cpus, cpus, pinned))
                continue
            fresh[vm] = sample
            demand = state.demand[vm] = vm_demand(sample, state.samples.get(vm), busy=busy)
            mem = measured_mib(sample) or root_mem
            state.memory[vm] = mem
            out.append(ObservedVM(vm, job_id, VJobState.RUNNING, node, mem, max(1, sample.vcpus), demand, pinned))
    if unmeasured:
        _log.warning("control loop: VMs not found on their node, weighed at what root knows of them", vms=unmeasured)
    state.samples = fresh
    state.unmeasured = tuple(unmeasured)
    return out


def forgotten_sizes(ports: Ports, obs: Observation) -> dict[str, tuple[int, int]]:
    """(MiB, CPUs) per VM the store recorded from the RMS for each vjob with a pilot that the
    RMS no longer lists; {} with the store down (those vjobs then weigh whole nodes, last)."""
    known = {j.id for j in obs.view.jobs}
    out: dict[str, tuple[int, int]] = {}
    try:
        for job_id in sorted(set(obs.pilots) - known):
            rec = store_jobs.get(ports.store(), ports.rms, job_id)
            if rec is not None:
                out[job_id] = (rec.memory_mb, rec.cores)
    except StoreError as exc:
        ports.log.warning("control loop: no store: vjobs the RMS forgot weigh whole nodes", error=str(exc))
    return out


def fcfs_queue(obs: Observation, vjobs: Iterable[str]) -> list[str]:
    """The FCFS order: the vjobs the RMS lists by submission time, then every other one (a job
    it forgot, a directory of an id it never had) — never before a known one, whatever it
    claims: an unknown id used to sort first (submitted at 0) and push other users' VMs out."""
    submitted = {j.id: j.submit_time for j in obs.view.jobs}
    return sorted(set(vjobs), key=lambda j: (j not in submitted, submitted.get(j, 0.0), j))


@dataclass(frozen=True)
class Proposal:
    """The switch the control loop proposes this tick (agent.arbiter decides whether it is
    carried out), with what carrying it out needs."""

    plan: Plan
    queue: list[str]
    """The FCFS queue the decision was taken in (for `vjob status`)."""
    requests: Plan | MembersMoved
    """The plan as the pilots take it (agent.pilot_coalesce), or why they cannot: a multi-node
    vjob would move VM by VM (refused, journalled)."""


def propose(ports: Ports, obs: Observation, state: ControlState) -> Proposal | None:
    """Measure, decide and plan (no switch): the plan the step wants carried out, or None when
    there is nothing to change (the status then says why)."""
    state.last_step = time.time()
    if state.sampler is None:
        from provisioning.profiling import node_sampler  # heavy: libvirt-python, only when the loop is on

        state.sampler = node_sampler(ports.driver().connection)
    usable = [n for n in obs.view.nodes if n.state.usable]
    nodes = [NodeSpec(n.name, n.cpus, n.memory_mb) for n in usable]
    names = {n.name for n in usable}
    forgotten = forgotten_sizes(ports, obs)
    movable = {j.id for j in obs.view.jobs if not unmovable(ports.cfg, j)}
    observed = observed_vms(obs, state, busy=ports.cfg.planner.busy, forgotten=forgotten, whole=movable)
    vms = [o for o in observed if o.host in names]
    state.whole = frozenset(j for j in state.members if j in movable and j in {o.vjob for o in vms})
    state.decision = state.plan = None
    if not vms:
        publish(ports, state, record(state, [], "nothing to decide", "no vjob with a pilot on a usable node"))
        return None
    queue = fcfs_queue(obs, (o.vjob for o in vms))
    state.decision = decided = decide(nodes, vms, queue)
    if state.whole:  # moved only by one cut (planner: "vjobs that move whole")
        inst = decided.instance
        state.decision = replace(decided, instance=Instance(inst.nodes, inst.vms, dict(inst.target), state.whole))
    try:
        state.plan = plan = plan_for(
            state.decision, optimizer=ports.cfg.planner.optimizer, time_limit_s=min(ports.cfg.planner.time_limit_s, 5.0)
        )
    except VjobError as exc:  # the tick reports it; the status says why there is no plan
        publish(ports, state, record(state, queue, "no plan", str(exc)))
        raise
    if plan is None:
        why = (
            "every vjob stays as it is and no node is overloaded"
            if not state.decision.changes
            else "the planner found nothing to do"
        )
        publish(ports, state, record(state, queue, "no change", why))
        return None
    overloaded = dict(zip(state.decision.overloaded, state.decision.why, strict=True))
    ports.log.info(
        "consolidation planned",
        overloaded=overloaded,
        cost=plan.cost,
        actions=plan.count(),
        jobs=sorted({a.vjob for a in plan.actions}),
        unmeasured=list(state.unmeasured),
    )
    try:
        return Proposal(plan, queue, coalesce(plan, state.members, movable=state.whole))
    except MembersMoved as refused:
        return Proposal(plan, queue, refused)


def carry_out(ports: Ports, obs: Observation, state: ControlState, proposal: Proposal) -> ExecutionReport | None:
    """The proposed switch, carried out live and journalled; a refused one journalled as failed
    (once: the same refusal again is only logged). The report of the switch, or None when
    nothing was carried out nor journalled (the remap step may then run: agent.arbiter)."""
    plan, queue, requests = proposal.plan, proposal.queue, proposal.requests
    if isinstance(requests, MembersMoved):
        refused = requests
        ports.log.error("consolidation refused: a multi-node vjob would move VM by VM", error=str(refused))
        if str(refused) == state.refused:
            publish(ports, state, record(state, queue, "refused", str(refused)))
            return None  # journalled at the step that first planned it
        state.refused = str(refused)
        report = journal_refusal(
            ports.store(),
            plan,
            refused,
            reason=f"consolidation refused: {refused}",
            tag=EXECUTOR_TAG,
            job_key=ports.job_key,
        )
        publish(ports, state, record(state, queue, "refused", str(refused), report))
        return report
    state.refused = ""
    if not ports.lease.held():
        publish(ports, state, record(state, queue, "no plan", "the agent lease is held by another agent"))
        return None
    doing = f"carrying out {len(plan.actions)} action(s) in {len(plan.pools)} pool(s)"
    publish(ports, state, record(state, queue, "switching", doing))
    moves = whole_moves(plan, state.members)
    performer = WholeMovePerformer(live_performer(ports, obs, "consolidation"), moves)  # memory-scaled, lease-bound
    report = ports.executor(performer, tag=EXECUTOR_TAG).execute(requests, reason="consolidation: measured demand")
    remember_moves(ports, obs, report, moves, state.members)
    ports.log.info("consolidation done", switch=report.switch_id, summary=report.summary())
    publish(ports, state, record(state, queue, report.state, report.summary(), report))
    return report


def remember_moves(
    ports: Ports,
    obs: Observation,
    report: ExecutionReport,
    moves: Mapping[str, tuple[str, ...]],
    members: Mapping[str, tuple[tuple[str, str], ...]],
) -> None:
    """Each VM of a vjob moved whole recorded on its new node (root's record, which vouches for a
    VM off its allocation: agent.remap_whole.believed); a failure is logged, the move is done."""
    jobs = {j.id: j for j in obs.view.jobs}
    for a in report.done:
        job, st = jobs.get(a.vjob), obs.pilots.get(a.vjob)
        if a.kind is not Action.RESUME or a.vjob not in moves or job is None or st is None:
            continue
        try:
            for (vm, _slept), node in zip(members[a.vjob], moves[a.vjob], strict=True):
                store_vms.remember(ports.store(), ports.rms, job, vm=vm, node=node, image=st.image)
        except (StoreError, InputError) as exc:
            ports.log.warning("control loop: a moved vjob's VMs not recorded", job=a.vjob, error=str(exc))


def vjob_reasons(decision: ControlDecision, queue: list[str]) -> dict[str, dict[str, Any]]:
    """Each vjob of the decision: its state, the decision module's target, and why (its place in
    the FCFS queue, what root measured it using, whether it fits beside the vjobs before it)."""
    out: dict[str, dict[str, Any]] = {}
    target = decision.selection.target
    for rank, (vjob, vms) in enumerate(sorted(decision.instance.vjobs().items(), key=lambda kv: queue.index(kv[0]))):
        cpu, mem = sum(v.cpu for v in vms), sum(v.mem for v in vms)
        now, then = vms[0].state, target[vjob]
        nodes = sorted({v.host for v in vms if v.host})
        size = f"#{rank + 1} in the FCFS queue, measured {cpu} CPU, {mem} MiB over {len(vms)} VM(s)"
        where = f" on the nodes it is pinned to ({', '.join(nodes)})" if vms[0].pinned else ""
        ahead = f" beside the {rank} vjob(s) before it" if rank else ""
        if then is VJobState.RUNNING:
            why = f"{'runs' if now is VJobState.RUNNING else 'wakes'}: {size}: fits{where}{ahead}"
        else:
            why = f"{'sleeps' if now is VJobState.RUNNING else 'stays asleep'}: {size}: no room{where}{ahead}"
        out[vjob] = {
            "state": now.value,
            "target": then.value,
            "position": rank + 1,
            "cpu": cpu,
            "mem_mib": mem,
            "nodes": nodes,
            "pinned": vms[0].pinned,
            "why": why,
        }
    return out


def record(
    state: ControlState, queue: list[str], outcome: str, why: str, report: ExecutionReport | None = None
) -> dict[str, Any]:
    """What the step decided and did, as `vjob status` shows it: `outcome` is `nothing to
    decide`, `no change`, `no plan` (the planner failed: `why`), `refused`, `switching` (the
    plan being carried out), or the switch's end state (`done`, `failed`)."""
    decision, plan = state.decision, state.plan
    doc: dict[str, Any] = {
        "at": state.last_step,
        "policy": "fcfs",
        "vjobs": {} if decision is None else vjob_reasons(decision, queue),
        "overloaded": {} if decision is None else dict(zip(decision.overloaded, decision.why, strict=True)),
        "unmeasured": list(state.unmeasured),
        "plan": {"outcome": outcome, "why": why, "cost": None, "actions": [], "pools": 0, "switch": None},
    }
    if plan is not None:
        actions = [a.to_dict() | {"pool": i} for i, pool in enumerate(plan.pools) for a in pool]
        doc["plan"] |= {"cost": plan.cost, "pools": len(plan.pools), "optimizer": plan.optimizer, "actions": actions}
    if report is not None:
        doc["plan"] |= {"switch": report.switch_id, "finished_at": time.time()}
    return doc


def publish(ports: Ports, state: ControlState, doc: dict[str, Any]) -> None:
    """The step's record where `vjob status` reads it (agent.status_file); a write failure is
    only logged: the loop goes on."""
    try:
        write_status_file(ports.cfg.data_path / STATUS_NAME, doc)
    except OSError as exc:
        ports.log.warning("control loop: cannot write the status", error=str(exc))
        return
    state.published = doc


__all__ = [
    "STATUS_NAME",
    "Allotment",
    "ControlState",
    "Proposal",
    "Sampler",
    "allotments",
    "carry_out",
    "fcfs_queue",
    "forgotten_sizes",
    "measured_mib",
    "members_of",
    "observed_vms",
    "propose",
    "publish",
    "record",
    "root_size",
    "vjob_reasons",
    "vm_demand",
]
