"""A job's state change applied from its listing Row equals its JSON (plugins.slurm.transitions).

The recordings are real Slurm 22.05 (tests/data/fixtures/slurm/transitions-22.05, README there):
the listing and `squeue --json` of the same instant, jobs taken through pending → running →
suspended → running → requeued held → released → running → cancelled, one held and released
while pending. For every step and job, what the listing alone makes of the Job read at the step
before must be the Job parse_json makes of the JSON of this step, or nothing (then the JSON is
read). Expected values come from the JSON, never from the code under test.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path

import pytest

from plugins.slurm import parse_json, transitions
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.incremental import IncrementalJobs, Listing, listing
from vjob.model import Job, JobState

RECORDED = Path(__file__).parent / "data" / "fixtures" / "slurm" / "transitions-22.05"
STEPS = sorted(p.name.removesuffix(".listing.txt") for p in RECORDED.glob("*.listing.txt"))


def _step(name: str) -> tuple[str, dict[str, Job]]:
    """The listing text and the unfinished Jobs of the JSON of one recorded step."""
    text = (RECORDED / f"{name}.listing.txt").read_text()
    doc = json.loads((RECORDED / f"{name}.squeue.json").read_text())
    jobs = {j.id: j for j in parse_json.jobs(doc, source=name) if not j.state.finished}
    return text, jobs


def test_the_recording_covers_every_state_change() -> None:
    seen = {(j.id, j.state) for name in STEPS for j in _step(name)[1].values()}
    for job_id in ("2", "3"):
        assert {s for j, s in seen if j == job_id} == {
            JobState.PENDING,
            JobState.RUNNING,
            JobState.SUSPENDED,
            JobState.HELD,
        }
    assert ("4", JobState.HELD) in seen and ("4", JobState.PENDING) in seen
    assert len(STEPS) == 12


def test_the_listing_and_the_json_of_one_instant_list_the_same_jobs() -> None:
    for name in STEPS:
        text, jobs = _step(name)
        assert set(listing(text)) == set(jobs), name


def _changes() -> list[tuple[str, str, str]]:
    """(step before, step, job id) for every job unfinished at both steps whose Row moved."""
    out = []
    for before, now in itertools.pairwise(STEPS):
        rows_before, rows_now = listing(_step(before)[0]), listing(_step(now)[0])
        out += [(before, now, j) for j in sorted(rows_before.keys() & rows_now.keys()) if rows_before[j] != rows_now[j]]
    return out


def test_each_recorded_state_change_applied_from_the_row_is_the_json_of_that_instant() -> None:
    applied, read = [], []
    for before, now, job_id in _changes():
        kept = _step(before)[1][job_id]
        got = transitions.applied(kept, listing(_step(before)[0])[job_id], listing(_step(now)[0])[job_id])
        if got is None:
            read.append((now, job_id))
            continue
        assert got == _step(now)[1][job_id], (now, job_id)
        applied.append((now, job_id, got.state))
    assert applied == [
        ("02-held", "4", JobState.HELD),
        ("03-released", "4", JobState.PENDING),
        ("04-running", "2", JobState.RUNNING),  # the start: state, start time, nodes from the Row
        ("04-running", "3", JobState.RUNNING),
        ("05-suspended", "2", JobState.SUSPENDED),  # priority 0 while suspended: not "held"
        ("05-suspended", "3", JobState.SUSPENDED),
        ("06-resumed", "2", JobState.RUNNING),
        ("06-resumed", "3", JobState.RUNNING),
        ("07-requeue-hold-asked", "2", JobState.RUNNING),  # COMPLETING, still on its nodes
        ("07-requeue-hold-asked", "3", JobState.RUNNING),
        ("09-requeued-released", "2", JobState.PENDING),
        ("09-requeued-released", "3", JobState.PENDING),
        ("10-running-again", "2", JobState.RUNNING),
        ("10-running-again", "3", JobState.RUNNING),
        ("11-cancel-asked", "2", JobState.RUNNING),
        ("11-cancel-asked", "3", JobState.RUNNING),
    ]
    # the requeue moves the submit time on 22.05: more than a state change, read as JSON
    assert read == [("08-requeued-held", "2"), ("08-requeued-held", "3")]


def test_the_observation_through_the_recording_reads_json_for_new_jobs_and_the_requeue_only() -> None:
    at = {"step": STEPS[0]}
    asked: list[tuple[str, set[str]]] = []

    def fetch(ids: set[str]) -> list[Job]:
        asked.append((at["step"], set(ids)))
        return [j for i, j in _step(at["step"])[1].items() if i in ids]

    jobs = IncrementalJobs(
        list_jobs=lambda: _step(at["step"])[0],
        fetch=fetch,
        read_all=lambda: list(_step(at["step"])[1].values()),
        resync_every=len(STEPS),
    )
    for name in STEPS:
        at["step"] = name
        assert {j.id: j for j in jobs.jobs()} == _step(name)[1], name
    assert asked == [("08-requeued-held", {"2", "3"})]
    at["step"] = STEPS[-2]  # the jobs back: the resync's check compares what was applied
    jobs.jobs()
    assert jobs.last.full and jobs.last.drift == 0


def test_a_wrong_row_applied_is_counted_and_replaced_at_the_resync(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A listing whose start time is not the JSON's: applied as the listing says, then the
    resync finds the difference, counts it, logs it and keeps the JSON's Job."""
    _, pending = _step("01-pending")
    text, running = _step("04-running")
    forged = text.replace("|1796001754|node1|", "|1796001799|node1|")
    assert forged != text
    state = {"listing": _step("01-pending")[0], "jobs": pending}
    jobs = IncrementalJobs(
        list_jobs=lambda: state["listing"],  # type: ignore[arg-type,return-value]
        fetch=lambda ids: [j for i, j in state["jobs"].items() if i in ids],  # type: ignore[union-attr]
        read_all=lambda: list(state["jobs"].values()),  # type: ignore[union-attr]
        resync_every=2,  # the first read, one by change, then the resync
    )
    jobs.jobs()
    state.update(listing=forged, jobs=running)
    seen = {j.id: j for j in jobs.jobs()}
    assert seen["2"].start_time == 1796001799 and jobs.last.applied == 2
    assert seen["2"] == dataclasses.replace(running["2"], start_time=1796001799)
    capsys.readouterr()
    resynced = {j.id: j for j in jobs.jobs()}
    assert jobs.last.full and jobs.last.drift == 1
    assert resynced == running
    assert "differ from their JSON" in capsys.readouterr().err


def _with(row: tuple[str, ...], place: int, value: str) -> tuple[str, ...]:
    return tuple(value if i == place else f for i, f in enumerate(row))


def test_what_the_listing_cannot_vouch_for_is_read_as_json() -> None:
    """Memory taken from the allocation, a count that is not the kept Job's, a start time that
    is not POSIX seconds, nodes that are no host list, a changed limit, a job held by its
    reason alone: None (its JSON is read)."""
    (_, pending), (_, running) = _step("01-pending"), _step("04-running")
    before = listing(_step("01-pending")[0])["2"]
    now = listing(_step("04-running")[0])["2"]
    assert transitions.applied(pending["2"], before, now) == running["2"]
    M, S, A, L = transitions.MEMORY, transitions.START, transitions.ALLOC, transitions.LIMIT
    assert transitions.applied(pending["2"], _with(before, M, "0"), _with(now, M, "0")) is None
    assert transitions.applied(dataclasses.replace(pending["2"], nodes=2), before, now) is None
    assert transitions.applied(pending["2"], before, _with(now, S, "2026-11-30T01:22:34")) is None
    assert transitions.applied(pending["2"], before, _with(now, A, "node[2-1]")) is None
    assert transitions.applied(pending["2"], before, _with(now, L, "20:00")) is None
    held_by_reason = dataclasses.replace(pending["2"], state=JobState.HELD)
    assert transitions.applied(held_by_reason, before, now) is None


def test_a_listing_kept_between_reads_sees_a_suspended_jobs_priority_as_a_change() -> None:
    kept = Listing()
    kept.read(_step("04-running")[0])
    kept.read(_step("05-suspended")[0])
    assert kept.changed == {"2", "3"} and kept.rows["2"][transitions.HELD] == "held"


SQUEUE = """#!{python}
import os, sys, time
# prints its one job's times as squeue does: strftime of SLURM_TIME_FORMAT, in local time
fmt = os.environ.get("SLURM_TIME_FORMAT", "%Y-%m-%dT%H:%M:%S")
when = time.strftime(fmt, time.localtime(1796001753))
sys.stdout.write("2|RUNNING|1|2|100M|10:00|" + when + "|" + when + "|node1|11000\\n")
"""


def test_the_adapter_asks_squeue_for_posix_seconds_whatever_the_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing's environment reaches squeue, and wins over one the agent was started with."""
    (tmp_path / "squeue").write_text(SQUEUE.replace("{python}", sys.executable))
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    adapter = SlurmAdapter(SlurmCommands(bin_dir=str(tmp_path)), resync_every=5)
    row = listing(adapter._list_jobs())["2"]
    assert (row[transitions.SUBMIT], row[transitions.START]) == ("1796001753", "1796001753")


def test_many_jobs_starting_at_once_cost_no_full_read() -> None:
    """A quarter of the jobs and more changing state only (a drained partition given back) is
    applied from the listing; the full read is for what must be read as JSON."""
    count = 400
    listed = {str(i): f"{i}|PENDING|1|2|1G|UNLIMITED|100|N/A||5" for i in range(1, count + 1)}
    pending = {j: Job(id=j, user="u", rms="slurm", cores=2, memory_mb=1024, submit_time=100.0) for j in listed}
    asked: list[set[str]] = []
    jobs = IncrementalJobs(
        lambda: "\n".join(listed.values()),
        lambda ids: asked.append(set(ids)) or [],
        lambda: list(pending.values()),
        resync_every=10,
    )
    jobs.jobs()
    for i in range(1, count // 2 + 1):
        listed[str(i)] = f"{i}|RUNNING|1|2|1G|UNLIMITED|100|150|n{i:03d}|5"
    seen = {j.id: j for j in jobs.jobs()}
    assert not jobs.last.full and jobs.last.applied == count // 2 and asked == []
    expected = {
        j: dataclasses.replace(
            pending[j], state=JobState.RUNNING, start_time=150.0, allocated_nodes=(f"n{int(j):03d}",)
        )
        for j in list(pending)[: count // 2]
    }
    assert seen == {**pending, **expected}
