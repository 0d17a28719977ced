"""Observe: one consistent look at the RMS, the pilots and the store, as a ClusterView.

Why apart from the loop: this is where what users control (their pilot directories) meets what
root trusts (the RMS and the store). A pilot's state file is read with the checks of
vjob.pilot_files (no symlink, regular file, size limit, typed fields) and only when the
directory belongs to the job's own user; a state file that fails them is logged and ignored —
one user's bad file never stops a tick for everybody.
"""

from __future__ import annotations

import os
import pwd
import stat
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from agent.observe_rows import Tracked, records_of, store_records, tracked
from agent.pilot_dirs import pilot_dirs
from agent.pilot_snapshots import record_pilot_snapshots
from agent.ports import Ports
from provisioning.images import record_node_image
from ubis_priority import usage as ubis_usage
from vjob.errors import InputError, StoreError, VjobError
from vjob.model import ClusterView, Job, JobState, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, claimed_vms, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store


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
    dirs = pilot_dirs(Path(ports.root), ports.rms)
    pilots = read_pilots(ports, dirs, pilot_users(ports, dirs, users), max_vms=len(nodes) or None)
    jobs: list[Job] = []
    sleeping: dict[str, tuple[str, ...]] = {}
    store_ok = True
    records: dict[str, Tracked] = {}
    try:
        store = ports.store()
        records = records_of(ports, store, rms_jobs)
        if track:
            _track(ports, store, [job for job in rms_jobs if job.id not in records])
            _remember_vms(ports, store, rms_jobs, pilots)
            record_pilot_snapshots(ports, store, rms_jobs, pilots)  # pilots have no store credentials
        ports.metrics.store_up.set(1)
    except StoreError as exc:
        ports.store.failed(exc)
        store_ok = False
    derived = _DERIVED.setdefault((ports.rms, str(ports.root)), {})
    for gone in derived.keys() - users.keys():
        del derived[gone]
    for job in rms_jobs:
        rec = records.get(job.id)
        pilot = pilots.get(job.id)
        kept = derived.get(job.id)
        if kept is not None and kept[0] is job and kept[1] == rec and kept[2] is pilot:
            if kept[4] is not None:  # the same job, row and pilot state as last tick: the same result
                sleeping[job.id] = kept[4]
            jobs.append(kept[3])
            continue
        changes: dict[str, Any] = {}
        if rec is not None and (rec.preempt_count, rec.preempted_seconds, rec.preempted_since) != (
            job.preempt_count,
            job.preempted_seconds,
            job.preempted_since,
        ):
            changes.update(
                preempt_count=rec.preempt_count,
                preempted_seconds=rec.preempted_seconds,
                preempted_since=rec.preempted_since,
            )
        if rec is not None:
            preempted = rec.preempted_since is not None
            if preempted and job.state is JobState.RUNNING and pilot and pilot.state is PilotState.SAVED:
                # Requeue-held, its VM saved, but the RMS still winds it up (COMPLETING):
                # its nodes are as good as free, it must not be chosen as a victim again.
                changes.update(state=JobState.HELD, allocated_nodes=())
            if preempted and changes.get("state", job.state) in (JobState.PENDING, JobState.HELD):
                sleeping[job.id] = tuple(pilot.saved_nodes) if pilot else ()
        if pilot is not None:
            changes["vjob_state"] = _vjob_state(job, pilot, job.id in sleeping)
        out = replace(job, **changes) if changes else job
        derived[job.id] = (job, rec, pilot, out, sleeping.get(job.id))
        jobs.append(out)
    usage, targets = _shares(ports, store_ok)
    view = ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), usage=usage, targets=targets)
    by_kind = Counter(zip(map(attrgetter("job_class"), jobs), map(attrgetter("state"), jobs), strict=True))
    ports.metrics.set_queue({(kind.value, state.value): n for (kind, state), n in by_kind.items()})
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
    root = Path(ports.root)
    heard, refused = hear(
        dirs,
        users,
        max_vms=max_vms,
        cache=_STATE_CACHES.setdefault(root, {}),
        owners=_OWNER_CACHES.setdefault(root, {}),
    )
    for job_id, vm, error in refused:
        if vm is None:
            ports.metrics.errors.labels(kind="pilot").inc()
            ports.log.warning("pilot state ignored", jobs=[job_id], error=error)
        else:
            ports.log.warning("pilot state names another job or VM: ignored", jobs=[job_id], vm=vm, error=error)
    ports.pilot_dirs = {job_id: pdir for job_id, (pdir, _) in heard.items()}
    return {job_id: st for job_id, (_, st) in heard.items()}


StateCache = dict[Path, tuple[tuple[int, ...], PilotStatus | None]]
"""A state file's path → the signature of the file read and what it held (hear's `cache`)."""
_STATE_CACHES: dict[Path, StateCache] = {}
"""The agent's state caches, one per pilot root (read_pilots)."""


def _signature(path: Path) -> tuple[int, ...] | None:
    """What changes whenever a regular file's content may have: inode, size, modification and
    change times (a user can set the modification time back, never the change time); None for
    anything but a regular file (read_state then says why it refuses it) or no file."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


_STATE_FILES: dict[Path, Path] = {}
"""A pilot directory → its state file's path (made once: pathlib costs microseconds a path)."""
_CLAIMED: dict[Path, tuple[PilotStatus, int | None]] = {}
"""A state file → the state read from it and the node count it was checked against
(claimed_vms): the same state object is not checked again."""
_DERIVED: dict[tuple[str, str], dict[str, tuple[Job, Any, Any, Job, tuple[str, ...] | None]]] = {}
"""observe's result for each job: the RMS's Job, its store row and pilot state, the Job made of
them and where it sleeps; the same three give the same two (not made again each tick)."""


OwnerCache = dict[Path, tuple[tuple[int, ...], str | None, int | None, float]]
"""A pilot directory → its lstat signature, the user asked for, the owner found, when (hear's `owners`)."""
_OWNER_CACHES: dict[Path, OwnerCache] = {}
OWNER_CACHE_S = 60.0
"""How long a directory's owner check is taken as it was while the directory is unchanged: the
check looks the user up (pwd), a file scan or a directory service query per vjob per tick."""


def _check_owner(
    pdir: PilotDir, user: str | None, cache: OwnerCache | None, uids: dict[str, int | None] | None = None
) -> int | None:
    """pdir.check_owner(user), not asked again while the directory itself (device, inode, owner,
    mode) and its user are unchanged, for up to OWNER_CACHE_S: a link or another owner put in its
    place changes the signature and is checked at once. `uids`: the users' uids looked up in this
    tick (a site's 19,000 directories all come due in the same tick: one look-up per user)."""
    if cache is None:
        return pdir.check_owner(user)
    try:
        info: os.stat_result | None = os.lstat(pdir.path)
    except FileNotFoundError:
        info = None
    except OSError:
        return pdir.check_owner(user)  # says what is wrong
    sig = (info.st_dev, info.st_ino, info.st_uid, info.st_mode) if info is not None else None
    now = time.monotonic()
    kept = cache.get(pdir.path)
    if sig is not None and kept is not None and kept[0] == sig and kept[1] == user and now - kept[3] < OWNER_CACHE_S:
        return kept[2]
    owner = _owner(pdir, info, user, uids if uids is not None else {})
    if sig is not None:
        cache[pdir.path] = (sig, user, owner, now)
    return owner


def _owner(pdir: PilotDir, info: os.stat_result | None, user: str | None, uids: dict[str, int | None]) -> int | None:
    """PilotDir.check_owner's rule, on the directory's lstat taken already: no directory (None),
    a link or anything but a directory refused, an owner other than root or `user` refused."""
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise InputError(f"{pdir.path}: not a plain directory")
    if user and user not in uids:
        try:
            uids[user] = pwd.getpwnam(user).pw_uid
        except KeyError:
            uids[user] = None
    uid = uids.get(user) if user else None
    if info.st_uid not in (0, uid):
        raise InputError(f"{pdir.path}: owned by uid {info.st_uid}, not by the job's user {user!r}")
    return info.st_uid


def _read_state(
    pdir: PilotDir, cache: StateCache | None, seen: set[Path], path: Path, sig: tuple[int, ...] | None
) -> PilotStatus | None:
    """The directory's state (its owner checked already), read again only when its file changed
    (`sig`: its signature, taken before the owner check)."""
    if cache is None:
        return pdir.read_state()
    seen.add(path)
    kept = cache.get(path)
    if sig is not None and kept is not None and kept[0] == sig:
        return kept[1]
    st = pdir.read_state()
    if sig is not None and _signature(path) == sig:  # not changed while it was read
        cache[path] = (sig, st)
    return st


def hear(
    dirs: Sequence[PilotDir],
    users: Mapping[str, str],
    *,
    max_vms: int | None = None,
    cache: StateCache | None = None,
    owners: OwnerCache | None = None,
) -> tuple[dict[str, tuple[PilotDir, PilotStatus]], list[tuple[str, str | None, str]]]:
    """The owner rule, in one place for the agent (read_pilots) and `vjob status`
    (agent.status_cmd): job id → (its directory, its state) of each job heard, and (job id, VM
    the state named or None, why) of each directory refused.

    Of a job's directories (vjob.pilot_files.all_dirs: its plain name first), the first that is
    owned by `users[job]` or root, holds a state file that passes the checks, and speaks only
    of that job's VMs is heard; every other one is nobody's word. Why one function: a squatter's
    forged row must be as invisible to the operator's view as to the agent's decisions.

    `cache` and `owners` (the agent's, kept between ticks): a state file whose signature
    (_signature) has not changed since it was read is not read again, and a directory's owner
    check is not repeated while the directory is the same one (_check_owner) — tens of thousands
    of running vjobs each tick otherwise."""
    heard: dict[str, tuple[PilotDir, PilotStatus]] = {}
    refused: list[tuple[str, str | None, str]] = []
    seen: set[Path] = set()
    uids: dict[str, int | None] = {}
    for pdir in dirs:
        if pdir.job_id in heard:
            continue  # its own directory was read already; the others are nobody's word
        state_file = _STATE_FILES.get(pdir.path) or _STATE_FILES.setdefault(pdir.path, pdir.state_file)
        sig = _signature(state_file) if cache is not None else None
        if sig is None and not os.path.lexists(state_file):
            continue  # no state file (yet): not a pilot's word (vjob.pilot_files.all_dirs)
        try:
            owner = _check_owner(pdir, users.get(pdir.job_id), owners, uids)
            pdir.owners = (0,) if not owner else (owner, 0)  # its later requests and withdrawals: the same rule
            st = _read_state(pdir, cache, seen, state_file, sig)
        except VjobError as exc:
            refused.append((pdir.job_id, None, str(exc)))
            continue
        if st is None:
            continue
        try:
            checked = _CLAIMED.get(state_file) if cache is not None else None
            if checked is None or checked[0] is not st or checked[1] != max_vms:
                claimed_vms(pdir.rms, pdir.job_id, st, max_vms=max_vms)
                if cache is not None:
                    _CLAIMED[state_file] = (st, max_vms)
        except InputError as exc:
            refused.append((pdir.job_id, st.vm, str(exc)))
            continue
        heard[pdir.job_id] = (pdir, st)
    if cache is not None:
        for gone in cache.keys() - seen:
            del cache[gone]
            _CLAIMED.pop(gone, None)
    if owners is not None:
        for gone in set(owners) - {d.path for d in dirs}:
            del owners[gone]
    if len(_STATE_FILES) > 2 * len(dirs) + 1000:
        _STATE_FILES.clear()
    return heard, refused


def pilot_users(ports: Ports, dirs: Sequence[PilotDir], rms_users: dict[str, str]) -> dict[str, str]:
    """Whose directory to believe for each job with one: the RMS's user, else (a job the RMS no
    longer knows, kept for its clean-up) the user the store recorded; with the store down, such
    a job is heard only from a directory root made, until it is back."""
    users = dict(rms_users)
    unknown = sorted({d.job_id for d in dirs} - set(users))
    if unknown:
        try:
            users.update({job_id: rec.user for job_id, rec in tracked(ports.store(), ports.rms, unknown).items()})
        except StoreError as exc:
            ports.log.warning(
                "no store: pilots of jobs the RMS forgot are heard from root's directories only", error=str(exc)
            )
    return users


def _track(ports: Ports, store: Store, new: list[Job]) -> None:
    """Record the new jobs; one the store refuses (an odd id or user name) is logged and left
    out of the store, never allowed to stop the tick for everybody."""
    for job, exc in store_jobs.track_many(store, new):
        ports.metrics.errors.labels(kind="job").inc()
        ports.log.warning("job not recorded", jobs=[job.id[:64]], error=str(exc))


def _remember_vms(ports: Ports, store: Store, rms_jobs: Sequence[Job], pilots: dict[str, PilotStatus]) -> None:
    """Record in the store which VM runs where for each running vjob, as the RMS confirms it.

    The pilot's word for its nodes is kept only when the RMS allocated them all to the job; the
    VMs' names are derived from the job id (one, or one per node of a multi-node pilot,
    vjob.pilot_files.vms_of). Later clean-ups delete only what is recorded here. Written once
    per placement (the agent remembers what it recorded), not every tick: this runs for every
    running vjob of the cluster; a job whose Job, pilot state and record are the very ones of
    the last tick that found it recorded is not looked at again."""
    recorded = ports.recorded_vms
    listed = {j.id for j in rms_jobs}
    for gone in recorded.keys() - listed:
        del recorded[gone]
    done = _PLACED.setdefault((ports.rms, str(ports.root)), {})
    for gone in done.keys() - listed:
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
            try:
                for vm, node in vms:
                    store_vms.remember(store, ports.rms, job, vm=vm, node=node, image=st.image, memory_mb=st.memory_mb)
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


def _vjob_state(job: Job, pilot: PilotStatus, sleeping: bool) -> VJobState:
    if sleeping:
        return VJobState.SLEEPING
    if job.state is JobState.RUNNING and pilot.state in (PilotState.RUNNING, PilotState.SAVING):
        return VJobState.RUNNING
    if pilot.state is PilotState.FINISHED:
        return VJobState.TERMINATED
    return VJobState.WAITING


__all__ = ["Observation", "Tracked", "hear", "observe", "pilot_users", "read_pilots", "store_records", "tracked"]
