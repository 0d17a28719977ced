"""The agent against the real Slurm development cluster, without VMs: failure handling.

The agent must never stand in Slurm's way: with its state store down it logs, counts the
error and retries, and Slurm keeps scheduling jobs as if vjob were not there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from tests.services import free_port, wait_for
from vjob.config import parse

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, cluster, db_url: str) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'[database]\nurl = "{db_url}"\nconnect_timeout_s = 1\n'
        "[agent]\ninterval_s = 0.5\n"
        f'[slurm]\nconf = "{cluster.conf}"\n'
        '[logging]\nformat = "json"\n'
    )
    return path


def test_agent_with_its_database_down_logs_retries_and_slurm_keeps_running(slurm_cluster, tmp_path):
    dead_db = f"postgresql+psycopg://vjob:x@127.0.0.1:{free_port()}/vjob"
    config = _config(tmp_path, slurm_cluster, dead_db)
    env = {**slurm_cluster.env, "VJOB_CONFIG": str(config), "PATH": "/usr/bin:/bin"}
    log = tmp_path / "agent.log"

    def failures() -> list[dict]:
        lines = log.read_text().splitlines() if log.exists() else []
        events = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if e.get("event", "").startswith("state store unavailable")]

    with log.open("w") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "vjob.cli", "--config", str(config), "agent", "--rms", "slurm"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: len(failures()) >= 2, 120, "the agent logging its store failure twice")
        job = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", "-N1", "--wrap", "echo hello from slurm"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()

        def done() -> bool:
            out = subprocess.run(
                ["scontrol", "show", "job", job], env=env, capture_output=True, text=True, timeout=30, check=False
            ).stdout
            return "JobState=COMPLETED" in out

        wait_for(done, 60, f"job {job} completed by Slurm while the agent's database is down")
        assert agent.poll() is None, "the agent must keep running"
        seen = len(failures())
        wait_for(lambda: len(failures()) > seen, 30, "the agent retrying")
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert "unreachable" in failures()[0]["error"]
    assert agent.returncode == 0


def test_one_tick_sets_the_site_factor_of_pending_jobs_to_their_rank(slurm_cluster, slurm_adapter, tmp_path):
    config = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(slurm_cluster.conf)},
        }
    )
    from vjob.store.db import Store

    Store(config.database_url).upgrade()
    env = slurm_cluster.env
    # Pending (not before an hour from now), not held: its priority is multifactor + site factor.
    held = subprocess.run(
        ["sbatch", "--parsable", "--begin=now+3600", "-N1", "--wrap", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()

    def priority() -> int:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%Q", "-j", held], env=env, capture_output=True, text=True, timeout=30, check=True
        ).stdout
        return int(out.strip())

    try:
        before = priority()
        metrics = AgentMetrics()
        report = Agent(config, slurm_adapter, rms="slurm", metrics=metrics).tick()
        assert report.store_ok and not report.errors
        assert held in report.decision.rms_priorities
        assert report.decision.rms_priorities[held] > 0
        assert priority() == before + report.decision.rms_priorities[held]
        assert "vjob_queue_jobs" in metrics.text()
    finally:
        subprocess.run(["scancel", held], env=env, capture_output=True, timeout=30, check=False)


def test_the_saved_vm_of_a_job_slurm_no_longer_knows_is_deleted_after_two_ticks(slurm_cluster, slurm_adapter, tmp_path):
    from vjob.pilot_files import PilotDir, PilotState, PilotStatus
    from vjob.store.db import Store

    config = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(slurm_cluster.conf)},
            "agent": {"cleanup_after_s": 0},
            "provisioning": {"default_uri": "test:///default"},
        }
    )
    Store(config.database_url).upgrade()
    env = slurm_cluster.env
    alive = subprocess.run(
        ["sbatch", "--parsable", "--begin=now+3600", "-N1", "--wrap", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    dirs = {}
    for job in (alive, "99999"):
        dirs[job] = PilotDir(tmp_path / "data" / "pilots", "slurm", job)
        dirs[job].ensure()
        dirs[job].write_state(
            PilotStatus(
                job_id=job,
                vm=f"vjob-slurm-{job}",
                node="node1",
                uri="test:///default",
                state=PilotState.SAVED,
                since=0.0,
            )
        )
    try:
        agent = Agent(config, slurm_adapter, rms="slurm")
        assert agent.tick().cleaned == []  # one tick without the job is not enough
        assert dirs["99999"].exists()
        assert agent.tick().cleaned == ["99999"]
        assert not dirs["99999"].path.exists()
        assert dirs[alive].exists(), "a job Slurm still knows keeps its saved VM"
    finally:
        subprocess.run(["scancel", alive], env=env, capture_output=True, timeout=30, check=False)
