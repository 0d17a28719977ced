"""`vjob status`: vjobs from the pilots' state files, preemptions from the journal and the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.remap_step import STATUS_NAME, RemapState, publish
from tests.test_agent_journal import journal_switch
from vjob.config import load as load_config_file
from vjob.model import Job
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
    res = _status(config)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["vjobs"] == [] and data["switches"] == []
    assert any("vjob db upgrade" in e for e in data["errors"])


def test_status_shows_why_the_remapping_left_a_vjob_alone(tmp_path: Path):
    """The remapping step's skip reasons reach `vjob status` through its status file (the table
    and --json); a broken file is a warning, not a failure."""
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    cfg = load_config_file(config)
    pdir = PilotDir(tmp_path / "data" / "pilots", "slurm", "7")
    pdir.ensure()
    pdir.write_state(PilotStatus(job_id="7", vm="vjob-slurm-7", node="node1", uri="qemu:///system",
                                 state=PilotState.RUNNING, since=time.time()))  # fmt: skip
    agent = Agent(cfg, object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    why = "several VMs: a pilot migrates no job VM by VM (not remapped yet)"
    publish(agent, RemapState(skipped={"7": why, "8": "the vjob policy suspends it this tick"}))

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
