"""The store rows observe reads of the RMS's jobs, read again only where they may have changed.

Why apart: agent.observe holds the tick's look at the RMS and the pilots; this is its look at
the store, kept between ticks (at a site's size, reading 120,000 rows each tick costs a second).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import select

from agent.ports import Ports
from vjob.model import Job
from vjob.store.db import Store
from vjob.store.schema import JobRecord


@dataclass
class _Rows:
    """The store rows observe last read, and the Job each was read for (records_of)."""

    jobs: dict[str, Job]
    rows: dict[str, Tracked]
    watch: set[str] = field(default_factory=set)
    """Jobs whose row is read at every tick: preempted, or not in the store."""
    read_at: float = 0.0
    ticks: int = 0
    listing: Sequence[Job] | None = None
    """The RMS's listing of the last look (records_of's `since`)."""


_ROWS: dict[tuple[str, str], _Rows] = {}
ROWS_FULL_EVERY = 30
"""Ticks between two reads of every listed job's row (records_of)."""
ROWS_STALE_S = 60.0
"""A pause longer than this (a standby, a store outage) and every row is read again."""


class RowsLook(NamedTuple):
    """records_of's answer: the rows, the jobs whose row was read in this look, and those
    without a row (to be tracked)."""

    rows: dict[str, Tracked]
    """Job id → its row; the same dict object from look to look until every row is read again."""
    read: list[str]
    missing: set[str]


def records_of(
    ports: Ports,
    store: Store,
    rms_jobs: Sequence[Job],
    changed: Sequence[Job] | None = None,
    gone: Iterable[str] = (),
    since: Sequence[Job] | None = None,
    this: Sequence[Job] | None = None,
) -> RowsLook:
    """The store rows of the RMS's jobs, read again only where they may have changed.

    Only the agent holding the lease writes a job's row (tracked, preempted, resumed), and each
    of those writes follows a change the RMS shows: a requeue-held victim, a resumed job. So a
    row is read again when its Job is not the very object of the last tick (the adapter keeps
    unchanged jobs' objects: plugins.slurm.incremental; other adapters make new ones every tick,
    and all their rows are read as before), when it is preempted now (its resume may come
    first), when it was not in the store, every ROWS_FULL_EVERY ticks, and after a pause.
    `changed` and `gone` (agent.observe_jobs, which compares the listing with the last one
    anyway): the jobs whose object is new since the listing `since` and the ids no longer
    listed; they are used only when `since` is the very listing of this cache's last look
    (`this`: the one to compare the next with, rms_jobs or a copy), else (a tick without the
    store between, a first look) they are found here."""
    cache = _ROWS.setdefault((ports.rms, str(ports.root)), _Rows({}, {}))
    now = time.monotonic()
    if cache.ticks % ROWS_FULL_EVERY == 0 or now - cache.read_at > ROWS_STALE_S:
        cache.jobs, cache.rows, cache.watch = {}, {}, set()
    if since is None or since is not cache.listing or not cache.jobs:
        changed = None  # not from the listing this one last saw: found here
    seen, rows, watch = cache.jobs, cache.rows, cache.watch
    if changed is None:
        changed = [j for j in rms_jobs if seen.get(j.id) is not j]
        if len(seen) + sum(j.id not in seen for j in changed) != len(rms_jobs):  # some went
            gone = seen.keys() - {j.id for j in rms_jobs}
    for job_id in gone:
        seen.pop(job_id, None)
        rows.pop(job_id, None)
        watch.discard(job_id)
    stale = [j.id for j in changed]
    stale += list(watch.difference(stale))
    fresh = tracked(store, ports.rms, stale) if stale else {}
    missing = set()
    for job_id in stale:
        row = fresh.get(job_id)
        if row is not None:
            rows[job_id] = row
        else:
            rows.pop(job_id, None)
            missing.add(job_id)
        if row is None or row.preempted_since is not None:
            watch.add(job_id)  # not in the store, or preempted: read again next tick
        else:
            watch.discard(job_id)
    for job in changed:
        seen[job.id] = job
    cache.read_at, cache.ticks = now, cache.ticks + 1
    cache.listing = this if this is not None else rms_jobs  # only now: a look the store failed is no base
    return RowsLook(rows, stale, missing)


def note_tracked(ports: Ports, jobs: Iterable[Job]) -> None:
    """These jobs' rows were just made by this agent (vjob.store.jobs.track_many, from the Job
    itself): keep what they hold instead of reading them again at the next tick — at an
    agent's first tick that is every listed job, 3 s at a site's size. A row another agent made
    meanwhile holds the same fields of the same RMS job; a later write to it follows a change
    the RMS shows, which reads it again (records_of)."""
    cache = _ROWS.get((ports.rms, str(ports.root)))
    if cache is None:
        return
    for job in jobs:
        cache.rows[job.id] = Tracked(job.id, job.user, job.preempt_count, job.preempted_seconds, job.preempted_since)
        if job.preempted_since is None:
            cache.watch.discard(job.id)


class Tracked(NamedTuple):
    """What the agent reads of a job's store row each tick (not the ORM object: at a site's
    size, 120,000 of those cost seconds a tick to build)."""

    rms_job_id: str
    user: str
    preempt_count: int
    preempted_seconds: float
    preempted_since: float | None


def store_records(store: Store, rms: str, job_ids: list[str], chunk: int = 2000) -> dict[str, JobRecord]:
    """The store's rows of these jobs, in a few queries instead of one per job."""
    out: dict[str, JobRecord] = {}
    with store.session() as s:
        for i in range(0, len(job_ids), chunk):
            part = job_ids[i : i + chunk]
            rows = s.scalars(select(JobRecord).where(JobRecord.rms == rms, JobRecord.rms_job_id.in_(part)))
            out.update({r.rms_job_id: r for r in rows})
    return out


def tracked(store: Store, rms: str, job_ids: list[str], chunk: int = 2000) -> dict[str, Tracked]:
    """What observe reads of these jobs' store rows, in a few queries of five columns."""
    out: dict[str, Tracked] = {}
    columns = (
        JobRecord.rms_job_id,
        JobRecord.user,
        JobRecord.preempt_count,
        JobRecord.preempted_seconds,
        JobRecord.preempted_since,
    )
    with store.session() as s:
        for i in range(0, len(job_ids), chunk):
            part = job_ids[i : i + chunk]
            rows = s.execute(select(*columns).where(JobRecord.rms == rms, JobRecord.rms_job_id.in_(part)))
            out.update({r[0]: Tracked(*r) for r in rows})
    return out


__all__ = [
    "ROWS_FULL_EVERY",
    "ROWS_STALE_S",
    "RowsLook",
    "Tracked",
    "note_tracked",
    "records_of",
    "store_records",
    "tracked",
]
