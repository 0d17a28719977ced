"""The jobs IncrementalJobs hands out stay in job id order while only the tick's changes move it.

Why: the order is kept from tick to tick and only the jobs a tick adds or removes are put in or
taken out by bisection (plugins.slurm.incremental.IncrementalJobs._ordered); a mistake there
would hand the agent a queue in the wrong order or with a job twice. Here a seeded cluster
arrives, starts, ends and is resynced over many ticks, and every answer is checked against the
listed jobs sorted afresh.
"""

from __future__ import annotations

import random

import pytest

from plugins.slurm.incremental import IncrementalJobs
from vjob.model import Job, JobState

SUBMIT = 1_795_300_000


class FakeSlurm:
    """Jobs as the listing and the JSON would show them: id → (state word, node)."""

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[str, str]] = {}
        self.fetched: list[set[str]] = []

    def line(self, job_id: int) -> str:
        state, node = self.jobs[job_id]
        start, alloc = (str(SUBMIT + 60), node) if state == "RUNNING" else ("0", "")
        return f"{job_id}|{state}|1|1|1024M|60|{SUBMIT + job_id}|{start}|{alloc}|1000"

    def listing(self) -> str:
        return "".join(self.line(j) + "\n" for j in self.jobs)

    def job(self, job_id: int) -> Job:
        state, node = self.jobs[job_id]
        running = state == "RUNNING"
        return Job(
            id=str(job_id),
            user="user001",
            rms="slurm",
            memory_mb=1024,
            submit_time=float(SUBMIT + job_id),
            walltime=3600.0,
            state=JobState.RUNNING if running else JobState.PENDING,
            start_time=float(SUBMIT + 60) if running else None,
            allocated_nodes=(node,) if running else (),
        )

    def fetch(self, ids: set[str]) -> list[Job]:
        self.fetched.append(set(ids))
        return [self.job(int(j)) for j in ids if int(j) in self.jobs]

    def read_all(self) -> list[Job]:
        return [self.job(j) for j in self.jobs]


@pytest.mark.parametrize("seed", range(6))
def test_the_order_stays_the_listed_jobs_sorted_through_arrivals_starts_ends_and_resyncs(seed: int) -> None:
    rnd = random.Random(seed)
    slurm = FakeSlurm()
    free = list(range(1, 4000))
    rnd.shuffle(free)  # ids arrive out of order too (array tasks, federation)
    for _ in range(300):
        slurm.jobs[free.pop()] = ("PENDING", "")
    jobs = IncrementalJobs(slurm.listing, slurm.fetch, slurm.read_all, resync_every=7)
    for tick in range(40):
        kept = jobs._order
        got = jobs.jobs()
        if not jobs.last.full:  # a steady tick moves the kept order; it does not sort it again
            assert jobs._order is kept, f"seed {seed}, tick {tick}: sorted again"
        assert [j.id for j in got] == [str(j) for j in sorted(slurm.jobs)], f"seed {seed}, tick {tick}"
        assert all(j.state is JobState.RUNNING for j in got if slurm.jobs[int(j.id)][0] == "RUNNING")
        for _ in range(rnd.randrange(0, 12)):  # arrivals
            slurm.jobs[free.pop()] = ("PENDING", "")
        pending = [j for j, (s, _) in slurm.jobs.items() if s == "PENDING"]
        for job_id in rnd.sample(pending, min(len(pending), rnd.randrange(0, 8))):  # starts
            slurm.jobs[job_id] = ("RUNNING", f"n{rnd.randrange(1, 50):03d}")
        for job_id in rnd.sample(sorted(slurm.jobs), rnd.randrange(0, 8)):  # ends, either state
            del slurm.jobs[job_id]
    assert any(slurm.fetched), "new jobs were read as JSON by id"


def test_an_order_that_disagrees_with_the_jobs_is_sorted_again() -> None:
    slurm = FakeSlurm()
    for job_id in (5, 3, 9):
        slurm.jobs[job_id] = ("PENDING", "")
    jobs = IncrementalJobs(slurm.listing, slurm.fetch, slurm.read_all, resync_every=100)
    assert [j.id for j in jobs.jobs()] == ["3", "5", "9"]
    jobs._order.append("9")  # a kept order gone wrong (a job twice)
    slurm.jobs[7] = ("PENDING", "")
    assert [j.id for j in jobs.jobs()] == ["3", "5", "7", "9"]
    jobs._order[:] = ["3", "5", "8", "9"]  # the right length, an id that is not a job
    slurm.jobs[1] = ("PENDING", "")
    assert [j.id for j in jobs.jobs()] == ["1", "3", "5", "7", "9"]
