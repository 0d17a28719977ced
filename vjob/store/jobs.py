"""Tracked jobs and their preemption history (UBIS's Pn and Pt).

Why single UPDATE statements with arithmetic in SQL: several agents, pilots or site masters
may record a preemption of the same job at once; `SET n = n + 1` is atomic in SQLite and
PostgreSQL alike, whereas read-then-write in Python loses updates.
"""

from __future__ import annotations

import re

from sqlalchemy import case, select, update
from sqlalchemy.exc import IntegrityError

from vjob.errors import InputError, VjobError
from vjob.model import Job
from vjob.store.db import Store, now
from vjob.store.schema import JobRecord

# What the RMS may call a job, its user and account (Slurm 123_4 / 123+1, PBS 12[3].server,
# OAR 42, Saline be0123abcd): a closed ASCII set capped at the column width. `fullmatch`, so a
# trailing newline (a forged second log line or status row) is refused.
RMS = re.compile(r"[a-z][a-z0-9_]{0,15}")
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\[\]@:-]{0,63}")
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@$-]{0,63}")
SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check(field: str, value: object, pattern: re.Pattern[str]) -> str:
    """`value` if it is a string matching `pattern` in full, else an InputError naming `field`."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise InputError(f"{field} = {shown}: must match {pattern.pattern}")
    return value


def _check_key(rms: str, rms_job_id: str) -> None:
    check("job.rms", rms, RMS)
    check("job.id", rms_job_id, JOB_ID)


def _checked(job: Job, site: str) -> None:
    """The job's id, RMS, user, account and the site: printed and logged from the store."""
    _check_key(job.rms, job.id)
    check("job.user", job.user, USER)
    if job.account:
        check("job.account", job.account, USER)
    check("site", site, SITE)


def _row(job: Job, site: str, t: float) -> JobRecord:
    return JobRecord(
        rms=job.rms,
        rms_job_id=job.id,
        site=site,
        user=job.user,
        account=job.account,
        job_class=job.job_class.value,
        os_image=job.os_image,
        nodes=job.nodes,
        cores=job.cores,
        memory_mb=job.memory_mb,
        vjob_state=job.vjob_state.value,
        preempt_count=job.preempt_count,
        preempted_seconds=job.preempted_seconds,
        preempted_since=job.preempted_since,
        submit_at=job.submit_time,
        created_at=t,
        updated_at=t,
    )


def track(store: Store, job: Job, *, site: str = "default") -> int:
    """Record `job` if it is new (idempotent); returns its row id. The job's id, RMS, user,
    account and the site are validated first: they are printed and logged from the store."""
    _checked(job, site)
    with store.session() as s:
        row = s.scalar(select(JobRecord).where(JobRecord.rms == job.rms, JobRecord.rms_job_id == job.id))
        if row is not None:
            return row.id
    try:
        with store.session() as s:
            row = _row(job, site, now())
            s.add(row)
            s.flush()
            return row.id
    except IntegrityError:
        # Another process tracked it between our look and our insert: theirs is as good.
        with store.session() as s:
            found = s.scalar(select(JobRecord.id).where(JobRecord.rms == job.rms, JobRecord.rms_job_id == job.id))
            assert found is not None
            return found


TRACK_BATCH = 1000
"""Jobs recorded per transaction by `track_many` (and ids per IN list: under SQLite's limit)."""


def track_many(store: Store, jobs: list[Job], *, site: str = "default") -> list[tuple[Job, InputError]]:
    """Record the new jobs among `jobs`, a batch of TRACK_BATCH per transaction; returns the
    jobs refused with why (an odd id or user name: left out, the others recorded).

    Why: an agent starting at a site records every queued job at its first tick; one
    transaction per job (`track`) took 167 s of that tick for 120,000 jobs. A batch that
    another process recorded in part meanwhile (an IntegrityError) is recorded job by job."""
    refused: list[tuple[Job, InputError]] = []
    valid: list[Job] = []
    for job in jobs:
        try:
            _checked(job, site)
        except InputError as exc:
            refused.append((job, exc))
        else:
            valid.append(job)
    for k in range(0, len(valid), TRACK_BATCH):
        batch = valid[k : k + TRACK_BATCH]
        try:
            with store.session() as s:
                for rms in {j.rms for j in batch}:
                    ids = [j.id for j in batch if j.rms == rms]
                    known = set(
                        s.scalars(
                            select(JobRecord.rms_job_id).where(JobRecord.rms == rms, JobRecord.rms_job_id.in_(ids))
                        )
                    )
                    t = now()
                    seen: set[str] = set()
                    for job in batch:
                        if job.rms == rms and job.id not in known and job.id not in seen:
                            seen.add(job.id)
                            s.add(_row(job, site, t))
                s.flush()
        except IntegrityError:
            for job in batch:
                track(store, job, site=site)
    return refused


def _where(rms: str, rms_job_id: str):  # noqa: ANN202 - a SQLAlchemy clause
    return (JobRecord.rms == rms) & (JobRecord.rms_job_id == rms_job_id)


def record_preemption(store: Store, rms: str, rms_job_id: str, *, at: float | None = None) -> None:
    """Pn += 1 and start the preempted-time clock, atomically; a second call while the job is
    still preempted does not count twice (idempotent after a crash)."""
    _check_key(rms, rms_job_id)
    t = now() if at is None else at
    with store.session() as s:
        res = s.execute(
            update(JobRecord)
            .where(_where(rms, rms_job_id), JobRecord.preempted_since.is_(None))
            .values(preempt_count=JobRecord.preempt_count + 1, preempted_since=t, vjob_state="sleeping", updated_at=t)
        )
        if res.rowcount == 0:
            exists = s.scalar(select(JobRecord.id).where(_where(rms, rms_job_id)))
            if exists is None:
                raise VjobError(f"job {rms}:{rms_job_id} is not tracked by vjob")


def record_resume(store: Store, rms: str, rms_job_id: str, *, at: float | None = None) -> None:
    """Pt += time since the preemption, atomically, and stop the clock (idempotent)."""
    _check_key(rms, rms_job_id)
    t = now() if at is None else at
    with store.session() as s:
        s.execute(
            update(JobRecord)
            .where(_where(rms, rms_job_id), JobRecord.preempted_since.is_not(None))
            .values(
                preempted_seconds=JobRecord.preempted_seconds
                + case((JobRecord.preempted_since < t, t - JobRecord.preempted_since), else_=0.0),
                preempted_since=None,
                vjob_state="running",
                updated_at=t,
            )
        )


def get(store: Store, rms: str, rms_job_id: str) -> JobRecord | None:
    _check_key(rms, rms_job_id)
    with store.session() as s:
        return s.scalar(select(JobRecord).where(_where(rms, rms_job_id)))
