"""The two readings of the deadline buffer (issue 34 item 6, docs/deadline.md "Two readings of
the deadline"): counted from submission or from the job's start on its node. The option is
validated, the readings differ exactly where a job waited, and X's recorded updates are the
ones the replay made."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from preemption.deadline import VOModel
from preemption.deadline.clock import counted_deadline
from simulator.deadline_engine import Cluster, DeadlineSetup, simulate_deadline
from simulator.deadline_reproduce import main as reproduce_main
from simulator.deadline_workload import DJob, paper_workload
from vjob.cli import main
from vjob.errors import InputError

NASA = Path(__file__).parent / "data" / "traces" / "NASA-iPSC-1993-3.1-cln.swf.gz"
HOUR = 3600.0


def test_a_bad_reading_is_refused_naming_the_value(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="deadline_from = 'queue': must be one of submit, start"):
        DeadlineSetup(deadline_from="queue")
    with pytest.raises(InputError, match="deadline_from = 'Start'"):
        counted_deadline("Start", submit_s=0, deadline_s=10, started_s=None, now_s=0)
    with pytest.raises(InputError, match="deadline_from = 'pilot'"):
        reproduce_main(["--deadline-from", "pilot", "--out", str(tmp_path / "r")])
    args = ["simulate", "--trace", str(NASA), "--nodes", "128", "--max-jobs", "50", "--no-plots"]
    assert main([*args, "--deadline-from", "later", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad" / "summary.json").exists()


def test_the_start_reading_counts_the_same_allowance_from_the_first_start() -> None:
    kw = {"submit_s": 100.0, "deadline_s": 100.0 + 1.05 * HOUR}
    assert counted_deadline("submit", **kw, started_s=None, now_s=5000) == 100.0 + 1.05 * HOUR
    assert counted_deadline("submit", **kw, started_s=900, now_s=5000) == 100.0 + 1.05 * HOUR
    assert counted_deadline("start", **kw, started_s=None, now_s=5000) == 5000 + 1.05 * HOUR  # as if now
    # started at 900: a later look (a checkpointed job waiting again) keeps that deadline
    assert counted_deadline("start", **kw, started_s=900, now_s=5000) == 900 + 1.05 * HOUR


def _queue() -> list[DJob]:
    """Two one-hour jobs on one core: the second waits an hour behind the first."""
    return [
        DJob(id=0, submit=0.0, duration=HOUR, estimate=HOUR, deadline=1.05 * HOUR, kind="cpu"),
        DJob(id=1, submit=10.0, duration=HOUR, estimate=HOUR, deadline=10.0 + 1.05 * HOUR, kind="cpu"),
    ]


@pytest.mark.parametrize(
    ("setup", "submit_outcome"),
    [
        # physical, no admission: the waiting job starts at 1 h and is killed at 1.05 h + 10 s
        (DeadlineSetup(physical=True, vo_managed=False, admission="none"), "missed"),
        # in a VM (cpu: 2 % overhead), static X: cancelled while waiting, hopeless even alone
        (DeadlineSetup(admission="static", static_x=0.05, noise=0.0), "cancelled"),
    ],
)
def test_a_job_that_waited_meets_its_deadline_counted_from_start_not_from_submit(
    setup: DeadlineSetup, submit_outcome: str
) -> None:
    one_core = Cluster(nodes=1, cores=1, mem_gb=8.0)
    by = {}
    for reading in ("submit", "start"):
        by[reading] = simulate_deadline(_queue(), one_core, replace(setup, deadline_from=reading), VOModel.default())
    sub, start = by["submit"], by["start"]
    assert sub.succeeded == 1 and getattr(sub, submit_outcome) == 1  # the first job only
    assert start.succeeded == 2 and start.missed == start.cancelled == start.rejected == 0
    assert start.wasted_core_s == 0
    # the physical run of the late job is cut at its deadline; the VM one never started
    assert (sub.wasted_core_s > 0) == (submit_outcome == "missed")


def test_readings_agree_when_nobody_waits() -> None:
    """Jobs days apart never queue: the two readings give the same replay."""
    jobs = [
        DJob(id=i, submit=i * 3 * 86400.0, duration=HOUR, estimate=HOUR, deadline=i * 3 * 86400.0 + 1.05 * HOUR, kind=k)
        for i, k in enumerate(["cpu", "mem", "io", "cpu"])
    ]
    out = []
    for reading in ("submit", "start"):
        s = DeadlineSetup(admission="adaptive", noise=0.0, deadline_from=reading)
        out.append(simulate_deadline(jobs, Cluster(nodes=1), s, VOModel.default()).summary())
    assert out[0] == out[1]
    # the io job (10 % overhead) cannot make a 5 % buffer: cancelled once x passes X
    assert out[0]["success_rate"] == 0.75 and out[0]["missed"] + out[0]["cancelled"] == 1


@pytest.mark.parametrize("admission", ["adaptive", "cdf"])
def test_x_updates_are_the_moves_the_replay_made(admission: str) -> None:
    jobs = paper_workload(400, cores=16, load=0.7, buffer=0.05, seed=4)
    s = DeadlineSetup(admission=admission, static_x=0.3, delta_x=0.1, target=0.1, trace_x=True, deadline_from="start")
    r = simulate_deadline(jobs, Cluster(nodes=4), s, VOModel.default())
    ups = r.updates
    assert len(ups) == r.succeeded + r.missed  # one per job let run to its end (or expired)
    assert ups[0][1] == 0.3  # from the configured X
    for (h0, _, after, _, _), (h1, before, _, _, _) in itertools.pairwise(ups):
        assert before == after and h1 >= h0  # a chain: nothing else moves X
    assert all(s.x_min <= a <= s.x_max for _, _, a, _, _ in ups)
    drivers = [d for *_, d in ups]
    if admission == "adaptive":  # the measured failure rate decides the direction
        assert all(0 <= d <= 1 for d in drivers)
        assert all((a < b) == (d > s.target) for _, b, a, _, d in ups if s.x_min < a < s.x_max and a != b)
    else:  # X is the quantile clipped to the bounds
        assert all(a == min(s.x_max, max(s.x_min, d)) for _, _, a, _, d in ups)
    untraced = simulate_deadline(jobs, Cluster(nodes=4), replace(s, trace_x=False), VOModel.default())
    assert untraced.updates == [] and untraced.summary() == r.summary()  # tracing changes nothing


def test_vjob_simulate_replays_a_trace_under_each_reading(tmp_path: Path) -> None:
    """NASA records no requests: from submission any wait over 5 % of the run misses; counted
    from the start, the physical replay (no overhead, run = request) meets every deadline."""
    args = ["simulate", "--trace", str(NASA), "--nodes", "128", "--max-jobs", "300", "--no-plots", "--physical"]
    docs = {}
    for reading in ("submit", "start"):
        out = tmp_path / reading
        assert main([*args, "--admission", "none", "--deadline-from", reading, "--out", str(out)]) == 0
        docs[reading] = json.loads((out / "summary.json").read_text())
        assert docs[reading]["deadline_from"] == reading
    assert docs["start"]["deadline"]["success_rate"] == 1.0 > docs["submit"]["deadline"]["success_rate"]


def test_the_readings_bench_writes_both_tables_and_the_update_diagnosis(tmp_path: Path) -> None:
    """bench/deadline_readings.py on a small workload: both reproductions, the side-by-side
    figures, and the cause replays whose static-target run is the measured static failure rate."""
    from tests.bench_scripts import load

    bench = load("deadline_readings")
    assert bench.main(["--out", str(tmp_path), "--training-hours", "200", "--steady-hours", "500", "--nodes", "2"]) == 0
    report = json.loads((tmp_path / "readings.json").read_text())
    for reading, where in (("submit", tmp_path), ("start", tmp_path / "from_start")):
        doc = json.loads((where / "reproduction.json").read_text())
        assert doc["deadline_from"] == reading
        r = report["readings"][reading]
        assert r["success"] == {s["config"]: s["success_rate"] for s in doc["results"]}
        assert {"alg_4", "alg_5"} <= set(r["x_updates"]) and len(r["cause_replays"]) == 4
    assert report["readings"]["start"]["success"]["alg_1"] == 1.0  # physical, counted from the start
    for png in ("readings.png", "x_updates.png"):
        assert (tmp_path / png).stat().st_size > 0
