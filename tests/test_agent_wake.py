"""The agent wakes at once when an interactive job is submitted, on the real Slurm dev cluster.

job_submit.lua rewrites `vjob-agent.wake` beside slurm.conf when it accepts an interactive job;
the agent watches that file, so it checkpoints victims without waiting out `interval_s`. The
file is a courtesy: when job_submit.lua cannot write it, the job must still go through.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from agent.loop import Agent, wake_file, wake_files
from agent.metrics import AgentMetrics
from plugins import make_adapter
from plugins.slurm.environment import wake_file as slurm_wake_file
from tests.services import wait_for
from vjob.config import parse

INTERVAL_S = 600.0
"""The agent's interval in the wake test: any tick after the first one was woken early."""
WAKE_BOUND_S = 60.0
"""A generous bound for 2 shared CI cores; on a quiet machine the tick follows within 1 s."""


def test_the_agent_watches_the_file_beside_slurm_conf_and_its_own(tmp_path):
    cfg = parse({"data_dir": str(tmp_path / "data"), "slurm": {"conf": "/srv/slurm/etc/slurm.conf"}})
    assert slurm_wake_file(cfg.slurm.conf) == Path("/srv/slurm/etc/vjob-agent.wake")
    assert wake_files(cfg, make_adapter("slurm", cfg)) == (wake_file(cfg), Path("/srv/slurm/etc/vjob-agent.wake"))
    assert wake_files(cfg, make_adapter("oar", cfg)) == (tmp_path / "data" / "agent.wake",)


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


def _mtime_ns(path: Path) -> int:
    return path.stat().st_mtime_ns


@pytest.mark.slurm
def test_an_interactive_submission_wakes_the_agent_long_before_its_interval(slurm_cluster, slurm_adapter, tmp_path):
    from vjob.store.db import Store

    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(slurm_cluster.conf)},
            "agent": {"interval_s": INTERVAL_S},
        }
    )
    Store(cfg.database_url).upgrade()
    env = {**slurm_cluster.env, "PATH": "/usr/bin:/bin"}
    wake = slurm_cluster.wake_file
    assert wake in wake_files(cfg, slurm_adapter), "the agent and the dev cluster must agree on the file"
    metrics = AgentMetrics()

    def ticks() -> float:
        return metrics.registry.get_sample_value("vjob_agent_ticks_total") or 0.0

    stop = threading.Event()
    agent = Agent(cfg, slurm_adapter, rms="slurm", metrics=metrics)
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    batch = ""
    loop.start()
    try:
        wait_for(lambda: ticks() >= 1, WAKE_BOUND_S, "the agent's first tick")
        first = _mtime_ns(wake)
        res = _run(["sbatch", "--parsable", "--begin=now+3600", "-N1", "--wrap", "true"], env)
        assert res.returncode == 0, res.stderr
        batch = res.stdout.strip()
        assert _mtime_ns(wake) == first, "a batch job must not wake the agent"
        assert ticks() == 1

        res = _run(["srun", "-N1", "true"], env)  # interactive: no batch script
        assert res.returncode == 0, res.stderr
        assert _mtime_ns(wake) > first, "job_submit.lua must rewrite the wake file for an interactive job"
        # A second tick within WAKE_BOUND_S (a hang bound), 10 times shorter than the interval:
        # only the wake file can have brought it (the interval_s = 600 s tick is far off).
        wait_for(lambda: ticks() >= 2, WAKE_BOUND_S, "a tick woken by the interactive submission")
    finally:
        stop.set()
        loop.join(timeout=60)
        if batch:
            _run(["scancel", batch], env)
    assert not loop.is_alive()


@pytest.mark.slurm
@pytest.mark.parametrize("broken", ["directory", "root-only file"])
def test_an_interactive_job_goes_through_when_the_wake_file_cannot_be_written(slurm_cluster, broken):
    wake = slurm_cluster.wake_file
    env = {**slurm_cluster.env, "PATH": "/usr/bin:/bin"}
    wake.unlink(missing_ok=True)
    if broken == "directory":
        wake.mkdir()  # nobody, not even root, can open a directory for writing
    else:
        wake.touch()  # owned by root, mode 0600: SlurmUser cannot write it
        wake.chmod(0o600)
    try:
        res = _run(["srun", "-N1", "printenv", "SLURM_JOB_ID"], env)
        assert res.returncode == 0, f"the job must be accepted: {res.stderr}"
        job = res.stdout.strip()
        assert job.isdigit(), res.stdout
        shown = _run(["scontrol", "show", "job", job], env).stdout
        assert "AdminComment=vjob:class=interactive" in shown, "job_submit.lua must still tag the job"
    finally:
        if wake.is_dir():
            wake.rmdir()
        else:
            wake.unlink(missing_ok=True)
        slurm_cluster.ensure_wake_file()
    assert wake.is_file() and wake.stat().st_mode & 0o777 == 0o644
