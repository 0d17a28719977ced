"""Live remapping in the agent (ARRIVE-F, docs/remap.md): profile, decide, swap by live migration.

Why a thin step around pure parts: the decision is `preemption.remap.policy.decide` through
`preemption.remap.live` (the RMS view: swaps of equal node counts only, no move onto nodes the
RMS has not given the job, a VM off its allocation sent home as soon as its own node is free);
this module only gathers inputs and carries the moves out. Each tick it sends home what must
go home; every `[remap] tau_s` it also samples each node's vjob VMs through libvirt
(provisioning.profiling), prices the window on every sub-cluster and swaps what gains.

A move is a `migrate` action of an executor switch through the vjobs' pilots
(agent.pilot_performer), journalled like every switch: a crash mid-swap is finished by
agent.recover, the journal counts each job's migrations (the bound against ping-pong) and
holds, root-written, the host each VM was moved to (agent.observe trusts a pilot's node
outside its allocation only when the journal moved it there); the store's `vms` rows follow.

After each completed move the VM's balloon is set to the destination kind's memory per slot,
bounded by the domain's ceiling and never below what its job asked (preemption.remap.memory;
through the provisioning driver, logged with the job): a thrashing job moved to a bigger kind
gets the memory there, and gives it back when it moves to a smaller one.

A job's memory, for its migration cost and its fit on a kind, is the one libvirt holds for its
VM (the sample's `memory_kib`), never the pilot's declared `memory_mb`: the state file is the
job user's. A pilot whose job ends while a swap has its VM away holds its node (pilot.pilot,
bounded) until this step has sent the partner's VM home and writes it a `release` (`release`).

A job of several VMs moves whole or not at all: the pure parts decide it as one job (one
decision for all its VMs: preemption.remap.live), `allowed_moves` drops a decision whole, and
`switch_plan` makes its move one cut (all its VMs suspended in one pool, resumed on their new
nodes in the next), which its pilot takes as one suspend and one resume naming every VM's node
(agent.remap_whole, agent.pilot_coalesce). Only a pilot that can resume its VMs elsewhere (a
root job's leader-mode pilot without the node service's job network) is remapped; the others
are left alone with the reason (agent.remap_whole.unmovable).

A look is two halves with the agent's arbiter between them (agent.arbiter, one plan per tick):
`propose` profiles and decides (the moves it wants), `carry_out` migrates the moves the arbiter
let through, sets the balloons, releases the pilots of ended swapped vjobs and publishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from agent.observe import Observation
from agent.pilot_performer import live_executor
from agent.ports import Ports
from agent.remap_whole import believed, executor_for, recorded_nodes, unmovable, whole_move_counts
from agent.status_file import write_status_file
from preemption.executor import ExecutionReport
from preemption.remap.claims import PassClaims, allowed_moves, remappable
from preemption.remap.farm import load_subclusters
from preemption.remap.live import (
    Move,
    Placement,
    decide_swaps,
    homeward,
    job_subcluster,
    moves_for,
    node_subclusters,
    released,
    running_jobs,
    seen_memory,
    switch_plan,
)
from preemption.remap.memory import MemoryTarget, balloon_target_mib, targets_after
from preemption.remap.models import Profile, SubCluster
from preemption.remap.policy import Decision, RemapParams
from vjob.errors import VjobError
from vjob.model import Action, JobState
from vjob.pilot_files import PilotState, RequestKind, vms_of
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store

if TYPE_CHECKING:
    from libvirt import virConnect

    from provisioning.profiling import DomainSample

STATUS_NAME = "remap.json"
"""The step's last summary (skip reasons, moves, balloon targets) for `vjob status`, in the data
directory, rewritten when it changes."""

Sampler = Callable[[str, Sequence[str]], Mapping[str, "DomainSample"]]
"""(node, VM names on it) → one sample of each: libvirt's domain statistics by default."""


class MemoryControl(Protocol):
    """The provisioning driver's memory calls (provisioning.driver.Driver), all the step needs to
    set a balloon target."""

    def memory(self, vm: str, node: str) -> tuple[int, int]: ...

    def set_memory(self, vm: str, node: str, mib: int) -> None: ...


@dataclass
class RemapState:
    """What the step carries between ticks: the farm, the last sample of each VM (the start
    of its current window), and the last decisions and switch (for the log and tests)."""

    sampler: Sampler | None = None
    farm: dict[str, SubCluster] | None = None
    samples: dict[str, DomainSample] = field(default_factory=dict)
    memory_mib: dict[str, int] = field(default_factory=dict)
    """Each VM's current memory in its last sample (libvirt's, not the pilot's): its T^M."""
    last_profile: float = 0.0
    decisions: list[Decision] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """vjob → why the last step left it alone (the pass's claims; preemption.remap.claims)."""
    report: ExecutionReport | None = None
    memory: MemoryControl | None = None
    """Sets balloon targets after moves; the provisioning driver by default."""
    targets: list[dict[str, Any]] = field(default_factory=list)
    """The balloon targets the last moves set (or failed to set), for the log and tests."""
    released: list[str] = field(default_factory=list)
    """The ended vjobs whose pilots the last step released (no foreign VM on their nodes)."""
    published: dict[str, Any] | None = None
    """The summary last written for `vjob status` (STATUS_NAME)."""


def libvirt_sampler(connection: Callable[[str], virConnect]) -> Sampler:
    """Samples through `connection(node)` (the provisioning driver's, one per node); each new
    VM gets its perf events and balloon statistics turned on once."""
    from provisioning.profiling import Profiler  # heavy: libvirt-python, only when remapping is on

    profilers: dict[str, Profiler] = {}
    enabled: set[tuple[str, str]] = set()

    def sample(node: str, vms: Sequence[str]) -> Mapping[str, DomainSample]:
        prof = profilers.get(node)
        if prof is None:
            prof = profilers[node] = Profiler(connection(node))
        for vm in vms:
            if (node, vm) not in enabled:
                prof.enable(vm)
                enabled.add((node, vm))
        return prof.sample(vms)

    return sample


def placements(
    obs: Observation,
    moved_to: Mapping[str, str],
    counts: Mapping[str, int],
    several: Mapping[str, Sequence[tuple[str, str]]] | None = None,
) -> list[Placement]:
    """Running vjobs with a running pilot: a one-VM vjob on the node its pilot names when the
    RMS allocated it or the journal moved its VM there (`moved_to`: VM → last destination); a
    vjob of several VMs only when `several` holds it (its VMs where root believes them, and a
    pilot that moves them whole: agent.remap_whole)."""
    out = []
    now = obs.view.now
    several = several or {}
    for job in obs.view.running:
        st = obs.pilots.get(job.id)
        if job.state is not JobState.RUNNING or st is None or st.state is not PilotState.RUNNING:
            continue
        remaining = None
        if job.walltime is not None and job.start_time is not None:
            remaining = max(0.0, job.start_time + job.walltime - now)
        if job.id in several:
            vms = tuple(several[job.id])
            out.append(Placement(job.id, vms, job.allocated_nodes, st.memory_mb, remaining, counts.get(job.id, 0)))
            continue
        if job.nodes != 1 or len(job.allocated_nodes) > 1 or len(vms_of(st)) > 1:
            continue  # several nodes, or VMs, not vouched for whole (module docstring)
        if job.allocated_nodes and st.node not in job.allocated_nodes and moved_to.get(st.vm) != st.node:
            continue  # a node the pilot claims but neither the RMS nor root put it on
        out.append(
            Placement(job.id, ((st.vm, st.node),), job.allocated_nodes, st.memory_mb, remaining, counts.get(job.id, 0))
        )
    return out


def several_vms(
    ports: Ports, obs: Observation, store: Store, moved_to: dict[str, str], counts: dict[str, int]
) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str]]:
    """The running vjobs of several VMs the step may move whole, each VM where root believes it
    (agent.remap_whole.believed), and why each other one is left alone. Adds to `moved_to` the
    nodes root recorded for the VMs of vjobs it moved whole (their pilots' release needs them)
    and to `counts` their whole moves (the bound against ping-pong)."""
    multi = [j for j in obs.view.running if j.nodes > 1 or len(j.allocated_nodes) > 1]
    multi += [
        j
        for j in obs.view.running
        if j not in multi and (st := obs.pilots.get(j.id)) is not None and len(vms_of(st)) > 1
    ]
    whole = whole_move_counts(store, ports.rms, [j.id for j in multi])
    for job_id, n in whole.items():
        counts[job_id] = counts.get(job_id, 0) + n
    out: dict[str, list[tuple[str, str]]] = {}
    skipped: dict[str, str] = {}
    for job in multi:
        st = obs.pilots.get(job.id)
        recorded = recorded_nodes(store, ports.rms, job.id) if whole.get(job.id) else {}
        moved_to.update({vm: node for vm, node in recorded.items() if node not in job.allocated_nodes})
        if st is None or st.state is not PilotState.RUNNING:
            continue
        vms = vms_of(st)
        why = unmovable(ports.cfg, job)
        if len(vms) < 2:
            skipped[job.id] = f"{max(job.nodes, len(job.allocated_nodes))} nodes but one VM: not remapped"
        elif why:
            skipped[job.id] = f"several VMs ({', '.join(vm for vm, _ in vms)}), not moved: {why}"
        elif (believed_vms := believed(st, job, recorded)) is None:
            skipped[job.id] = "its pilot names nodes the RMS did not allocate and root did not move it to"
        else:
            out[job.id] = believed_vms
    return out, skipped


@dataclass(frozen=True)
class Proposal:
    """The moves the remap step proposes this tick (agent.arbiter checks them against the
    pass's claims), with what carrying them out needs."""

    moves: tuple[Move, ...]
    every: tuple[Placement, ...]
    """Every remappable-or-not placement seen this tick (for the balloons and releases)."""
    moved_to: Mapping[str, str]
    """VM → the destination the journal last moved it to."""
    refused: tuple[tuple[Move, str], ...] = ()
    """Moves the arbiter refused, with why (agent.arbiter: RULE_CLAIMS)."""


def propose(ports: Ports, obs: Observation, state: RemapState, claims: PassClaims | None = None) -> Proposal:
    """The moves of one remapping look: homeward moves every tick; profiles and swaps every τ.
    `claims`: what the vjob policy pass acts on in this tick — nothing of it is moved
    (preemption.remap.claims), nor decided on."""
    claims = claims or PassClaims()
    cfg = ports.cfg.remap
    if state.farm is None:
        state.farm = load_subclusters(cfg.farm_file)
    farm = state.farm
    store = ports.store()
    done = journal.migrations(store, ports.rms, [j.id for j in obs.view.running])
    moved_to = {m.vm_name: m.destination for m in done}
    counts: dict[str, int] = {}
    for m in done:
        counts[m.rms_job_id] = counts.get(m.rms_job_id, 0) + 1
    several, left = several_vms(ports, obs, store, moved_to, counts)
    every = placements(obs, moved_to, counts, several)
    moves, dropped = allowed_moves(homeward(every), claims)
    places, skipped = remappable(every, claims)
    skipped.update(left)
    for m, why in dropped:
        skipped[m.job] = why
    if skipped != state.skipped:  # logged when it changes, not every tick
        ports.log.info("remap: left alone", vjobs=skipped)
    state.skipped = skipped
    now = time.monotonic()
    if not moves and now - state.last_profile >= cfg.tau_s:
        state.last_profile = now
        params = RemapParams(cfg.beta, cfg.tau_s, cfg.threshold_s, cfg.max_migrations, cfg.thrash_pages_s)
        node_sc = node_subclusters(obs.view.nodes, farm)
        profiles = _profile(ports, state, places, node_sc, farm)
        priced, unseen = seen_memory(places, state.memory_mib)
        if unseen:
            state.skipped = skipped = {**skipped, **unseen}
            ports.log.info("remap: memory not seen, left alone", vjobs=unseen)
        jobs = running_jobs(priced, profiles, node_sc, farm, params, cfg.migrate_bandwidth_mb_s)
        state.decisions = decide_swaps(jobs, farm, params)
        moves = moves_for(state.decisions, places)
    return Proposal(tuple(moves), tuple(every), moved_to)


def carry_out(ports: Ports, obs: Observation, state: RemapState, proposal: Proposal) -> ExecutionReport | None:
    """The moves as one journalled switch, then the moved VMs' balloons, the pilots of ended
    swapped vjobs released, and the summary published (every look, moves or not)."""
    for m, why in proposal.refused:
        state.skipped[m.job] = why
    moves, every, moved_to = list(proposal.moves), list(proposal.every), proposal.moved_to
    state.moves = moves
    report = None
    moved: list[Move] = []
    if moves:
        state.report = report = _migrate(ports, obs, moves, every)
        for m in moves:
            state.samples.pop(m.vm, None)  # its next window starts on the new host
        done = {(a.vm, a.dst) for a in report.done}
        whole = {a.vjob for a in report.done if a.kind is Action.RESUME}  # a cut: all its VMs or none
        moved = [m for m in moves if (m.vm, m.dst) in done or m.job in whole]
    if moved:
        farm = state.farm or {}  # loaded by `propose`
        node_sc = node_subclusters(obs.view.nodes, farm)
        state.targets = set_memory(ports, state, targets_after(moved, every, node_sc, farm))
    state.released = release(ports, obs, every, moved_to, moved)
    publish(ports, state)
    return report


def release(
    ports: Ports, obs: Observation, every: Sequence[Placement], moved_to: Mapping[str, str], moved: Sequence[Move]
) -> list[str]:
    """Release the pilots of ended vjobs whose VM the journal moved (a swap) once no foreign VM
    runs on their nodes: such a pilot holds its node (pilot.pilot, bounded) so that the RMS does
    not free it while the partner's VM is still there. "Ended": the RMS still runs the job but
    its pilot finished (the guest ended) or saved on SIGTERM (no checkpoint request: nothing
    waits for a requeue). Where the VMs are: root's placements after this step's moves."""
    ended: dict[str, tuple[str, ...]] = {}
    for job in obs.view.running:
        st = obs.pilots.get(job.id)
        if st is None or st.vm not in moved_to or not job.allocated_nodes:
            continue
        if st.state is PilotState.FINISHED or (st.state is PilotState.SAVED and not st.request_id):
            ended[job.id] = job.allocated_nodes
    if not ended:
        return []
    dst = {m.vm: m.dst for m in moved}
    now = [replace(p, vms=tuple((vm, dst.get(vm, node)) for vm, node in p.vms)) for p in every]
    out = []
    for job_id in released(ended, now):
        st = obs.pilots[job_id]
        request_id = f"release-{st.vm}"
        try:
            ports.pilot_dir(job_id).request(RequestKind.RELEASE, request_id, reason="no remapped VM on its node")
        except (OSError, VjobError) as exc:
            ports.log.warning("remap: cannot release a pilot", job=job_id, error=str(exc))
            continue
        ports.log.info("remap: pilot released", job=job_id, nodes=list(ended[job_id]))
        out.append(job_id)
    return out


def publish(ports: Ports, state: RemapState) -> None:
    """The step's summary where `vjob status` reads it (the data directory, root's), when it
    changed: why each vjob was left alone, the last moves and balloon targets. The status reads
    the pilots and the store, never the agent's memory; a write failure is only logged."""
    doc = summary(state)
    if doc == state.published:
        return
    path = ports.cfg.data_path / STATUS_NAME
    try:
        write_status_file(path, doc | {"at": time.time()})
    except OSError as exc:
        ports.log.warning("remap: cannot write the status", path=str(path), error=str(exc))
        return
    state.published = doc


def set_memory(ports: Ports, state: RemapState, targets: Sequence[MemoryTarget]) -> list[dict[str, Any]]:
    """Each moved VM's balloon to its new kind's memory per slot, bounded by the domain's ceiling
    and never below what its job asked. A failure is logged with the job and the VM keeps the
    memory it had: the move itself is done and journalled."""
    if state.memory is None:
        state.memory = ports.driver()
    out = []
    for t in targets:
        rec: dict[str, Any] = {"job": t.job, "vm": t.vm, "node": t.node, "kind": t.kind, "want_mib": t.want_mib}
        try:
            current, most = state.memory.memory(t.vm, t.node)
            target = balloon_target_mib(t.want_mib, t.asked_mib, most)
            rec |= {"from_mib": current, "max_mib": most, "mib": target}
            if target != current:
                state.memory.set_memory(t.vm, t.node, target)
            ports.log.info("remap: vm memory", **rec)
        except VjobError as exc:
            rec["error"] = str(exc)
            ports.log.warning("remap: cannot set the vm's memory", **rec)
        out.append(rec)
    return out


def _profile(
    ports: Ports,
    state: RemapState,
    places: Sequence[Placement],
    node_sc: Mapping[str, str],
    farm: Mapping[str, SubCluster],
) -> dict[str, Profile | None]:
    """Each job's profile over the window since its VMs' last samples (None: no window yet)."""
    from preemption.remap.online import profile_from_window  # heavy: libvirt (provisioning.profiling)
    from provisioning.profiling import window  # heavy: libvirt

    if state.sampler is None:
        if state.memory is None:
            state.memory = ports.driver()
        state.sampler = libvirt_sampler(state.memory.connection)  # type: ignore[attr-defined]
    by_node: dict[str, list[str]] = {}
    for p in places:
        for vm, node in p.vms:
            by_node.setdefault(node, []).append(vm)
    fresh: dict[str, DomainSample] = {}
    for node, vms in sorted(by_node.items()):
        try:
            fresh.update(state.sampler(node, sorted(vms)))
        except VjobError as exc:  # a VM that just ended, a node unreachable: no window there
            ports.log.warning("remap: cannot sample a node's VMs", node=node, error=str(exc))
    out: dict[str, Profile | None] = {}
    for p in places:
        sc = job_subcluster(p, node_sc)
        vm = p.vms[0][0]
        prev, now = state.samples.get(vm), fresh.get(vm)
        out[p.job] = None
        if sc is not None and prev is not None and now is not None and now.t > prev.t:
            out[p.job] = profile_from_window(window(prev, now), freq_ghz=farm[sc].freq_ghz)
    state.samples = fresh
    state.memory_mib = {vm: s.memory_kib // 1024 for vm, s in fresh.items() if s.memory_kib}
    return out


def _migrate(ports: Ports, obs: Observation, moves: Sequence[Move], every: Sequence[Placement]) -> ExecutionReport:
    """The moves as one journalled switch through the pilots (`switch_plan`: a live migration
    per one-VM job, one cut per job of several VMs); each VM moved is then recorded on its new
    host in the store."""
    plan = switch_plan(moves, every)
    why = "; ".join(sorted({f"{m.job} {m.why}" for m in moves}))
    if not ports.lease.held():
        raise VjobError("remap: the agent lease is held by another agent; no migration")
    ports.log.info("remap: migrating", moves=[f"{m.vm} {m.src}->{m.dst} ({m.why})" for m in moves])
    moving = {m.job for m in moves}
    members = {p.job: p.vms for p in every if p.job in moving and len(p.vms) > 1}
    if members:  # whole moves: one suspend and one resume per job, through its pilot
        executor, requests = executor_for(ports, obs, "remap", plan, members, movable=set(members))
    else:
        executor, requests = live_executor(ports, obs, "remap"), plan  # memory-scaled waits, lease-bound
    report = executor.execute(requests, reason=f"remap: {why}")
    jobs = {j.id: j for j in obs.view.jobs}
    for a in report.done:
        st = obs.pilots.get(a.vjob)
        job = jobs.get(a.vjob)
        if job is None or st is None or a.dst is None or a.kind is Action.SUSPEND:
            continue
        whole = a.vjob in members  # a whole move: every VM's new node, from the plan
        nodes = [(vm, plan.placement.get(vm, a.dst)) for vm, _ in members[a.vjob]] if whole else [(a.vm, a.dst)]
        for vm, node in nodes:
            store_vms.remember(ports.store(), ports.rms, job, vm=vm, node=node, image=st.image, memory_mb=st.memory_mb)
        ports.recorded_vms[job.id] = (",".join(node for _, node in nodes), st.image)
    ports.log.info("remap: done", switch=report.switch_id, summary=report.summary())
    return report


def summary(state: RemapState) -> dict[str, Any]:
    """The last decisions and moves, as plain data (logs, tests)."""
    return {
        "decisions": [
            {"kind": d.kind, "reason": d.reason, "jobs": list(d.jobs), "gain_s": d.gain_s} for d in state.decisions
        ],
        "moves": [{"job": m.job, "vm": m.vm, "src": m.src, "dst": m.dst, "why": m.why} for m in state.moves],
        "skipped": dict(state.skipped),
        "memory": list(state.targets),
    }


__all__ = [
    "STATUS_NAME",
    "MemoryControl",
    "Proposal",
    "RemapState",
    "Sampler",
    "carry_out",
    "libvirt_sampler",
    "placements",
    "propose",
    "publish",
    "set_memory",
    "summary",
]
