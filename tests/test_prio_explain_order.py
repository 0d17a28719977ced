"""`vjob prio --explain` without a job: the queue in the policy's order, each job's tier and
its seven weighted terms (agent/prio_order.py), the order `tick.decide` walks and the agent
sends; a weight changed in vjob.toml changes what it prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from preemption.scheduling.tick import decide
from ubis_priority import TERMS
from vjob.cli import main
from vjob.config import Config, PriorityConfig, SchedulingConfig
from vjob.model import ClusterView, Job, JobClass, JobState, Node

NOW = 1_700_000_000.0


def _view() -> ClusterView:
    """Four nodes, two busy; an interactive job (within the 50 % cap the tests configure), a
    job vjob checkpointed (held, its preemption open), a job its user holds, and two batch
    jobs: alice's (3 days waiting, much usage) and bob's (1 hour, no usage)."""
    nodes = tuple(Node(f"n{i}", 8, 16384, os_image="deb") for i in range(4))
    jobs = (
        Job("r", "alice", nodes=2, state=JobState.RUNNING, start_time=NOW - 600, allocated_nodes=("n0", "n1")),
        Job("7", "bob", nodes=1, os_image="deb", submit_time=NOW - 60, job_class=JobClass.INTERACTIVE),
        Job(
            "8", "alice", nodes=3, state=JobState.HELD, submit_time=NOW - 900, preempt_count=1, preempted_since=NOW - 90
        ),
        Job("9", "carol", nodes=1, state=JobState.HELD, submit_time=NOW - 9000),
        Job("10", "alice", nodes=2, os_image="deb", submit_time=NOW - 3 * 86_400),
        Job("11", "bob", nodes=2, os_image="deb", submit_time=NOW - 3600),
    )
    return ClusterView(now=NOW, nodes=nodes, jobs=jobs, usage={"alice": 9e8, "bob": 0.0})


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "view.json"
    path.write_text(json.dumps(_view().to_dict()))
    return path


def _explain(capsys: pytest.CaptureFixture[str], snapshot: Path, toml: str, tmp_path: Path, *more: str) -> str:
    conf = tmp_path / "vjob.toml"
    tiers = "" if "[scheduling]" in toml else '[scheduling]\ntier_order = "ubis"\n'
    conf.write_text("[priority]\ninteractive_cap = 0.5\n" + tiers + toml)
    assert main(["--config", str(conf), "prio", "--from", str(snapshot), "--explain", *more]) == 0
    return capsys.readouterr().out


def test_the_order_tiers_and_terms_are_the_passs(capsys, snapshot, tmp_path):
    doc = json.loads(_explain(capsys, snapshot, "", tmp_path, "--format", "json"))
    assert doc["policy"] == "vjob"
    jobs = doc["jobs"]
    cfg = Config(priority=PriorityConfig(interactive_cap=0.5), scheduling=SchedulingConfig(tier_order="ubis"))
    d = decide(_view(), cfg, knob=None, checkpointable=(), sleeping={"8": ()})
    assert [j["job"] for j in jobs if j["place"] is not None] == list(d.order) == ["7", "8", "10", "11"]
    assert [j["tier"] for j in jobs] == ["interactive", "checkpointed", "batch", "batch", "held"]
    assert jobs[-1]["job"] == "9" and jobs[-1]["place"] is None  # held by its user: outside the pass
    for j in jobs:
        assert sum(j[t] for t in TERMS) == pytest.approx(j["priority"], abs=1e-12)
        assert j["priority"] == d.priorities[j["job"]]


def test_a_weight_in_the_file_reorders_what_it_prints(capsys, snapshot, tmp_path):
    table = _explain(capsys, snapshot, "", tmp_path)
    assert [line.split()[1] for line in table.splitlines()[1:5]] == ["7", "8", "10", "11"]
    assert table.splitlines()[0].split()[:4] == ["#", "JOBID", "USER", "TIER"]
    assert "policy vjob: 4 jobs in tier, then priority" in table
    weighted = _explain(capsys, snapshot, "[priority.weights]\nusage = 0.6\n", tmp_path)
    assert [line.split()[1] for line in weighted.splitlines()[1:5]] == ["7", "8", "11", "10"]


def test_explaining_one_job_says_where_it_stands(capsys, snapshot, tmp_path):
    out = _explain(capsys, snapshot, "", tmp_path, "11")
    assert out.splitlines()[0].endswith("; place 4 of 4 in the vjob policy's order, tier batch")
    out = _explain(capsys, snapshot, "", tmp_path, "9")
    assert out.splitlines()[0].endswith("; not in the vjob policy's order: held, and not by vjob")


def test_another_policy_shows_its_order_without_tiers(capsys, snapshot, tmp_path):
    out = _explain(capsys, snapshot, '[scheduling]\npolicy = "fcfs-easy"\n', tmp_path, "--format", "csv")
    lines = out.splitlines()
    assert lines[0].startswith("place,job,user,class,tier,")
    assert [line.split(",")[1] for line in lines[1:5]] == ["10", "11", "8", "7"]  # submission order
    assert {line.split(",")[4] for line in lines[1:5]} == {"-"}


def test_the_documented_order_is_what_it_prints(capsys, tmp_path):
    """docs/priority.md's worked example under `--explain`, as printed."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "priority.md").read_text()
    example = doc.split("## Worked example", 1)[1]
    blocks = re.findall(r"```(\w*)\n(.*?)```", example, flags=re.S)
    snapshot = tmp_path / "example.json"
    snapshot.write_text(next(body for lang, body in blocks if lang == "json"))
    documented = next(body for lang, body in blocks if lang == "" and body.startswith("#  JOBID"))
    conf = tmp_path / "vjob.toml"
    conf.write_text('[scheduling]\ntier_order = "ubis"\n')  # as the page says
    assert main(["--config", str(conf), "prio", "--from", str(snapshot), "--explain"]) == 0
    assert capsys.readouterr().out == documented


def test_the_footer_says_how_a_tier_is_ordered(capsys, snapshot, tmp_path):
    """The default `tier_order = "submit"`: the weights do not order a tier, and it says so."""
    table = _explain(capsys, snapshot, '[scheduling]\npolicy = "vjob"\n', tmp_path)
    assert "policy vjob: 4 jobs in tier, then submission time" in table
