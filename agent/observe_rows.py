"""The store rows observe reads of the RMS's jobs, read again only where they may have changed.

Why apart: agent.observe holds the tick's look at the RMS and the pilots; this is its look at
the store, kept between ticks (at a site's size, reading 120,000 rows each tick costs a second).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
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


_ROWS: dict[tuple[str, str], _Rows] = {}
ROWS_FULL_EVERY = 30
"""Ticks between two reads of every listed job's row (records_of)."""
ROWS_STALE_S = 60.0
"""A pause longer than this (a standby, a store outage) and every row is read again."""


def records_of(ports: Ports, store: Store, rms_jobs: Sequence[Job]) -> dict[str, Tracked]:
    """The store rows of the RMS's jobs, read again only where they may have changed.

    Only the agent holding the lease writes a job's row (tracked, preempted, resumed), and each
    of those writes follows a change the RMS shows: a requeue-held victim, a resumed job. So a
    row is read again when its Job is not the very object of the last tick (the adapter keeps
    unchanged jobs' objects: plugins.slurm.incremental; other adapters make new ones every tick,
    and all their rows are read as before), when it is preempted now (its resume may come
    first), when it was not in the store, every ROWS_FULL_EVERY ticks, and after a pause."""
    cache = _ROWS.setdefault((ports.rms, str(ports.root)), _Rows({}, {}))
    now = time.monotonic()
    if cache.ticks % ROWS_FULL_EVERY == 0 or now - cache.read_at > ROWS_STALE_S:
        cache.jobs, cache.rows, cache.watch = {}, {}, set()
    seen, rows, watch = cache.jobs, cache.rows, cache.watch
    changed = [j for j in rms_jobs if seen.get(j.id) is not j]
    stale = [j.id for j in changed]
    stale += list(watch.difference(stale))  # a job gone meanwhile is let go below
    fresh = tracked(store, ports.rms, stale) if stale else {}
    for job_id in stale:
        row = fresh.get(job_id)
        if row is not None:
            rows[job_id] = row
        else:
            rows.pop(job_id, None)
        if row is None or row.preempted_since is not None:
            watch.add(job_id)  # not in the store, or preempted: read again next tick
        else:
            watch.discard(job_id)
    for job in changed:
        seen[job.id] = job
    if len(seen) != len(rms_jobs):
        for gone in seen.keys() - {j.id for j in rms_jobs}:
            del seen[gone]
            rows.pop(gone, None)
            watch.discard(gone)
    cache.read_at, cache.ticks = now, cache.ticks + 1
    return rows


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


__all__ = ["ROWS_FULL_EVERY", "ROWS_STALE_S", "Tracked", "records_of", "store_records", "tracked"]
