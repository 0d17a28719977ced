"""The jobs' JSON read paced by its own measured cost (plugins.slurm.json_pace; issue 37 item 1).

On Slurm 20.11-22.05 a fetch of one new job makes squeue print every job (12.7 s of its CPU
at 120,000 jobs), so after a read of wall time T the next fetch waits T × (1/share − 1). The
clock here is the test's own: a read "takes" the seconds the test's squeue stand-in adds to
it, so no assertion depends on this machine's speed. The requeue case walks the real Slurm
22.05 recording of tests/data/fixtures/slurm/transitions-22.05.
"""

from __future__ import annotations

import pytest

from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.incremental import IncrementalJobs
from plugins.slurm.json_pace import Pace
from tests.test_slurm_incremental_transitions import STEPS, _step
from vjob.config import parse
from vjob.errors import VjobError
from vjob.model import Job, JobState

READ_S = 5.0
"""The wall time each JSON read takes on the test's clock."""


class Clock:
    """A clock the test moves; a read moves it by READ_S."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Slurm:
    """A listing of rows the test edits, and JSON reads that take READ_S on the clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lines: dict[str, str] = {}
        self.limits: dict[str, str] = {}
        self.fetched: list[set[str]] = []
        self.full_reads = 0

    def put(self, job_id: str, state: str = "PENDING", limit: str = "60", nodes: str = "") -> None:
        start = "1795300600" if state == "RUNNING" else "N/A"
        self.lines[job_id] = f"{job_id}|{state}|1|1|0M|{limit}|1795300000|{start}|{nodes}|100"
        self.limits[job_id] = limit

    def listing(self) -> str:
        return "\n".join(self.lines.values())

    def _job(self, job_id: str) -> Job:
        state = JobState.RUNNING if "|RUNNING|" in self.lines[job_id] else JobState.PENDING
        return Job(id=job_id, user="u", rms="slurm", state=state, walltime=float(self.limits[job_id]))

    def fetch(self, ids: set[str]) -> list[Job]:
        self.clock.now += READ_S
        self.fetched.append(set(ids))
        return [self._job(j) for j in ids if j in self.lines]

    def read_all(self) -> list[Job]:
        self.clock.now += READ_S
        self.full_reads += 1
        return [self._job(j) for j in self.lines]


def _observed(share: float = 0.2, resync_every: int = 100) -> tuple[Clock, Slurm, IncrementalJobs]:
    clock = Clock()
    slurm = Slurm(clock)
    slurm.put("1", "RUNNING", nodes="n1")
    slurm.put("2")
    jobs = IncrementalJobs(slurm.listing, slurm.fetch, slurm.read_all, resync_every, pace=Pace(share, clock))
    assert [j.id for j in jobs.jobs()] == ["1", "2"] and slurm.full_reads == 1  # the first read: 5 s
    return clock, slurm, jobs


def test_the_pace_waits_the_reads_wall_time_times_one_over_share_minus_one() -> None:
    clock = Clock()
    pace = Pace(0.2, clock)
    assert pace.due()  # no read yet

    def read() -> str:
        clock.now += 2.0
        return "out"

    assert pace.timed(read) == "out" and pace.last_wall == 2.0 and pace.wait_s() == pytest.approx(8.0)
    clock.now += 7.9
    assert not pace.due()
    clock.now += 0.1
    assert pace.due()
    pace.wake()
    assert pace.forced and pace.due()
    pace.timed(read)
    assert not pace.forced and not pace.due() and pace.reads == 2
    assert Pace(1.0, clock).wait_s() == 0.0  # share 1: every read due at once


def test_a_new_job_is_held_back_until_its_read_is_due_then_caught_up() -> None:
    clock, slurm, jobs = _observed()  # read 5 s: the next fetch due 20 s after it ended
    slurm.put("3")
    clock.now += 10
    assert [j.id for j in jobs.jobs()] == ["1", "2"] and slurm.fetched == []
    assert jobs.last.deferred == 1 and not jobs.last.read and jobs.last.new == 1
    slurm.put("4")
    clock.now += 9.9
    assert [j.id for j in jobs.jobs()] == ["1", "2"] and jobs.last.deferred == 2
    clock.now += 0.1  # 20 s since the read ended
    assert [j.id for j in jobs.jobs()] == ["1", "2", "3", "4"]
    assert slurm.fetched == [{"3", "4"}] and jobs.last.read and jobs.last.deferred == 0
    slurm.put("5")
    clock.now += 10  # the fetch took 5 s: due 20 s after it
    jobs.jobs()
    assert jobs.last.deferred == 1 and slurm.fetched == [{"3", "4"}]


def test_a_running_job_changed_beyond_its_state_is_kept_as_last_read_and_read_again_when_due() -> None:
    clock, slurm, jobs = _observed()
    before = {j.id: j for j in jobs.jobs()}["1"]
    slurm.put("1", "RUNNING", limit="120", nodes="n1")  # its time limit moved: JSON needed
    clock.now += 1
    for _ in range(3):
        seen = {j.id: j for j in jobs.jobs()}
        assert seen["1"] is before and jobs.last.stale == 1 and slurm.fetched == []
        clock.now += 5
    clock.now += 5  # 21 s since the read
    assert {j.id: j for j in jobs.jobs()}["1"].walltime == 120.0 and slurm.fetched == [{"1"}]
    clock.now += 1
    jobs.jobs()
    assert jobs.last.stale == 0 and slurm.fetched == [{"1"}]  # its key is the new Row now


def test_a_wake_makes_the_next_read_due_at_once_and_stays_until_a_read_ran() -> None:
    clock, slurm, jobs = _observed()
    clock.now += 1
    jobs.wake()
    jobs.jobs()  # nothing new: no read, the wake kept for the job it announced
    assert slurm.fetched == [] and jobs.pace.forced
    slurm.put("7")  # the interactive job, listed a tick later
    clock.now += 1
    assert "7" in {j.id for j in jobs.jobs()} and slurm.fetched == [{"7"}] and not jobs.pace.forced
    slurm.put("8")
    clock.now += 1
    jobs.jobs()
    assert jobs.last.deferred == 1  # paced again after the woken read


def test_a_job_gone_while_reads_are_held_back_is_removed_at_once() -> None:
    clock, slurm, jobs = _observed()
    slurm.put("3")
    clock.now += 1
    jobs.jobs()
    assert jobs.last.deferred == 1
    del slurm.lines["1"], slurm.lines["3"]  # the running job ended; the held-back one too
    clock.now += 1
    assert [j.id for j in jobs.jobs()] == ["2"] and jobs.last.gone == 1 and jobs.last.deferred == 0
    clock.now += 30
    jobs.jobs()
    assert slurm.fetched == []  # nothing left to read


def test_the_resync_is_never_held_back_and_counts_as_a_read() -> None:
    clock, slurm, jobs = _observed(resync_every=2)
    slurm.put("3")
    clock.now += 1
    jobs.jobs()
    assert jobs.last.deferred == 1
    clock.now += 1
    assert [j.id for j in jobs.jobs()] == ["1", "2", "3"] and jobs.last.full and slurm.full_reads == 2
    slurm.put("4")
    clock.now += 19.9  # the resync took 5 s: the next fetch due 20 s after it ended
    jobs.jobs()
    assert jobs.last.deferred == 1 and slurm.fetched == []


def test_a_requeue_the_listing_cannot_apply_is_read_at_once_through_the_recording() -> None:
    """Real 22.05: the requeue moves the submit time, so the listing cannot apply it; a paced
    read would leave both jobs RUNNING in the view while Slurm has them held."""
    at = {"step": STEPS[0]}
    clock = Clock()
    asked: list[tuple[str, set[str]]] = []

    def fetch(ids: set[str]) -> list[Job]:
        asked.append((at["step"], set(ids)))
        return [j for i, j in _step(at["step"])[1].items() if i in ids]

    def read_all() -> list[Job]:
        clock.now += READ_S
        return list(_step(at["step"])[1].values())

    jobs = IncrementalJobs(
        lambda: _step(at["step"])[0], fetch, read_all, resync_every=len(STEPS), pace=Pace(0.001, clock)
    )
    for name in STEPS:  # the clock stands still: only what must not wait is read
        at["step"] = name
        assert {j.id: j for j in jobs.jobs()} == _step(name)[1], name
        assert jobs.last.urgent == (2 if name == "08-requeued-held" else 0), name
    assert asked == [("08-requeued-held", {"2", "3"})]


def test_the_share_is_configured_and_a_bad_value_is_named(tmp_path) -> None:
    for bad in (0, -0.1, 1.5, float("nan"), "fast"):
        with pytest.raises(VjobError, match="json_read_share"):
            parse({"slurm": {"json_read_share": bad}})
    with pytest.raises(ValueError, match="share"):
        Pace(0.0)
    for bad in (0, 2, float("inf")):
        with pytest.raises(VjobError, match="json_read_share_woken"):
            parse({"slurm": {"json_read_share_woken": bad}})
    with pytest.raises(ValueError, match="json read share woken 0"):
        Pace(0.5, woken_share=0)
    cfg = parse({"data_dir": str(tmp_path), "slurm": {"resync_every": 30}})
    assert cfg.slurm.json_read_share == 0.2 and cfg.slurm.json_read_share_woken == 0.5
    adapter = SlurmAdapter(
        SlurmCommands(bin_dir=str(tmp_path)), resync_every=30, json_read_share=0.5, json_read_share_woken=0.8
    )
    assert adapter.incremental is not None and adapter.incremental.pace.share == 0.5
    assert adapter.incremental.pace.woken_share == 0.8
    adapter.woken()
    assert adapter.incremental.pace.forced


def test_a_big_change_waits_for_its_read_too_then_reads_all_at_once() -> None:
    """More than a quarter of the jobs new: one full read is the cheaper read, when it is due."""
    clock, slurm, jobs = _observed()
    for n in range(100, 300):
        slurm.put(str(n))
    clock.now += 10
    assert len(jobs.jobs()) == 2 and jobs.last.deferred == 200 and slurm.full_reads == 1
    clock.now += 10
    assert len(jobs.jobs()) == 202 and jobs.last.full and slurm.full_reads == 2 and slurm.fetched == []


def test_a_cheap_fetch_is_not_held_back_for_long_by_a_costly_full_read() -> None:
    """Where `--jobs=` is honoured a fetch prints a few jobs: its own wall time, not the resync's,
    is the next fetch's expected cost (before any fetch, the first full read's is)."""
    clock = Clock()
    pace = Pace(0.2, clock)

    def read(seconds: float):
        def run() -> None:
            clock.now += seconds

        return run

    pace.timed(read(13.5), full=True)  # the first read: whole, 13.5 s
    assert pace.wait_s() == pytest.approx(54.0)  # no fetch measured yet: as costly as that
    clock.now += 54.0
    pace.timed(read(0.05))  # a fetch of 20 ids
    assert pace.wait_s() == pytest.approx(0.2)
    pace.timed(read(13.5), full=True)  # the resync: the idle time starts again, the cost stays the fetch's
    assert pace.wait_s() == pytest.approx(0.2) and not pace.due()
    clock.now += 0.2
    assert pace.due()
    pace.timed(read(13.5))  # 22.05: a fetch prints everything, and costs it
    assert pace.wait_s() == pytest.approx(54.0)


def test_a_wake_paced_to_its_looser_share_reads_after_as_long_as_the_last_read_took() -> None:
    """At woken_share 0.5 interactive jobs announced at every tick keep squeue busy half the
    time (22.05 at a site's size), and each is seen within two reads."""
    clock = Clock()
    slurm = Slurm(clock)
    slurm.put("1")
    pace = Pace(0.2, clock, woken_share=0.5)
    jobs = IncrementalJobs(slurm.listing, slurm.fetch, slurm.read_all, 100, pace=pace)
    jobs.jobs()  # the first read: 5 s
    slurm.put("7")
    jobs.wake()
    clock.now += 4.9  # 5 s idle after a 5 s read at share 0.5: not yet
    assert "7" not in {j.id for j in jobs.jobs()} and jobs.last.deferred == 1 and pace.forced
    clock.now += 0.1
    assert "7" in {j.id for j in jobs.jobs()} and slurm.fetched == [{"7"}] and not pace.forced
    slurm.put("8")  # no wake: the plain pace again, 20 s after that read
    clock.now += 19.9
    jobs.jobs()
    assert jobs.last.deferred == 1
    clock.now += 0.1
    assert "8" in {j.id for j in jobs.jobs()}
