"""Which multi-VM vjobs the agent may move whole, where root believes their VMs are, and how
their moves are carried out (issue 38, item 6; docs/remap.md, "A vjob of several VMs moves whole").

Why a rule about the pilot's mode: a multi-VM vjob's move is one cut — every VM suspended,
then every VM resumed on its new node — and only a pilot that reaches every node's libvirt
can resume a VM on a node its job has no process on: the leader-mode pilot of a root job
without the node service's job network (pilot.multinode.JobVMs.movable). A per-node pilot's
VMs are each driven by the member pilot of their own node, and an ordinary user's job always
runs per-node pilots (pilot.members.launch.pilots_mode), so those vjobs are left alone, with
the reason, and their pilot would refuse such a resume anyway.

Why the store's `vms` rows vouch for a VM off its allocation: the journal holds one resume
per whole move (the pilot takes one request for all its VMs, agent.pilot_coalesce), naming
the first VM's node only; each VM's new node is what the remap step records, as root, once
the pilot answered (`remember`). A pilot's `member_nodes` is the job user's file: a node it
names outside the allocation that root recorded for no VM of the job is not believed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sqlalchemy import select

from agent.observe import Observation
from agent.pilot_coalesce import WholeMovePerformer, coalesce, whole_moves
from agent.pilot_performer import EXECUTOR_TAG, live_performer
from agent.ports import Ports
from preemption.executor import ExecutionReport, Executor, KeyedPerformer
from preemption.planner.plan import Plan
from vjob.config import Config
from vjob.errors import InputError, StoreError
from vjob.model import Action, Job
from vjob.pilot_files import PilotStatus, member_names, vms_of
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.schema import ActionRecord


def unmovable(cfg: Config, job: Job) -> str:
    """Why the pilot of `job`, a vjob of several VMs, cannot resume them on other nodes ("" when
    it can): the same rule the pilot applies to itself (pilot.members.launch.pilots_mode and
    pilot.multinode.JobVMs.movable), read from the site configuration they share."""
    if job.user != "root":
        return "its VMs are driven by per-node pilots (an ordinary user's job): none resumes a VM elsewhere"
    if cfg.agent.multinode_pilots != "leader":
        return "its VMs are driven by per-node pilots ([agent] multinode_pilots): none resumes a VM elsewhere"
    if getattr(getattr(cfg, "node", None), "socket", ""):
        return "its job network is the node service's of each node ([node] socket): its VMs stay on their nodes"
    return ""


def recorded_nodes(store: Store, rms: str, job_id: str) -> dict[str, str]:
    """VM → the node root last recorded it on (the store's `vms` rows)."""
    return {v.name: v.node for v in store_vms.of_job(store, rms, job_id)}


def believed(st: PilotStatus, job: Job, recorded: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """(VM, node) of each VM of a multi-VM pilot when root believes every one: on a node the
    RMS allocated the job, or where root recorded it (a whole move); None otherwise."""
    vms = vms_of(st)
    allocated = set(job.allocated_nodes)
    if any(node not in allocated and recorded.get(vm) != node for vm, node in vms):
        return None
    return vms


def whole_move_counts(store: Store, rms: str, job_ids: Sequence[str]) -> dict[str, int]:
    """How many times each job was moved whole: its done resumes onto another node (one
    journalled action per move, the first VM's: agent.pilot_coalesce)."""
    if not job_ids:
        return {}
    keys = [f"{rms}:{j}" for j in job_ids]
    query = select(ActionRecord.job_key).where(
        ActionRecord.action == "resume",
        ActionRecord.state == "done",
        ActionRecord.source != ActionRecord.destination,
        ActionRecord.job_key.in_(keys),
    )
    out: dict[str, int] = {}
    with store.session() as s:
        for key in s.scalars(query):
            job = key.split(":", 1)[1]
            out[job] = out.get(job, 0) + 1
    return out


def executor_for(
    ports: Ports,
    obs: Observation,
    reason: str,
    plan: Plan,
    members: Mapping[str, Sequence[tuple[str, str]]],
    movable: Collection[str],
) -> tuple[Executor, Plan]:
    """The live executor of a switch with whole moves, and the plan as the pilots take it: each
    multi-VM vjob's actions coalesced into one request per pool (MembersMoved when a vjob not
    `movable` would move), a moved vjob's resume naming every VM's node (WholeMovePerformer);
    journalled under the live switches' tag like any other."""
    requests = coalesce(plan, members, movable=movable)
    performer = WholeMovePerformer(live_performer(ports, obs, reason), whole_moves(plan, members))
    return ports.executor(performer, tag=EXECUTOR_TAG), requests


def journalled_moves(plan: Plan, pilots: Mapping[str, PilotStatus | None]) -> dict[str, tuple[str, ...]]:
    """vjob → the node of each of its VMs in rank order, for each vjob of several VMs whose
    resume a journalled switch holds: what a restarted agent's recovery asks its pilot.

    Why from the plan's placement: the journal holds one resume per whole move, the first VM's
    (agent.pilot_coalesce); the other VMs' new nodes are only in the placement journalled with
    the switch. Repeated as journalled, the resume named the first VM's node alone: the pilot
    refused it (it never moves VMs one by one) and the job, killed mid-move, slept on. The VM
    count is the pilot's (`member_nodes`), every name must be in the placement and the first
    node be the journalled one; otherwise the resume is repeated as journalled. A resume in
    place names the nodes the VMs slept on, which the pilot takes as one (pilot.switch_requests)."""
    out: dict[str, tuple[str, ...]] = {}
    for a in plan.actions:
        st = pilots.get(a.vjob)
        if a.kind is not Action.RESUME or st is None or len(st.member_nodes) < 2 or st.vm != a.vm:
            continue
        if not a.vm.endswith("-0"):
            continue
        nodes = tuple(plan.placement.get(vm, "") for vm in member_names(a.vm.removesuffix("-0"), len(st.member_nodes)))
        if all(nodes) and nodes[0] == a.dst:
            out[a.vjob] = nodes
    return out


def recovery_performer(ports: Ports, obs: Observation, plan: Plan) -> tuple[KeyedPerformer, dict[str, tuple[str, ...]]]:
    """The performer that finishes a journalled live switch (agent.recover): the pilots' own,
    each multi-VM vjob's resume naming every VM's node (journalled_moves); and those nodes."""
    moves = journalled_moves(plan, obs.pilots)
    inner = live_performer(ports, obs, "recovery")
    return (WholeMovePerformer(inner, moves) if moves else inner), moves


def record_moves(
    ports: Ports,
    report: ExecutionReport,
    moves: Mapping[str, Sequence[str]],
    jobs: Mapping[str, Job],
    pilots: Mapping[str, PilotStatus | None],
) -> None:
    """Each VM of a multi-VM vjob whose resume `report` finished recorded on its node (root's
    record, which vouches for a VM off its allocation: `believed`, agent.observe), as the remap
    step and the control loop record the moves they finish; a failure is logged."""
    for a in report.done:
        nodes, job, st = moves.get(a.vjob), jobs.get(a.vjob), pilots.get(a.vjob)
        if a.kind is not Action.RESUME or nodes is None or job is None:
            continue
        image = st.image if st is not None else ""
        try:
            for vm, node in zip(member_names(a.vm.removesuffix("-0"), len(nodes)), nodes, strict=True):
                store_vms.remember(ports.store(), ports.rms, job, vm=vm, node=node, image=image)
            ports.recorded_vms[job.id] = (",".join(nodes), image)
        except (StoreError, InputError) as exc:
            ports.log.warning("recovery: a moved vjob's VMs not recorded", jobs=[a.vjob], error=str(exc))


__all__ = [
    "believed",
    "executor_for",
    "journalled_moves",
    "record_moves",
    "recorded_nodes",
    "recovery_performer",
    "unmovable",
    "whole_move_counts",
]
