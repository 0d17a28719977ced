"""`vjob prio`: tables, JSON, CSV, explanations, and clear errors on bad snapshots."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.prio_cmd import COLUMNS
from ubis_priority import TERMS, compute
from vjob.cli import main
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node

NOW = 1_700_000_000.0


def _view() -> ClusterView:
    nodes = tuple(Node(f"n{i}", 8, 16384, os_image="debian" if i < 6 else "centos") for i in range(10))
    jobs = (
        Job("r1", "alice", nodes=2, state=JobState.RUNNING, start_time=NOW - 600, allocated_nodes=("n0", "n1")),
        Job("b1", "bob", nodes=3, os_image="debian", submit_time=NOW - 7200),
        Job("i1", "alice", nodes=1, os_image="centos", submit_time=NOW - 60, job_class=JobClass.INTERACTIVE),
        Job("b2", "carol", nodes=20, os_image="suse", submit_time=NOW - 86400, preempt_count=2),
    )
    return ClusterView(now=NOW, nodes=nodes, jobs=jobs, usage={"alice": 5000.0, "bob": 100.0})


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "view.json"
    path.write_text(json.dumps(_view().to_dict()))
    return path


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text("")
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_lists_pending_jobs_highest_first(capsys, snapshot, conf):
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["JOBID", "USER", "PRIORITY", "SITE", "PBS", *COLUMNS.values()]
    expected = compute(_view(), PriorityConfig())
    assert [line.split()[0] for line in lines[1:4]] == [expected.jobs[i].id for i in expected.ranked()]
    assert "(3 pending jobs" in lines[4]


def test_json_matches_the_library_and_sums_the_weighted_terms(capsys, snapshot, conf):
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert {j["job"]: j["priority"] for j in data["jobs"]} == compute(_view(), PriorityConfig()).as_dict()
    for job in data["jobs"]:
        assert sum(job[t] for t in TERMS) == pytest.approx(job["priority"])
        assert -1024 <= job["pbs"] <= 1023 and 0 <= job["site_factor"] <= 1_000_000


def test_csv_has_one_row_per_pending_job(capsys, snapshot, conf):
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sorted(r["job"] for r in rows) == ["b1", "b2", "i1"]


def test_weights_come_from_the_configuration(capsys, snapshot, tmp_path):
    conf = tmp_path / "only-interactive.toml"
    weights = "usage=0\nqueue_time=0\nos_available=0\npreempt_count=0\npreempt_time=0\nfree_nodes=0\ninteractive=1\n"
    conf.write_text("[priority.weights]\n" + weights)
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--format", "json")
    assert code == 0
    assert {j["job"]: j["priority"] for j in json.loads(out)["jobs"]} == {"i1": 1.0, "b1": 0.0, "b2": 0.0}


def test_explain_shows_every_term_raw_normalised_weighted(capsys, snapshot, conf):
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--explain", "b2")
    assert code == 0
    assert out.startswith("job b2 (user carol): priority")
    body = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert tuple(body) == TERMS
    assert body["preempt_count"][1:5] == ["2", "0.4000", "0.1", "0.0400"]
    code, out, _ = _run(
        capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--explain", "b2", "--format", "json"
    )
    assert json.loads(out)["terms"][1]["raw"] == 86400.0


@pytest.mark.parametrize(("job", "why"), [("r1", "it is not pending"), ("zz", "it is not in the view")])
def test_explain_of_a_job_without_priority_is_a_usage_error(capsys, snapshot, conf, job, why):
    code, _, err = _run(capsys, "--config", str(conf), "prio", "--from", str(snapshot), "--explain", job)
    assert code == 2
    assert f"--explain {job}" in err and why in err


def test_an_empty_queue_prints_only_the_header(capsys, tmp_path, conf):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"now": NOW, "nodes": [{"name": "n0", "cpus": 1, "memory_mb": 10}]}))
    code, out, _ = _run(capsys, "--config", str(conf), "prio", "--from", str(path))
    assert code == 0
    assert out.splitlines()[1].startswith("(0 pending jobs")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"now": 1, "jobs": [{"id": "j", "user": "u", "nodes": 0}]}', "jobs[0].nodes = 0: must be >= 1"),
        ('{"now": 1, "jobs": [{"id": "j", "user": "u", "job_class": "vip"}]}', "jobs[0].job_class = 'vip'"),
        ('{"now": 1, "usage": {"u": -3}, "jobs": [{"id": "j", "user": "u"}]}', "usage.u = -3.0"),
        ('{"jobs": []}', "missing key 'now'"),
    ],
)
def test_a_bad_snapshot_is_refused_naming_what_is_wrong(capsys, tmp_path, conf, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = _run(capsys, "--config", str(conf), "prio", "--from", str(path))
    assert code == 2
    assert out == ""
    assert message in err


def test_a_missing_snapshot_file_and_a_missing_source_are_usage_errors(capsys, tmp_path, conf):
    code, _, err = _run(capsys, "--config", str(conf), "prio", "--from", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read the snapshot" in err
    code, _, err = _run(capsys, "--config", str(conf), "prio")
    assert code == 2 and "--from" in err


def test_the_snapshot_can_come_from_standard_input(conf):
    proc = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "--config", str(conf), "prio", "--from", "-", "--format", "json"],
        input=json.dumps(_view().to_dict()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert {j["job"] for j in json.loads(proc.stdout)["jobs"]} == {"b1", "b2", "i1"}
