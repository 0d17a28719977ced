"""`vjob prio --users` (agent/prio_users.py, ubis_priority/user_shares.py): each user's target,
decayed usage and fair-share term, held equal to the usage term the kernel gives their jobs;
and `vjob status` showing the wait reasons the agent left (agent/wait_notice.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from agent import status_cmd
from agent.wait_notice import STATUS_NAME
from ubis_priority import compute
from ubis_priority.user_shares import user_shares
from vjob.cli import main
from vjob.config import PriorityConfig, parse
from vjob.model import ClusterView, Job, JobClass, JobState, Node

NOW = 1_700_000_000.0


def _view() -> ClusterView:
    nodes = tuple(Node(f"n{i}", 8, 16384) for i in range(10))
    jobs = (
        Job("r1", "alice", nodes=2, state=JobState.RUNNING, start_time=NOW - 600, allocated_nodes=("n0", "n1")),
        Job("b1", "bob", nodes=3, submit_time=NOW - 7200),
        Job("i1", "alice", nodes=1, submit_time=NOW - 60, job_class=JobClass.INTERACTIVE),
        Job("b2", "carol", nodes=2, submit_time=NOW - 86400, account="physics"),
    )
    usage = {"alice": 9000.0, "bob": 1000.0, "dave": 5000.0}
    return ClusterView(now=NOW, nodes=nodes, jobs=jobs, usage=usage, targets={"alice": 0.5})


def test_each_users_term_is_the_one_the_kernel_gives_their_jobs() -> None:
    cfg = PriorityConfig(account_targets={"physics": 0.2})
    view = _view()
    shares = {(s.user, s.account): s for s in user_shares(view, cfg)}
    assert shares[("alice", "")].target == 0.5 and shares[("carol", "physics")].target == 0.2
    assert shares[("alice", "")].usage == 9000.0 and shares[("alice", "")].usage_share == pytest.approx(0.6)
    assert ("dave", "") in shares  # usage but no job: still a user sharing the cluster
    prios = compute(view, cfg)
    for job in prios.jobs:
        usage_term = next(t for t in prios.explain(job.id).terms if t.term == "usage")
        mine = shares[(job.user, job.account)]
        assert mine.weighted == pytest.approx(usage_term.weighted) and mine.term == pytest.approx(usage_term.normalised)
    terms = [s.term for s in user_shares(view, cfg)]
    assert terms == sorted(terms)  # the most held back first


def test_the_cli_prints_the_users_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "view.json"
    snapshot.write_text(json.dumps(_view().to_dict()))
    conf = tmp_path / "vjob.toml"
    conf.write_text("")
    assert main(["--config", str(conf), "prio", "--from", str(snapshot), "--users"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["USER", "ACCOUNT", "TARGET"]
    assert {line.split()[0] for line in lines[1:-1]} == {"alice", "bob", "carol", "dave"}
    assert lines[-1].startswith("(TERM = (target - usage share + 1) / 2")
    assert main(["--config", str(conf), "prio", "--from", str(snapshot), "--users", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["users"]
    alice = next(r for r in rows if r["user"] == "alice")
    assert alice["usage"] == 9000.0 and alice["term"] == pytest.approx((0.5 - 0.6 + 1) / 2)


def test_vjob_status_shows_the_reasons_the_agent_left(tmp_path: Path) -> None:
    cfg = parse({"data_dir": str(tmp_path), "database": {"url": f"sqlite:///{tmp_path / 'v.sqlite'}"}})
    reason = "vjob: would delay job 41[2].srv by 12 min"
    (tmp_path / STATUS_NAME).write_text(json.dumps({"at": NOW, "jobs": {"7": reason}}))
    data = status_cmd.collect(cfg, "slurm")
    assert data["waiting"]["jobs"] == {"7": reason}
    console = Console(record=True, width=200)
    status_cmd._print_waiting(console, data["waiting"])
    assert reason in console.export_text()  # the brackets printed, not read as markup
    (tmp_path / STATUS_NAME).write_text("{broken")
    data = status_cmd.collect(cfg, "slurm")
    assert data["waiting"]["jobs"] == {} and any("wait reasons" in e for e in data["errors"])
