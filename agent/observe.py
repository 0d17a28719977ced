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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import observe_jobs
from agent.observe_rows import RowsLook, Tracked, note_tracked, records_of, store_records, tracked
from agent.pilot_dirs import pilot_dirs
from agent.pilot_hear import HearMemo, hear
from agent.pilot_snapshots import record_pilot_snapshots
from agent.ports import Ports
from provisioning.images import record_node_image
from ubis_priority import usage as ubis_usage
from vjob.errors import InputError, StoreError
from vjob.model import ClusterView, Job, JobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.vms_many import remember_many


@dataclass
class Observation:
    """What one tick saw: the view the policies get, plus what only the agent needs."""

    view: ClusterView
    pilots: dict[str, PilotStatus]
    sleeping: dict[str, tuple[str, ...]]
    """Jobs vjob checkpointed and still holds → the node(s) their VM was saved on."""
    store_ok: bool


def observe(ports: Ports, *, track: bool = True) -> Observation:
    """One consistent look at the RMS, the pilots and the store; `track` records new jobs.

    What is done for each job is done for the jobs that changed since the last tick
    (agent.observe_jobs); what is done for each pilot, for the pilots (a sixth of the jobs at a
    site): at 120,000 jobs a loop over them all costs a hundredth of a second."""
    now = time.time()
    rms_jobs = ports.adapter.jobs()
    nodes = ports.adapter.nodes()
    kept = observe_jobs.kept_for(ports.rms, str(ports.root))
    listing = observe_jobs.look(kept, rms_jobs)
    by_id = kept.by_id
    dirs = pilot_dirs(Path(ports.root), ports.rms)
    pilots = read_pilots(ports, dirs, pilot_users(ports, dirs, by_id), max_vms=len(nodes) or None)
    store_ok = True
    rows = RowsLook({}, [], set())
    try:
        store = ports.store()
        rows = records_of(
            ports,
            store,
            rms_jobs,
            None if listing.whole else listing.changed,
            listing.gone,
            since=listing.since,
            this=kept.listing,
        )
        if track:
            new = _untracked(rms_jobs, listing, rows)
            refused = _track(ports, store, new)
            note_tracked(ports, [j for j in new if j.id not in refused] if refused else new)
            with_pilot = listing.in_order(by_id[k] for k in pilots if k in by_id)
            _remember_vms(ports, store, with_pilot, pilots, listed=by_id)
            record_pilot_snapshots(ports, store, with_pilot, pilots)  # pilots have no store credentials
        ports.metrics.store_up.set(1)
    except StoreError as exc:
        ports.store.failed(exc)
        store_ok = False
    jobs, sleeping, by_kind = observe_jobs.derive(kept, listing, rows.rows, rows.read, pilots)
    usage, targets = _shares(ports, store_ok)
    view = ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), usage=usage, targets=targets)
    ports.metrics.set_queue({(kind.value, state.value): n for (kind, state), n in by_kind.items()})
    return Observation(view=view, pilots=pilots, sleeping=sleeping, store_ok=store_ok)


def _untracked(rms_jobs: Sequence[Job], listing: observe_jobs.Listing, rows: RowsLook) -> list[Job]:
    """The listed jobs without a store row, in the listing's order."""
    if not rows.missing:
        return []
    changed = [j for j in listing.changed if j.id in rows.missing]
    if len(changed) == len(rows.missing):
        return changed  # the usual case: only new jobs lack a row
    return [j for j in rms_jobs if j.id in rows.missing]


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
    memo = _MEMOS.setdefault(Path(ports.root), HearMemo())
    heard, refused = hear(dirs, users, max_vms=max_vms, memo=memo)
    for job_id, vm, error in refused:
        if vm is None:
            ports.metrics.errors.labels(kind="pilot").inc()
            ports.log.warning("pilot state ignored", jobs=[job_id], error=error)
        else:
            ports.log.warning("pilot state names another job or VM: ignored", jobs=[job_id], vm=vm, error=error)
    ports.pilot_dirs = {job_id: pdir for job_id, (pdir, _) in heard.items()}
    return {job_id: st for job_id, (_, st) in heard.items()}


_MEMOS: dict[Path, HearMemo] = {}
"""What the agent keeps of its pilot directories between ticks, one per pilot root (read_pilots)."""


def pilot_users(ports: Ports, dirs: Sequence[PilotDir], listed: Mapping[str, Job]) -> dict[str, str]:
    """Whose directory to believe for each job with one: the RMS's user (`listed`: the jobs it
    lists by id), else (a job the RMS no longer knows, kept for its clean-up) the user the store
    recorded; with the store down, such a job is heard only from a directory root made, until
    it is back. One pass over the directories (19,000 at a site, every tick)."""
    users = {d.job_id: job.user for d in dirs if (job := listed.get(d.job_id)) is not None}
    unknown = sorted({d.job_id for d in dirs if d.job_id not in users}) if len(users) < len(dirs) else []
    if unknown:
        try:
            users.update({job_id: rec.user for job_id, rec in tracked(ports.store(), ports.rms, unknown).items()})
        except StoreError as exc:
            ports.log.warning(
                "no store: pilots of jobs the RMS forgot are heard from root's directories only", error=str(exc)
            )
    return users


def _track(ports: Ports, store: Store, new: list[Job]) -> set[str]:
    """Record the new jobs; one the store refuses (an odd id or user name) is logged and left
    out of the store, never allowed to stop the tick for everybody. The ids refused."""
    refused = set()
    for job, exc in store_jobs.track_many(store, new):
        ports.metrics.errors.labels(kind="job").inc()
        ports.log.warning("job not recorded", jobs=[job.id[:64]], error=str(exc))
        refused.add(job.id)
    return refused


def _remember_vms(
    ports: Ports,
    store: Store,
    rms_jobs: Sequence[Job],
    pilots: dict[str, PilotStatus],
    *,
    listed: Mapping[str, Any] | None = None,
) -> None:
    """Record in the store which VM runs where for each running vjob, as the RMS confirms it.

    The pilot's word for its nodes is kept only when the RMS allocated them all to the job; the
    VMs' names are derived from the job id (one, or one per node of a multi-node pilot,
    vjob.pilot_files.vms_of). Later clean-ups delete only what is recorded here. Written once
    per placement (the agent remembers what it recorded), not every tick: this runs for every
    running vjob of the cluster; a job whose Job, pilot state and record are the very ones of
    the last tick that found it recorded is not looked at again. `rms_jobs`: the jobs to look
    at (observe gives those with a pilot state); `listed`: every job id the RMS listed (default:
    those of `rms_jobs`), whose records are kept."""
    recorded = ports.recorded_vms
    if listed is None:
        listed = {j.id for j in rms_jobs}
    for gone in [k for k in recorded if k not in listed]:
        del recorded[gone]
    done = _PLACED.setdefault((ports.rms, str(ports.root)), {})
    for gone in [k for k in done if k not in listed]:
        del done[gone]
    todo = []
    for job in rms_jobs:
        st = pilots.get(job.id)
        if job.state is not JobState.RUNNING or st is None or st.state is not PilotState.RUNNING:
            continue
        kept = done.get(job.id)
        if kept is not None and kept[0] is job and kept[1] is st and kept[2] == recorded.get(job.id):
            continue
        todo.append((job, st))
    if not todo:
        return
    placed = {job.id: vms_of(st) for job, st in todo}
    off = [j.id for j, _ in todo if j.allocated_nodes and any(n not in j.allocated_nodes for _, n in placed[j.id])]
    # A VM off its allocation is believed only where root's journal migrated it (agent.remap_step)
    # or root recorded it after moving its vjob whole (no migrate journalled: agent.remap_whole).
    moved_to = {m.vm_name: m.destination for m in journal.migrations(store, ports.rms, off)} if off else {}
    recorded_at = {v.name: v.node for job_id in off for v in store_vms.of_job(store, ports.rms, job_id)}
    ready = []
    for job, st in todo:
        vms = placed[job.id]
        astray = [
            n
            for vm, n in vms
            if job.allocated_nodes and n not in job.allocated_nodes and n not in (moved_to.get(vm), recorded_at.get(vm))
        ]
        if astray:
            ports.log.warning("pilot claims a node the RMS did not allocate", jobs=[job.id], node=astray[0])
            continue
        where = ",".join(node for _vm, node in vms)
        if recorded.get(job.id) != (where, st.image):
            ready.append((job, st, vms, where))
        else:
            done[job.id] = (job, st, recorded[job.id])
    # One transaction for them all (an agent's first tick at a site: 20,000 vjobs), not three a VM.
    placements = [(job, vms, st.image, st.memory_mb) for job, st, vms, _ in ready]
    refused = {id(job): exc for job, exc in remember_many(store, ports.rms, placements)}
    for job, st, vms, where in ready:
        try:
            if id(job) in refused:
                raise refused[id(job)]
            for _vm, node in vms:
                if st.image:  # the node now carries this OS (UBIS's N_availableOS), docs/realjobs.md
                    record_node_image(store, node, st.image)
            recorded[job.id] = (where, st.image)
        except InputError as exc:
            ports.log.warning("VM not recorded", jobs=[job.id[:64]], error=str(exc))
            continue
        done[job.id] = (job, st, recorded[job.id])


_PLACED: dict[tuple[str, str], dict[str, tuple[Job, PilotStatus, tuple[str, str]]]] = {}
"""Per agent (RMS, pilot root): job id → the Job, pilot state and record _remember_vms last
found in agreement."""


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


__all__ = ["Observation", "Tracked", "hear", "observe", "pilot_users", "read_pilots", "store_records", "tracked"]
