"""Tracked jobs and their preemption history (UBIS's Pn and Pt).

Why single UPDATE statements with arithmetic in SQL: several agents, pilots or site masters
may record a preemption of the same job at once; `SET n = n + 1` is atomic in SQLite and
PostgreSQL alike, whereas read-then-write in Python loses updates.
"""

from __future__ import annotations

from sqlalchemy import case, select, update
from sqlalchemy.exc import IntegrityError

from vjob.errors import VjobError
from vjob.model import Job
from vjob.store.db import Store, now
from vjob.store.schema import JobRecord


def track(store: Store, job: Job, *, site: str = "default") -> int:
    """Record `job` if it is new (idempotent); returns its row id."""
    with store.session() as s:
        row = s.scalar(select(JobRecord).where(JobRecord.rms == job.rms, JobRecord.rms_job_id == job.id))
        if row is not None:
            return row.id
    t = now()
    try:
        with store.session() as s:
            row = JobRecord(
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
            s.add(row)
            s.flush()
            return row.id
    except IntegrityError:
        # Another process tracked it between our look and our insert: theirs is as good.
        with store.session() as s:
            found = s.scalar(select(JobRecord.id).where(JobRecord.rms == job.rms, JobRecord.rms_job_id == job.id))
            assert found is not None
            return found


def _where(rms: str, rms_job_id: str):  # noqa: ANN202 - a SQLAlchemy clause
    return (JobRecord.rms == rms) & (JobRecord.rms_job_id == rms_job_id)


def record_preemption(store: Store, rms: str, rms_job_id: str, *, at: float | None = None) -> None:
    """Pn += 1 and start the preempted-time clock, atomically; a second call while the job is
    still preempted does not count twice (idempotent after a crash)."""
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


def add_preempted_seconds(store: Store, rms: str, rms_job_id: str, seconds: float) -> None:
    """Pn += 1 and Pt += seconds in one atomic statement (when the duration is known)."""
    if seconds < 0:
        raise VjobError(f"preempted seconds = {seconds}: must be >= 0")
    with store.session() as s:
        s.execute(
            update(JobRecord)
            .where(_where(rms, rms_job_id))
            .values(
                preempt_count=JobRecord.preempt_count + 1,
                preempted_seconds=JobRecord.preempted_seconds + seconds,
                updated_at=now(),
            )
        )


def get(store: Store, rms: str, rms_job_id: str) -> JobRecord | None:
    with store.session() as s:
        return s.scalar(select(JobRecord).where(_where(rms, rms_job_id)))
