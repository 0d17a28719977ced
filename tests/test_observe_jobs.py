"""observe's per-job work done only for what changed (agent.observe_jobs, issue 37 item 1): at
every step of a seeded random history of listings, store rows and pilot states, the Jobs,
sleeping jobs and queue counts it gives are those of a pass over every job from scratch, in the
same order; and a job none of whose inputs changed is given back as the very same object.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from agent import observe_jobs
from agent.observe_rows import Tracked
from vjob.model import Job, JobClass, JobState
from vjob.pilot_files import PilotState, PilotStatus

STATES = (JobState.PENDING, JobState.RUNNING, JobState.HELD, JobState.SUSPENDED)


def _job(rnd: random.Random, job_id: str) -> Job:
    running = rnd.random() < 0.4
    return Job(
        id=job_id,
        user=f"u{rnd.randrange(5)}",
        rms="slurm",
        job_class=rnd.choice((JobClass.BATCH, JobClass.BATCH, JobClass.INTERACTIVE)),
        state=JobState.RUNNING if running else rnd.choice(STATES),
        allocated_nodes=("n1",) if running else (),
    )


def _row(rnd: random.Random, job_id: str) -> Tracked:
    preempted = rnd.random() < 0.3
    return Tracked(job_id, "u1", rnd.randrange(3), float(rnd.randrange(100)), 5.0 if preempted else None)


def _pilot(rnd: random.Random, job_id: str) -> PilotStatus:
    state = rnd.choice(list(PilotState))
    return PilotStatus(
        job_id=job_id,
        vm=f"vjob-slurm-{job_id}",
        node="n1",
        uri="qemu:///system",
        state=state,
        since=1.0,
        saved_node="n2" if state is PilotState.SAVED else "",
    )


def _scratch(jobs: list[Job], rows: dict, pilots: dict) -> tuple:
    """The pass over every job, with nothing kept."""
    listing = observe_jobs.look(observe_jobs.Kept(), jobs)
    return observe_jobs.derive(observe_jobs.Kept(), listing, rows, [], pilots)


def _step(
    rnd: random.Random, jobs: list[Job], rows: dict, pilots: dict, next_id: int
) -> tuple[list[Job], list[str], int]:
    """The cluster moves on: jobs change, end, arrive; rows and pilot states change (the ids
    whose row is another object are returned, as records_of says which it read)."""
    jobs = list(jobs)
    read: list[str] = []
    for _ in range(rnd.randrange(6)):
        i = rnd.randrange(len(jobs))
        jobs[i] = replace(jobs[i], state=rnd.choice(STATES))  # another object for a changed job
    for _ in range(rnd.randrange(4)):
        gone = jobs.pop(rnd.randrange(len(jobs)))
        rows.pop(gone.id, None)
        pilots.pop(gone.id, None)
    for _ in range(rnd.randrange(4)):
        job = _job(rnd, str(next_id))
        next_id += 1
        jobs.insert(rnd.randrange(len(jobs) + 1), job)
        if rnd.random() < 0.7:
            rows[job.id] = _row(rnd, job.id)
            read.append(job.id)
    for _ in range(rnd.randrange(5)):
        job_id = rnd.choice(jobs).id
        rows[job_id] = _row(rnd, job_id)
        read.append(job_id)
    for _ in range(rnd.randrange(5)):
        job_id = rnd.choice(jobs).id
        if rnd.random() < 0.3:
            pilots.pop(job_id, None)
        else:
            pilots[job_id] = _pilot(rnd, job_id)
    if rnd.random() < 0.1:
        read.append(rnd.choice(jobs).id)  # read again, the same values: a new equal object
        rows[read[-1]] = Tracked(*rows[read[-1]]) if read[-1] in rows else _row(rnd, read[-1])
    if rnd.random() < 0.1:
        rnd.shuffle(jobs)  # the adapter's order may change
    return jobs, read, next_id


def test_what_changed_is_made_again_and_the_rest_is_kept_as_a_whole_pass_gives_it() -> None:
    rnd = random.Random(37)
    jobs = [_job(rnd, str(i)) for i in range(1, 201)]
    rows = {j.id: _row(rnd, j.id) for j in jobs if rnd.random() < 0.8}
    pilots = {j.id: _pilot(rnd, j.id) for j in jobs if rnd.random() < 0.3}
    kept = observe_jobs.Kept()
    got = observe_jobs.derive(kept, observe_jobs.look(kept, jobs), rows, [], dict(pilots))
    next_id, followed, kept_objects = 1000, 0, 0
    for step in range(300):
        before = {id(job): out for job, out in zip(jobs, got[0], strict=True)}
        old_jobs, old_rows, old_pilots = jobs, dict(rows), dict(pilots)  # old_jobs: their id() stay theirs
        if step % 50 == 49:
            rows = dict(rows)  # every row read again (observe_rows' full read): a new dict
        jobs, read, next_id = _step(rnd, jobs, rows, pilots, next_id)
        if step % 20 == 19:
            jobs.append(jobs[0])  # an id twice (no RMS should): made whole, still right
        listing = observe_jobs.look(kept, jobs)
        followed += not listing.whole
        got = observe_jobs.derive(kept, listing, rows, read, dict(pilots))
        want = _scratch(jobs, rows, dict(pilots))
        assert got[0] == want[0], step
        assert list(got[1].items()) == list(want[1].items()), step  # the same order too
        assert got[2] == want[2] == {k: n for k, n in Counter((j.job_class, j.state) for j in want[0]).items()}
        twice = step % 20 in (19, 0)  # an id listed twice in this listing or the last
        for job, out in zip(jobs, got[0], strict=True):
            if (
                not twice
                and id(job) in before
                and old_rows.get(job.id) is rows.get(job.id)
                and old_pilots.get(job.id) is pilots.get(job.id)
            ):
                assert out is before[id(job)], step  # nothing of it changed: the very same Job
                kept_objects += 1
        del old_jobs
        again = observe_jobs.derive(kept, observe_jobs.look(kept, jobs), rows, [], dict(pilots))
        assert again[0] == got[0], step
        if step % 20 == 19:
            jobs.pop()  # listed twice for one tick
            got = observe_jobs.derive(kept, observe_jobs.look(kept, jobs), rows, [], dict(pilots))
            assert got[0] == _scratch(jobs, rows, dict(pilots))[0]
        if not twice:  # (of an id listed twice, either Job made may come back)
            assert [i for i, (a, b) in enumerate(zip(again[0], got[0], strict=True)) if a is not b] == [], step
    assert followed > 200 and kept_objects > 10_000  # most steps followed the changes, most Jobs kept


def test_a_job_listed_again_after_it_went_is_made_afresh() -> None:
    first = Job(id="7", user="u", rms="slurm", state=JobState.RUNNING)
    other = Job(id="8", user="u", rms="slurm")
    pilot = PilotStatus(job_id="7", vm="vjob-slurm-7", node="n1", uri="q", state=PilotState.RUNNING, since=1.0)
    kept = observe_jobs.Kept()
    rows = {"7": Tracked("7", "u", 0, 0.0, None)}
    jobs, _, _ = observe_jobs.derive(kept, observe_jobs.look(kept, [first, other]), rows, [], {"7": pilot})
    assert jobs[0].vjob_state.value == "running"
    observe_jobs.derive(kept, observe_jobs.look(kept, [other]), rows, [], {})
    back = replace(first, state=JobState.PENDING)
    jobs, _, counts = observe_jobs.derive(kept, observe_jobs.look(kept, [other, back]), rows, [], {"7": pilot})
    assert jobs == _scratch([other, back], rows, {"7": pilot})[0]
    assert jobs[1].state is JobState.PENDING and jobs[1].vjob_state.value == "waiting"
    assert counts == {(JobClass.BATCH, JobState.PENDING): 2}
