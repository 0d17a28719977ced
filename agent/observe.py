"""Observe: one consistent look at the RMS, the pilots and the store, as a ClusterView.

Why apart from the loop: this is where what users control (their pilot directories) meets what
root trusts (the RMS and the store). A pilot's state file is read with the checks of
vjob.pilot_files (no symlink, regular file, size limit, typed fields) and only when the
directory belongs to the job's own user; a state file that fails them is logged and ignored —
one user's bad file never stops a tick for everybody.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from agent.pilot_snapshots import record_pilot_snapshots
from agent.ports import Ports
from provisioning.images import record_node_image
from ubis_priority import usage as ubis_usage
from vjob.errors import InputError, StoreError, VjobError
from vjob.model import ClusterView, Job, JobState, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs, claimed_vms, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.schema import JobRecord


@dataclass
class Observation:
    """What one tick saw: the view the policies get, plus what only the agent needs."""

    view: ClusterView
    pilots: dict[str, PilotStatus]
    sleeping: dict[str, tuple[str, ...]]
    """Jobs vjob checkpointed and still holds → the node(s) their VM was saved on."""
    store_ok: bool


def observe(ports: Ports, *, track: bool = True) -> Observation:
    """One consistent look at the RMS, the pilots and the store; `track` records new jobs."""
    now = time.time()
    rms_jobs = ports.adapter.jobs()
    nodes = ports.adapter.nodes()
    users = {j.id: j.user for j in rms_jobs}
    dirs = all_dirs(ports.root, ports.rms)
    pilots = read_pilots(ports, dirs, pilot_users(ports, dirs, users), max_vms=len(nodes) or None)
    jobs: list[Job] = []
    sleeping: dict[str, tuple[str, ...]] = {}
    store_ok = True
    records: dict[str, JobRecord] = {}
    try:
        store = ports.store()
        records = store_records(store, ports.rms, [j.id for j in rms_jobs])
        if track:
            for job in rms_jobs:
                if job.id not in records:
                    _track(ports, store, job)
            _remember_vms(ports, store, rms_jobs, pilots)
            record_pilot_snapshots(ports, store, rms_jobs, pilots)  # pilots have no store credentials
        ports.metrics.store_up.set(1)
    except StoreError as exc:
        ports.store.failed(exc)
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
    usage, targets = _shares(ports, store_ok)
    view = ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), usage=usage, targets=targets)
    counts: dict[tuple[str, str], int] = {}
    for job in jobs:
        key = (job.job_class.value, job.state.value)
        counts[key] = counts.get(key, 0) + 1
    ports.metrics.set_queue(counts)
    return Observation(view=view, pilots=pilots, sleeping=sleeping, store_ok=store_ok)


def read_pilots(
    ports: Ports, dirs: Sequence[PilotDir], users: dict[str, str], *, max_vms: int | None = None
) -> dict[str, PilotStatus]:
    """The state files of the pilots the agent may listen to.

    A state speaks only of its own job's VMs, named from the job id — `vjob-<rms>-<id>`, or
    `vjob-<rms>-<id>-<rank>` for each of a multi-node pilot's `member_nodes`, at most as many as
    `max_vms` (the cluster's nodes) allows, each on its own node (vjob.pilot_files.claimed_vms);
    any other state is logged and ignored. Where a VM's node matters, the RMS's allocation is
    checked too (_remember_vms, agent.act.checkpointable).

    A directory is read only when it belongs to its job's user (or root): `users` holds the
    RMS's user of each job it knows and the store's of the jobs it forgot (pilot_users); a job
    neither names is heard only from a directory root made. Another user cannot speak for a job
    by making its directory first, and a job's pilot that found its plain name squatted made a
    keyed one (PilotDir.ensure): of a job's directories, the first its user (or root) owns is
    the one heard, and `ports.pilot_dirs` remembers it for the agent's requests.
    """
    heard, refused = hear(dirs, users, max_vms=max_vms)
    for job_id, vm, error in refused:
        if vm is None:
            ports.metrics.errors.labels(kind="pilot").inc()
            ports.log.warning("pilot state ignored", jobs=[job_id], error=error)
        else:
            ports.log.warning("pilot state names another job or VM: ignored", jobs=[job_id], vm=vm, error=error)
    ports.pilot_dirs = {job_id: pdir for job_id, (pdir, _) in heard.items()}
    return {job_id: st for job_id, (_, st) in heard.items()}


def hear(
    dirs: Sequence[PilotDir], users: Mapping[str, str], *, max_vms: int | None = None
) -> tuple[dict[str, tuple[PilotDir, PilotStatus]], list[tuple[str, str | None, str]]]:
    """The owner rule, in one place for the agent (read_pilots) and `vjob status`
    (agent.status_cmd): job id → (its directory, its state) of each job heard, and (job id, VM
    the state named or None, why) of each directory refused.

    Of a job's directories (vjob.pilot_files.all_dirs: its plain name first), the first that is
    owned by `users[job]` or root, holds a state file that passes the checks, and speaks only
    of that job's VMs is heard; every other one is nobody's word. Why one function: a squatter's
    forged row must be as invisible to the operator's view as to the agent's decisions."""
    heard: dict[str, tuple[PilotDir, PilotStatus]] = {}
    refused: list[tuple[str, str | None, str]] = []
    for pdir in dirs:
        if pdir.job_id in heard:
            continue  # its own directory was read already; the others are nobody's word
        try:
            owner = pdir.check_owner(users.get(pdir.job_id))
            pdir.owners = (0,) if not owner else (owner, 0)  # its later requests and withdrawals: the same rule
            st = pdir.read_state()
        except VjobError as exc:
            refused.append((pdir.job_id, None, str(exc)))
            continue
        if st is None:
            continue
        try:
            claimed_vms(pdir.rms, pdir.job_id, st, max_vms=max_vms)
        except InputError as exc:
            refused.append((pdir.job_id, st.vm, str(exc)))
            continue
        heard[pdir.job_id] = (pdir, st)
    return heard, refused


def pilot_users(ports: Ports, dirs: Sequence[PilotDir], rms_users: dict[str, str]) -> dict[str, str]:
    """Whose directory to believe for each job with one: the RMS's user, else (a job the RMS no
    longer knows, kept for its clean-up) the user the store recorded; with the store down, such
    a job is heard only from a directory root made, until it is back."""
    users = dict(rms_users)
    unknown = sorted({d.job_id for d in dirs} - set(users))
    if unknown:
        try:
            users.update({job_id: rec.user for job_id, rec in store_records(ports.store(), ports.rms, unknown).items()})
        except StoreError as exc:
            ports.log.warning(
                "no store: pilots of jobs the RMS forgot are heard from root's directories only", error=str(exc)
            )
    return users


def _track(ports: Ports, store: Store, job: Job) -> None:
    """Record a new job; one the store refuses (an odd id or user name) is logged and left out
    of the store, never allowed to stop the tick for everybody."""
    try:
        store_jobs.track(store, job)
    except InputError as exc:
        ports.metrics.errors.labels(kind="job").inc()
        ports.log.warning("job not recorded", jobs=[job.id[:64]], error=str(exc))


def _remember_vms(ports: Ports, store: Store, rms_jobs: Sequence[Job], pilots: dict[str, PilotStatus]) -> None:
    """Record in the store which VM runs where for each running vjob, as the RMS confirms it.

    The pilot's word for its nodes is kept only when the RMS allocated them all to the job; the
    VMs' names are derived from the job id (one, or one per node of a multi-node pilot,
    vjob.pilot_files.vms_of). Later clean-ups delete only what is recorded here. Written once
    per placement (the agent remembers what it recorded), not every tick: this runs for every
    running vjob of the cluster."""
    recorded = ports.recorded_vms
    for gone in set(recorded) - {j.id for j in rms_jobs}:
        del recorded[gone]
    placed = {j.id: vms_of(pilots[j.id]) for j in rms_jobs if j.id in pilots}
    off = [
        j.id for j in rms_jobs if j.allocated_nodes and any(n not in j.allocated_nodes for _, n in placed.get(j.id, ()))
    ]
    # A VM off its allocation is believed only where root's journal migrated it (agent.remap_step).
    moved_to = {m.vm_name: m.destination for m in journal.migrations(store, ports.rms, off)} if off else {}
    for job in rms_jobs:
        st = pilots.get(job.id)
        if job.state is not JobState.RUNNING or st is None or st.state is not PilotState.RUNNING:
            continue
        vms = placed[job.id]
        astray = [n for vm, n in vms if job.allocated_nodes and n not in job.allocated_nodes and moved_to.get(vm) != n]
        if astray:
            ports.log.warning("pilot claims a node the RMS did not allocate", jobs=[job.id], node=astray[0])
            continue
        where = ",".join(node for _vm, node in vms)
        if recorded.get(job.id) == (where, st.image):
            continue
        try:
            for vm, node in vms:
                store_vms.remember(store, ports.rms, job, vm=vm, node=node, image=st.image, memory_mb=st.memory_mb)
                if st.image:  # the node now carries this OS (UBIS's N_availableOS), docs/realjobs.md
                    record_node_image(store, node, st.image)
            recorded[job.id] = (where, st.image)
        except InputError as exc:
            ports.log.warning("VM not recorded", jobs=[job.id[:64]], error=str(exc))


def _shares(ports: Ports, store_ok: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Decayed usage and targets from the store (empty when it is down: the term is 0)."""
    if not store_ok:
        return {}, dict(ports.cfg.priority.targets)
    try:
        store = ports.store()
        return ubis_usage.load_usage(store, time.time(), ports.cfg.priority), ubis_usage.load_targets(store)
    except StoreError as exc:
        ports.log.warning("usage and targets unavailable this tick", error=str(exc))
        return {}, dict(ports.cfg.priority.targets)


def store_records(store: Store, rms: str, job_ids: list[str], chunk: int = 2000) -> dict[str, JobRecord]:
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


__all__ = ["Observation", "hear", "observe", "pilot_users", "read_pilots"]
