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
from preemption.executor import Executor
from preemption.planner.plan import Plan
from vjob.config import Config
from vjob.model import Job
from vjob.pilot_files import PilotStatus, vms_of
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


__all__ = ["believed", "executor_for", "recorded_nodes", "unmovable", "whole_move_counts"]
