"""`vjob status`: vjobs from the pilots' state files, preemptions from the journal and the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import consolidate
from agent.consolidate import ControlState
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.remap_step import STATUS_NAME, RemapState, publish
from agent.status_cmd import collect
from preemption.planner import NoViablePlacementError
from provisioning.profiling import DomainSample
from tests.agent_steps import control_step
from tests.test_agent_journal import journal_switch
from vjob.config import load as load_config_file
from vjob.model import ClusterView, Job, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]


def _status(config: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(config), "status", "--rms", "slurm", "--json"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_status_shows_vjobs_their_preemptions_and_recent_switches(tmp_path: Path):
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    store_jobs.track(store, Job(id="7", user="alice", rms="slurm"))
    store_jobs.record_preemption(store, "slurm", "7")
    sw_id = journal_switch(store, "interactive job 9 needs nodes node1", "7")
    (action,) = journal.load(store, sw_id).actions
    journal.set_action(store, action.id, "running")
    journal.set_action(store, action.id, "done")
    journal.set_switch(store, sw_id, "done")
    store.close()
    pdir = PilotDir(tmp_path / "data" / "pilots", "slurm", "7")
    pdir.ensure()
    pdir.write_state(
        PilotStatus(
            job_id="7",
            vm="vjob-slurm-7",
            node="node1",
            uri="qemu:///system",
            state=PilotState.SAVED,
            since=time.time(),
            save_bytes=2**20,
            save_seconds=0.5,
        )
    )

    res = _status(config)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    (vjob,) = data["vjobs"]
    assert (vjob["job"], vjob["pilot"], vjob["preempt_count"], vjob["vjob_state"]) == ("7", "saved", 1, "sleeping")
    (switch,) = data["switches"]
    assert switch["state"] == "done" and "interactive job 9" in switch["reason"]
    assert switch["actions"][0]["job"] == "7" and switch["actions"][0]["finished_at"] is not None
    assert data["errors"] == []


def test_status_answers_with_the_store_unreachable(tmp_path: Path):
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[database]\nurl = "sqlite:///{tmp_path}/none/x.sqlite"\n')
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "x.sqlite").touch()  # there but empty (a missing one would be created)
    res = _status(config)
    # Still answers (the JSON on stdout), but exits 1 with the store's failure on stderr (issue 36)
    assert res.returncode == 1, res.stderr
    data = json.loads(res.stdout)
    assert data["vjobs"] == [] and data["switches"] == []
    assert any("vjob db upgrade" in e for e in data["errors"])
    assert "vjob db upgrade" in res.stderr


def test_status_shows_why_the_remapping_left_a_vjob_alone(tmp_path: Path):
    """The remapping step's skip reasons reach `vjob status` through its status file (the table
    and --json); a broken file is a warning, not a failure."""
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    cfg = load_config_file(config)
    pdir = PilotDir(tmp_path / "data" / "pilots", "slurm", "7")
    pdir.ensure()
    pdir.write_state(
        PilotStatus(
            job_id="7",
            vm="vjob-slurm-7",
            node="node1",
            uri="qemu:///system",
            state=PilotState.RUNNING,
            since=time.time(),
        )
    )
    agent = Agent(cfg, object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    why = "several VMs: a pilot migrates no job VM by VM (not remapped yet)"
    publish(agent.ports, RemapState(skipped={"7": why, "8": "the vjob policy suspends it this tick"}))

    data = json.loads(_status(config).stdout)
    (vjob,) = data["vjobs"]
    assert vjob["remap_skipped"] == why and data["remap"]["skipped"]["8"].startswith("the vjob policy")
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(config), "status", "--rms", "slurm"]
    env = {**os.environ, "COLUMNS": "400"}  # one line per row: the reason is not wrapped
    table = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert table.returncode == 0 and "several VMs" in table.stdout, table.stdout + table.stderr

    (tmp_path / "data" / STATUS_NAME).write_text("[1, 2]")
    data = json.loads(_status(config).stdout)
    assert data["vjobs"][0]["remap_skipped"] is None
    assert any("not a remap status object" in e for e in data["errors"])


class _NoRMS:
    name = "slurm"

    def __getattr__(self, name: str):
        raise AssertionError(f"the control step called the adapter's {name}")


def test_status_shows_the_control_loops_last_decision_and_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every control step records what it decided (each vjob's target and why), its plan (the
    actions and cost, or "no change") and the switch; `vjob status` shows it, text and --json."""
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[planner]\ninterval_s = 30\noptimizer = "ffd"\n')
    cfg = load_config_file(config)
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    # One node of 1 GiB holds vjobs 5 and 6, 700 MiB each as root measures them: overloaded, no
    # room elsewhere, so FCFS keeps 5 (submitted first) and 6 must sleep.
    mib = {"vjob-slurm-5": 700, "vjob-slurm-6": 700}
    state = ControlState(
        sampler=lambda node: {vm: DomainSample(vm, 0.0, 0, 1, memory_kib=m * 1024) for vm, m in mib.items()}
    )
    pilots = {
        j: PilotStatus(
            job_id=j,
            vm=f"vjob-slurm-{j}",
            node="n1",
            uri="test:///default",
            since=1.0,
            state=PilotState.RUNNING,
            memory_mb=1,
        )
        for j in ("5", "6")
    }
    jobs = (Job(id="5", user="a", rms="slurm", submit_time=1.0), Job(id="6", user="b", rms="slurm", submit_time=2.0))
    view = ClusterView(now=0, nodes=(Node("n1", 2, 1024),), jobs=jobs)
    report = control_step(agent.ports, Observation(view, pilots, {}, True), state)
    assert report is not None and report.state == "failed"  # no pilot runs here to answer the suspend

    data = collect(cfg, "slurm")  # what `vjob status --json` prints (the text below runs the command)
    ctl = data["control"]
    assert ctl["overloaded"] == {"n1": "memory 1400 > 1024 MB"}
    assert (ctl["vjobs"]["5"]["target"], ctl["vjobs"]["6"]["target"]) == ("running", "sleeping")
    assert ctl["vjobs"]["5"]["why"].startswith("runs: #1 in the FCFS queue, measured 1 CPU, 700 MiB")
    assert ctl["vjobs"]["6"]["why"].endswith("no room beside the 1 vjob(s) before it")
    plan = ctl["plan"]
    assert [(a["action"], a["vm"]) for a in plan["actions"]] == [("suspend", "vjob-slurm-6")]
    assert (plan["cost"], plan["outcome"], plan["switch"]) == (700, "failed", report.switch_id)
    assert data["errors"] == []
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(config), "status", "--rms", "slurm"]
    table = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"}
    )
    assert "control loop, last step" in table.stdout and "overloaded: n1 (memory 1400 > 1024 MB)" in table.stdout
    assert "sleeps: #2 in the FCFS queue" in table.stdout
    assert f"plan: failed (switch {report.switch_id} failed" in table.stdout and "suspend vjob-slurm-6" in table.stdout

    # The next step: 6 measured small now, both fit: nothing to do, and the record says so.
    mib["vjob-slurm-6"] = 200
    assert control_step(agent.ports, Observation(view, pilots, {}, True), state) is None
    ctl = collect(cfg, "slurm")["control"]
    assert ctl["plan"]["outcome"] == "no change" and ctl["plan"]["actions"] == [] and ctl["overloaded"] == {}
    assert ctl["vjobs"]["6"]["target"] == "running" and ctl["at"] == state.last_step

    # A planner that fails: the tick reports the error, the record says why there is no plan.
    mib["vjob-slurm-6"] = 700

    def no_plan(*_a: object, **_k: object) -> None:
        raise NoViablePlacementError("no viable placement of the running vjobs")

    monkeypatch.setattr(consolidate, "plan_for", no_plan)
    with pytest.raises(NoViablePlacementError):
        control_step(agent.ports, Observation(view, pilots, {}, True), state)
    plan = collect(cfg, "slurm")["control"]["plan"]
    assert (plan["outcome"], plan["why"]) == ("no plan", "no viable placement of the running vjobs")
    store.close()
