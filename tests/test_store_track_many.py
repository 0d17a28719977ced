"""Recording a site's queue at the agent's first tick: many jobs per transaction, the same rows
as one at a time, the odd job refused alone (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from vjob.model import Job, JobClass
from vjob.store import jobs
from vjob.store.db import Store
from vjob.store.schema import JobRecord


def _count(store: Store) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(JobRecord)) or 0)


def test_a_batch_records_the_same_rows_as_one_job_at_a_time(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "TRACK_BATCH", 7)  # several transactions, a partial last one
    queue = [
        Job(id=str(k), user=f"u{k % 3}", account="acct", rms="slurm", cores=k % 5 + 1, job_class=JobClass.BATCH)
        for k in range(30)
    ]
    queue.append(Job(id="9", user="u0", rms="slurm"))  # the RMS listed a job twice: one row
    jobs.track(store, queue[3])  # recorded before (by a former tick): kept as it is
    assert jobs.track_many(store, queue) == []
    assert _count(store) == 30
    for job in queue[:30]:
        row = jobs.get(store, "slurm", job.id)
        assert row is not None and (row.user, row.account, row.cores) == (job.user, job.account, job.cores)
    assert jobs.track_many(store, queue) == [] and _count(store) == 30  # idempotent


def test_an_odd_job_is_refused_by_name_and_the_others_recorded(store: Store) -> None:
    odd = Job(id="7", user="eve\nroot", rms="slurm")  # a forged second log line in the user name
    refused = jobs.track_many(store, [Job(id="6", user="ann", rms="slurm"), odd, Job(id="8", user="bob", rms="slurm")])
    assert [(job.id, "job.user" in str(exc)) for job, exc in refused] == [("7", True)]
    assert {jobs.get(store, "slurm", i) is not None for i in ("6", "8")} == {True}
    assert jobs.get(store, "slurm", "7") is None


@pytest.mark.postgres
def test_a_batch_another_process_recorded_in_part_falls_back_to_one_by_one(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the batch's look and its insert another agent records job 2: the batch's
    transaction fails on the unique key, and every job is then recorded once, job by job.
    PostgreSQL only: SQLite lets one writer at a time, so there the other agent waits for the
    batch's transaction (or one of the two fails "database is locked", a store error the tick
    survives) and no unique-key conflict arises."""
    store = Store(postgres_url)
    store.upgrade()
    real_now = jobs.now
    raced: list[bool] = []

    def now_after_a_race() -> float:
        if not raced:  # the batch's look is done and its rows are not added yet
            raced.append(True)
            with store.session() as other:  # the other process, committed first
                other.add(jobs._row(Job(id="2", user="ann", rms="slurm"), "default", 1.0))
        return real_now()

    monkeypatch.setattr(jobs, "now", now_after_a_race)
    calls: list[str] = []
    real_track = jobs.track
    monkeypatch.setattr(jobs, "track", lambda st, job, **kw: calls.append(job.id) or real_track(st, job, **kw))
    assert jobs.track_many(store, [Job(id=str(k), user="ann", rms="slurm") for k in range(1, 5)]) == []
    assert raced and calls == ["1", "2", "3", "4"]  # the batch failed: one by one
    assert _count(store) == 4
    row = jobs.get(store, "slurm", "2")
    assert row is not None and row.created_at == 1.0  # the other process's row kept
    store.close()
