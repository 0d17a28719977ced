"""The store rows observe keeps between ticks (agent.observe_rows, issue 37 item 1): the rows
of jobs the agent has just recorded are not read again at the next tick (at a site's size that
re-read was the first steady tick's 3 s), a changed job's row is, and a listing's changes given
by observe are used only when they are from the listing this cache last saw.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from agent.observe_rows import note_tracked, records_of, tracked
from vjob.model import Job, JobState
from vjob.store import jobs as store_jobs
from vjob.store.db import Store


def test_rows_just_recorded_are_kept_and_a_changed_job_is_read_again(tmp_path: Path, store: Store) -> None:
    ports = SimpleNamespace(rms="slurm", root=str(tmp_path))
    jobs = [Job(id=str(i), user=f"user{i % 3}", rms="slurm", submit_time=float(i)) for i in range(1, 41)]
    first = records_of(ports, store, jobs)  # type: ignore[arg-type]
    assert first.rows == {} and first.missing == {j.id for j in jobs}
    assert store_jobs.track_many(store, jobs) == []
    note_tracked(ports, jobs)  # type: ignore[arg-type]
    second = records_of(ports, store, jobs)  # type: ignore[arg-type]
    assert second.read == [] and not second.missing  # nothing read again
    assert second.rows == tracked(store, "slurm", [j.id for j in jobs])  # and what is kept is the store's
    store_jobs.record_preemption(store, "slurm", "7", at=100.0)
    jobs[6] = replace(jobs[6], state=JobState.HELD)  # the RMS shows the requeue-held victim
    third = records_of(ports, store, jobs)  # type: ignore[arg-type]
    assert third.read == ["7"] and third.rows["7"].preempted_since == 100.0
    assert records_of(ports, store, jobs).read == ["7"]  # preempted: read at every tick until resumed  # type: ignore[arg-type]


def test_a_listing_diff_is_used_only_against_the_listing_last_seen(tmp_path: Path, store: Store) -> None:
    ports = SimpleNamespace(rms="slurm", root=str(tmp_path))
    jobs = [Job(id=str(i), user="user1", rms="slurm") for i in range(1, 11)]
    store_jobs.track_many(store, jobs)
    records_of(ports, store, jobs, this=jobs)  # type: ignore[arg-type]
    later = [*jobs[:4], *jobs[5:], replace(jobs[4], state=JobState.RUNNING)]
    look = records_of(ports, store, later, [later[-1]], ["99"], since=jobs, this=later)  # type: ignore[arg-type]
    assert look.read == ["5"]  # the diff given: only the changed job read
    gone = later[1:]
    store_jobs.record_preemption(store, "slurm", "1", at=5.0)
    look = records_of(ports, store, gone, [], [], since=jobs, this=gone)  # type: ignore[arg-type]
    assert "1" not in look.rows  # `since` is not the listing it last saw: found here, job 1 let go
    again = [replace(jobs[0], state=JobState.HELD), *gone]
    look = records_of(ports, store, again, [], [], since=jobs, this=again)  # type: ignore[arg-type]
    assert look.read == ["1"] and look.rows["1"].preempted_since == 5.0
