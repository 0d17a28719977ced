"""The vjob policy's order, observed on the real Slurm development cluster (plain jobs, no VMs).

Why plain jobs: what is checked is the order, not the checkpoint (tests/test_agent_e2e_slurm.py
checks that with real guests). The agent runs its pass (`tick.decide`, policy `vjob`) every
half second and sets Slurm's site factor from it; Slurm starts the jobs. The decision and what
Slurm does must agree: an interactive job starts at once, the large batch job at the head of
the queue holds its reservation and starts as soon as the nodes free up, and a later small
batch job whose time limit would delay it does not jump ahead of it. About 35 s of wall time.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent.loop import Agent
from tests.services import wait_for
from vjob.config import parse

pytestmark = pytest.mark.slurm
INTERACTIVE = "vjob-live-order-srun"


def _idle_and_busy(env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The dev cluster's idle nodes and the others (other tests' jobs may hold some)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    rows = sorted({tuple(line.split()) for line in out.splitlines() if line.strip()})
    return [n for n, st in rows if st == "idle"], [n for n, st in rows if st != "idle"]


def _cleared(env: dict[str, str], wanted: int) -> tuple[list[str], list[str]]:
    """Cancel what earlier tests left on the dev cluster and wait (60 s at most) until `wanted`
    nodes are idle. Why not skip instead: a skip on leftovers hides that this test never ran;
    on the dev cluster (held through /tmp/vjob-devcluster.lock by whoever uses it) any job still
    there when this test starts is a leftover."""
    left = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    if left:
        subprocess.run(["scancel", *left], env=env, capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + 60
    while True:
        idle, busy = _idle_and_busy(env)
        if len(idle) >= wanted or time.monotonic() > deadline:
            return idle, busy
        time.sleep(0.5)


def _sbatch(env: dict[str, str], *args: str) -> str:
    return (
        subprocess.run(
            ["sbatch", "--parsable", "--exclusive", "--output=/dev/null", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )


def _states(env: dict[str, str], srun_name: str = INTERACTIVE) -> dict[str, str] | None:
    """Job id -> state from squeue, and the interactive srun's by its name `srun_name`; None
    when slurmctld did not answer (2 busy shared cores)."""
    res = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %j"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    if res.returncode != 0:
        return None
    rows = [line.split() for line in res.stdout.splitlines() if line.strip()]
    return {job: state for job, state, _ in rows} | {name: state for _, state, name in rows if name == srun_name}


def test_interactive_starts_at_once_and_the_large_head_job_is_not_passed(slurm_cluster, slurm_adapter, tmp_path: Path):
    config = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(slurm_cluster.conf)},
            "scheduling": {"policy": "vjob"},
            # the node terms at 0: the batch tier by age (and fair share), so the older large
            # job heads it; with the paper's weights the small job would rank first (issue 34)
            "priority": {"interactive_cap": 0.5, "weights": {"os_available": 0.0, "free_nodes": 0.0}},
        }
    )
    from vjob.store.db import Store

    Store(config.database_url).upgrade()
    env = slurm_cluster.env
    agent = Agent(config, slurm_adapter, rms="slurm")
    idle, busy = _cleared(env, 4)
    assert len(idle) >= 4, f"the dev cluster has {len(idle)} idle nodes after clean-up (4 needed): {busy} not idle"
    size = len(idle) - len(idle) % 2
    avoid = [f"--exclude={','.join(busy + idle[size:])}"] if busy or idle[size:] else []
    jobs: list[str] = []
    srun: subprocess.Popen[str] | None = None
    try:
        running = _sbatch(env, *avoid, f"-N{size // 2}", "-t", "1", "--wrap", "sleep 18")
        jobs.append(running)
        wait_for(lambda: (_states(env) or {}).get(running) == "RUNNING", 30, "the first batch job running")
        large = _sbatch(env, *avoid, f"-N{size}", "-t", "1", "--wrap", "sleep 3")
        small = _sbatch(env, *avoid, "-N2", "-t", "10", "--wrap", "sleep 2")  # 10 min: it would delay `large`
        jobs += [large, small]
        report = agent.tick()
        assert report.decision.reserved == large and small not in report.decision.starts
        t_inter = time.monotonic()
        srun = subprocess.Popen(
            ["srun", *avoid, "-J", INTERACTIVE, "-N2", "--exclusive", "-t", "1", "/bin/sleep", "6"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        first_run: dict[str, float] = {}
        decisions = []
        inter_started: float | None = None
        running_ended: float | None = None
        deadline = time.monotonic() + 90
        while len(first_run) < 3 or inter_started is None:
            assert time.monotonic() < deadline, f"jobs still waiting: {first_run}, interactive {inter_started}"
            report = agent.tick()
            assert not report.errors, report.errors
            decisions.append(report.decision)
            states = _states(env)
            now = time.monotonic()
            if states is None:
                continue
            for job in (running, large, small):
                if job not in first_run and states.get(job, "GONE") in ("RUNNING", "COMPLETING", "GONE"):
                    first_run[job] = now
            if inter_started is None and states.get(INTERACTIVE) == "RUNNING":
                inter_started = now - t_inter
            if running_ended is None and states.get(running, "GONE") not in ("PENDING", "RUNNING"):
                running_ended = now
            assert srun.poll() in (None, 0), srun.stderr.read() if srun.stderr else ""
            time.sleep(0.3)
        # the decision: the interactive job starts, the large job holds the reservation, the
        # small one waits behind it
        assert any(d.starts and d.reserved == large for d in decisions)
        assert all(small not in d.starts for d in decisions if d.reserved == large)
        # what Slurm did: the same, in order rather than against a clock: the interactive job took
        # the free nodes at once (before the running batch job ended, not after the reserved
        # large job), and the small job did not pass the large head job
        assert running_ended is not None and t_inter + inter_started < running_ended, (
            f"the interactive job waited {inter_started:.1f} s, until the running batch job ended"
        )
        assert first_run[small] >= first_run[large], "the small batch job passed the large head job"
        assert srun.wait(timeout=60) == 0, srun.stderr.read() if srun.stderr else ""
    finally:
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=30, check=False)
