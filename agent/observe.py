"""Observe: one consistent look at the RMS, the pilots and the store, as a ClusterView.

Why apart from the loop: this is where what users control (their pilot directories) meets what
root trusts (the RMS and the store). A pilot's state file is read with the checks of
vjob.pilot_files (no symlink, regular file, size limit, typed fields) and only when the
directory belongs to the job's own user; a state file that fails them is logged and ignored —
one user's bad file never stops a tick for everybody.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from agent.pilot_snapshots import record_pilot_snapshots
from provisioning.images import record_node_image
from ubis_priority import usage as ubis_usage
from vjob.errors import InputError, StoreError, VjobError
from vjob.model import ClusterView, Job, JobState, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.schema import JobRecord

if TYPE_CHECKING:
    from agent.loop import Agent


@dataclass
class Observation:
    """What one tick saw: the view the policies get, plus what only the agent needs."""

    view: ClusterView
    pilots: dict[str, PilotStatus]
    sleeping: dict[str, tuple[str, ...]]
    """Jobs vjob checkpointed and still holds → the node(s) their VM was saved on."""
    store_ok: bool


def observe(agent: Agent, *, track: bool = True) -> Observation:
    """One consistent look at the RMS, the pilots and the store; `track` records new jobs."""
    now = time.time()
    rms_jobs = agent.adapter.jobs()
    nodes = agent.adapter.nodes()
    users = {j.id: j.user for j in rms_jobs}
    pilots = read_pilots(agent, all_dirs(agent.root, agent.rms), users)
    jobs: list[Job] = []
    sleeping: dict[str, tuple[str, ...]] = {}
    store_ok = True
    records: dict[str, JobRecord] = {}
    try:
        store = agent.store()
        records = _records(store, agent.rms, [j.id for j in rms_jobs])
        if track:
            for job in rms_jobs:
                if job.id not in records:
                    _track(agent, store, job)
            _remember_vms(agent, store, rms_jobs, pilots)
            record_pilot_snapshots(agent, store, rms_jobs, pilots)  # pilots have no store credentials
        agent.metrics.store_up.set(1)
    except StoreError as exc:
        agent.store_failed(exc)
        store_ok = False
    for job in rms_jobs:
        rec = records.get(job.id)
        pilot = pilots.get(job.id)
        changes: dict[str, Any] = {}
        if rec is not None:
            changes.update(
                preempt_count=rec.preempt_count,
                preempted_seconds=rec.preempted_seconds,
                preempted_since=rec.preempted_since,
            )
            preempted = rec.preempted_since is not None
            if preempted and job.state is JobState.RUNNING and pilot and pilot.state is PilotState.SAVED:
                # Requeue-held, its VM saved, but the RMS still winds it up (COMPLETING):
                # its nodes are as good as free, it must not be chosen as a victim again.
                changes.update(state=JobState.HELD, allocated_nodes=())
            if preempted and changes.get("state", job.state) in (JobState.PENDING, JobState.HELD):
                sleeping[job.id] = tuple(pilot.saved_nodes) if pilot else ()
        if pilot is not None:
            changes["vjob_state"] = _vjob_state(job, pilot, job.id in sleeping)
        jobs.append(replace(job, **changes) if changes else job)
    usage, targets = _shares(agent, store_ok)
    view = ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), usage=usage, targets=targets)
    counts: dict[tuple[str, str], int] = {}
    for job in jobs:
        key = (job.job_class.value, job.state.value)
        counts[key] = counts.get(key, 0) + 1
    agent.metrics.set_queue(counts)
    return Observation(view=view, pilots=pilots, sleeping=sleeping, store_ok=store_ok)


def read_pilots(agent: Agent, dirs: Sequence[PilotDir], users: dict[str, str]) -> dict[str, PilotStatus]:
    """The state files of the pilots the agent may listen to.

    A directory is read only when the RMS knows its job and the directory belongs to that
    job's user (or root): another user cannot speak for a job by creating its directory first.
    A job the RMS no longer knows is read too (its VM must be cleaned up), but what the agent
    then does rests on the store's record of the job's VMs, not on the file.
    """
    out: dict[str, PilotStatus] = {}
    for pdir in dirs:
        try:
            user = users.get(pdir.job_id)
            if user is not None:
                pdir.check_owner(user)
            st = pdir.read_state()
        except VjobError as exc:
            agent.metrics.errors.labels(kind="pilot").inc()
            agent.log.warning("pilot state ignored", jobs=[pdir.job_id], error=str(exc))
            continue
        if st is None:
            continue
        if st.job_id != pdir.job_id or st.vm != pdir.vm:
            agent.log.warning("pilot state names another job or VM: ignored", jobs=[pdir.job_id], vm=st.vm)
            continue
        out[pdir.job_id] = st
    return out


def _track(agent: Agent, store: Store, job: Job) -> None:
    """Record a new job; one the store refuses (an odd id or user name) is logged and left out
    of the store, never allowed to stop the tick for everybody."""
    try:
        store_jobs.track(store, job)
    except InputError as exc:
        agent.metrics.errors.labels(kind="job").inc()
        agent.log.warning("job not recorded", jobs=[job.id[:64]], error=str(exc))


def _remember_vms(agent: Agent, store: Store, rms_jobs: Sequence[Job], pilots: dict[str, PilotStatus]) -> None:
    """Record in the store which VM runs where for each running vjob, as the RMS confirms it.

    The pilot's word for its node is kept only when the RMS allocated that node to the job; the
    VM's name is derived from the job id. Later clean-ups delete only what is recorded here.
    Written once per placement (the agent remembers what it recorded), not every tick: this runs
    for every running vjob of the cluster."""
    recorded = agent.recorded_vms
    for gone in set(recorded) - {j.id for j in rms_jobs}:
        del recorded[gone]
    off = [
        j.id for j in rms_jobs if j.allocated_nodes and j.id in pilots and pilots[j.id].node not in j.allocated_nodes
    ]
    # A VM off its allocation is believed only where root's journal migrated it (agent.remap_step).
    moved_to = {m.vm_name: m.destination for m in journal.migrations(store, agent.rms, off)} if off else {}
    for job in rms_jobs:
        st = pilots.get(job.id)
        if job.state is not JobState.RUNNING or st is None or st.state is not PilotState.RUNNING:
            continue
        if job.allocated_nodes and st.node not in job.allocated_nodes and moved_to.get(st.vm) != st.node:
            agent.log.warning("pilot claims a node the RMS did not allocate", jobs=[job.id], node=st.node)
            continue
        if recorded.get(job.id) == (st.node, st.image):
            continue
        try:
            store_vms.remember(store, agent.rms, job, vm=st.vm, node=st.node, image=st.image, memory_mb=st.memory_mb)
            if st.image:  # the node now carries this OS (UBIS's N_availableOS), docs/realjobs.md
                record_node_image(store, st.node, st.image)
            recorded[job.id] = (st.node, st.image)
        except InputError as exc:
            agent.log.warning("VM not recorded", jobs=[job.id[:64]], error=str(exc))


def _shares(agent: Agent, store_ok: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Decayed usage and targets from the store (empty when it is down: the term is 0)."""
    if not store_ok:
        return {}, dict(agent.cfg.priority.targets)
    try:
        store = agent.store()
        return ubis_usage.load_usage(store, time.time(), agent.cfg.priority), ubis_usage.load_targets(store)
    except StoreError as exc:
        agent.log.warning("usage and targets unavailable this tick", error=str(exc))
        return {}, dict(agent.cfg.priority.targets)


def _records(store: Store, rms: str, job_ids: list[str], chunk: int = 2000) -> dict[str, JobRecord]:
    """The store's rows of these jobs, in a few queries instead of one per job."""
    out: dict[str, JobRecord] = {}
    with store.session() as s:
        for i in range(0, len(job_ids), chunk):
            part = job_ids[i : i + chunk]
            rows = s.scalars(select(JobRecord).where(JobRecord.rms == rms, JobRecord.rms_job_id.in_(part)))
            out.update({r.rms_job_id: r for r in rows})
    return out


def _vjob_state(job: Job, pilot: PilotStatus, sleeping: bool) -> VJobState:
    if sleeping:
        return VJobState.SLEEPING
    if job.state is JobState.RUNNING and pilot.state in (PilotState.RUNNING, PilotState.SAVING):
        return VJobState.RUNNING
    if pilot.state is PilotState.FINISHED:
        return VJobState.TERMINATED
    return VJobState.WAITING


__all__ = ["Observation", "observe", "read_pilots"]
