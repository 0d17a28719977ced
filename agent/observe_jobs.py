"""observe's work for each of the RMS's jobs, done for the jobs that changed since the last tick.

Why apart and why so: at a site's size the RMS lists 120,000 jobs and observe made each one's
Job again from its store row and pilot state at every tick (and looked each up in four dicts),
about a tenth of a second of a steady tick that must stay under one. The adapter gives back the
very same Job object for a job that did not change (plugins.slurm.incremental), the store rows
are read again only where they may have changed (agent.observe_rows) and the pilot states only
where their file did (agent.observe.hear): so which jobs are new objects since the last listing
is found in C loops over object identities (a dict of id() and two set differences: 25 ms at
120,000 jobs, against 100 for the loops it replaces), and only those, the ones whose row was
read again and those whose pilot state is another object are made again.
Everything else is the last tick's result. A listing the cache cannot follow (a job id twice)
is made whole, as is every tick whose store rows are a new dict (read again in full) or whose
store is down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import is_not
from typing import Any

from vjob.model import Job, JobState, VJobState
from vjob.pilot_files import PilotState, PilotStatus

Derived = tuple[Job, Any, Any, Job, "tuple[str, ...] | None"]
"""A job's RMS Job, store row and pilot state, the Job made of them and where it sleeps."""


@dataclass
class Kept:
    """One agent's (RMS, pilot root) jobs as of its last tick."""

    listing: list[Job] = field(default_factory=list)
    """The adapter's last listing: held, so that no id() of it is reused while compared."""
    at: dict[int, int] = field(default_factory=dict)
    """id() of each Job of `listing` → its place there."""
    by_id: dict[str, Job] = field(default_factory=dict)
    derived: dict[str, Derived] = field(default_factory=dict)
    made: dict[int, Job] = field(default_factory=dict)
    """id() of an RMS Job → the Job observe made of it, where that is another object."""
    sleeping: dict[str, tuple[str, ...]] = field(default_factory=dict)
    counts: Counter[tuple[Any, Any]] = field(default_factory=Counter)
    """(job class, state) → jobs, of the Jobs made."""
    rows: dict[str, Any] | None = None
    pilots: dict[str, PilotStatus] = field(default_factory=dict)
    whole: bool = True
    """The last listing was made whole: so is the next one (nothing kept to follow)."""


@dataclass
class Listing:
    """What changed in the RMS's listing since the last tick (look)."""

    jobs: Sequence[Job]
    at: dict[int, int]
    """id() of each of `jobs` → its place in it."""
    changed: list[Job]
    """Jobs whose object is new since the last listing (new jobs, changed ones), in order."""
    gone: list[str]
    """Ids listed last time and not now."""
    since: list[Job]
    """The listing this one was compared with."""
    whole: bool
    """The cache cannot follow this listing: everything is made again (derive)."""

    def in_order(self, jobs: Iterable[Job]) -> list[Job]:
        """These listed Jobs (the very objects) in the listing's order."""
        at, listed = self.at, self.jobs
        return [listed[i] for i in sorted(at[id(j)] for j in jobs)]


_KEPT: dict[tuple[str, str], Kept] = {}


def kept_for(rms: str, root: str) -> Kept:
    return _KEPT.setdefault((rms, root), Kept())


def look(kept: Kept, jobs: Sequence[Job]) -> Listing:
    """Compare the adapter's listing with the last one, and keep it (by_id updated). Each
    pass over the listing is one C loop (map, dict, set difference): 120,000 jobs a tick."""
    at = dict(zip(map(id, jobs), range(len(jobs)), strict=True))
    last = kept.at
    new = at.keys() - last.keys()
    went = last.keys() - at.keys()
    changed = [jobs[i] for i in sorted(map(at.__getitem__, new))]
    old = kept.listing
    by_id = kept.by_id
    for job in changed:
        by_id[job.id] = job
    gone = []
    for o in went:
        kept.made.pop(o, None)  # before these objects may go, and their id() be another's
        job_id = old[last[o]].id
        now = by_id.get(job_id)
        if now is not None and id(now) in went:
            gone.append(job_id)
            del by_id[job_id]
    whole = len(by_id) != len(jobs) or len(at) != len(jobs)
    if whole:  # a job id twice, or the same object twice: not followed, made whole
        kept.by_id = {j.id: j for j in jobs}
    whole, kept.whole = whole or kept.whole, whole
    kept.listing, kept.at = list(jobs), at
    return Listing(jobs, at, changed, gone, old, whole)


def one(job: Job, rec: Any, pilot: PilotStatus | None) -> tuple[Job, tuple[str, ...] | None]:
    """The Job observe gives of one RMS Job (its row's preemption history, a requeue-held job
    whose VM is saved shown held, its vjob state from the pilot) and where it sleeps (None:
    it does not)."""
    changes: dict[str, Any] = {}
    sleeping: tuple[str, ...] | None = None
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
            sleeping = tuple(pilot.saved_nodes) if pilot else ()
    if pilot is not None:
        changes["vjob_state"] = _vjob_state(job, pilot, sleeping is not None)
    return (replace(job, **changes) if changes else job), sleeping


def derive(
    kept: Kept,
    listing: Listing,
    rows: dict[str, Any],
    read: Sequence[str],
    pilots: dict[str, PilotStatus],
) -> tuple[list[Job], dict[str, tuple[str, ...]], dict[tuple[Any, Any], int]]:
    """The Jobs observe gives, in the listing's order, where each sleeps, and how many of each
    (class, state): made again for the changed jobs, those of `read` (their row read again in
    this tick) and those whose pilot state is another object; the rest as the last tick."""
    if listing.whole or rows is not kept.rows or kept.rows is None:
        return _whole(kept, listing, rows, pilots)
    last = kept.pilots
    touched = {j.id for j in listing.changed}
    touched.update(read)
    touched.update(compress(pilots, map(is_not, map(last.get, pilots), pilots.values())))  # another state object
    touched.update(last.keys() - pilots.keys())
    for job_id in listing.gone:
        _drop(kept, job_id)
    for job_id in touched:
        job = kept.by_id.get(job_id)
        if job is not None:
            _put(kept, job, rows.get(job_id), pilots.get(job_id))
    kept.pilots = pilots
    return _result(kept, listing)


def _whole(
    kept: Kept, listing: Listing, rows: dict[str, Any], pilots: dict[str, PilotStatus]
) -> tuple[list[Job], dict[str, tuple[str, ...]], dict[tuple[Any, Any], int]]:
    """derive, every job looked at in the listing's order (a job whose RMS Job, row and pilot
    state are the last tick's still keeps its result), as observe always made it."""
    old = kept.derived
    kept.derived, kept.made, kept.sleeping, kept.counts = {}, {}, {}, Counter()
    jobs: list[Job] = []
    sleeping: dict[str, tuple[str, ...]] = {}
    for job in listing.jobs:
        rec, pilot, was = rows.get(job.id), pilots.get(job.id), old.get(job.id)
        if was is None or was[0] is not job or was[2] is not pilot or not (was[1] is rec or was[1] == rec):
            was = (job, rec, pilot, *one(job, rec, pilot))
        _keep(kept, was)
        jobs.append(was[3])
        if was[4] is not None:
            sleeping[job.id] = was[4]
    kept.rows, kept.pilots = rows, pilots
    return jobs, sleeping, {k: n for k, n in kept.counts.items() if n}


def _put(kept: Kept, job: Job, rec: Any, pilot: PilotStatus | None) -> None:
    was = kept.derived.get(job.id)
    if was is not None and was[0] is job and was[2] is pilot and (was[1] is rec or was[1] == rec):
        return
    _drop(kept, job.id)
    out, sleeping = one(job, rec, pilot)
    _keep(kept, (job, rec, pilot, out, sleeping))


def _keep(kept: Kept, entry: Derived) -> None:
    job, _, _, out, sleeping = entry
    kept.derived[job.id] = entry
    if out is not job:
        kept.made[id(job)] = out
    if sleeping is not None:
        kept.sleeping[job.id] = sleeping
    kept.counts[(out.job_class, out.state)] += 1


def _drop(kept: Kept, job_id: str) -> None:
    was = kept.derived.pop(job_id, None)
    if was is None:
        return
    kept.made.pop(id(was[0]), None)
    kept.sleeping.pop(job_id, None)
    kept.counts[(was[3].job_class, was[3].state)] -= 1


def _result(kept: Kept, listing: Listing) -> tuple[list[Job], dict[str, tuple[str, ...]], dict[tuple[Any, Any], int]]:
    jobs = list(listing.jobs)
    at = listing.at
    for o, out in kept.made.items():
        jobs[at[o]] = out
    sleeping: dict[str, tuple[str, ...]] = {}
    if kept.sleeping:  # in the listing's order, as observe always gave it
        asleep, by_id = kept.sleeping, kept.by_id
        for job in listing.in_order(by_id[k] for k in asleep):
            sleeping[job.id] = asleep[job.id]
    return jobs, sleeping, {k: n for k, n in kept.counts.items() if n}


def _vjob_state(job: Job, pilot: PilotStatus, sleeping: bool) -> VJobState:
    if sleeping:
        return VJobState.SLEEPING
    if job.state is JobState.RUNNING and pilot.state in (PilotState.RUNNING, PilotState.SAVING):
        return VJobState.RUNNING
    if pilot.state is PilotState.FINISHED:
        return VJobState.TERMINATED
    return VJobState.WAITING


__all__ = ["Kept", "Listing", "derive", "kept_for", "look", "one"]
