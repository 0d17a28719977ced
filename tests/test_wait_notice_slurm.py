"""A held-back interactive job's reason on the real Slurm development cluster (plain jobs, no VMs).

One batch job holds every idle node; an interactive `srun` that an ordinary user (`nobody`)
starts with their own `--comment` waits. The agent's ticks (in this process, `Agent.tick`)
write why into the job's AdminComment: first "no checkpointable victim" (the batch job is no
vjob), then, under a second agent whose cap is 0, "interactive cap reached" in its place. The
user reads it with `scontrol show job` and `squeue -O AdminComment`; their Comment is untouched;
the label job_submit.lua wrote stays byte for byte; a steady reason costs no further `scontrol update`;
once the batch job is cancelled and Slurm starts the srun, the next tick removes the reason and
the AdminComment is what it was before. About 30 s of wall time.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent.loop import Agent
from vjob.config import Config, parse

pytestmark = pytest.mark.slurm
NAME = "vjob-wait-notice-srun"
USER_COMMENT = "my own note, [brackets] and  two spaces"
RUNUSER = ("/usr/sbin/runuser", "-u", "nobody", "--")
"""The user's side, as an ordinary user (no Slurm association is enforced on the dev cluster)."""


def _run(env: dict[str, str], *args: str, check: bool = True) -> str:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30, check=check).stdout


def _config(tmp_path: Path, cluster, cap: float) -> Config:
    return parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(cluster.conf)},
            "scheduling": {"policy": "vjob"},
            "priority": {"interactive_cap": cap},
        }
    )


def _idle_after_clean_up(env: dict[str, str]) -> list[str]:
    """Cancel what earlier tests left (the dev cluster is held through the flock by whoever
    uses it, so any job still there is a leftover) and wait for idle nodes (60 s at most)."""
    left = _run(env, "squeue", "-h", "-o", "%i").split()
    if left:
        _run(env, "scancel", *left, check=False)
    deadline = time.monotonic() + 60
    while True:
        rows = {tuple(line.split()) for line in _run(env, "sinfo", "-h", "-N", "-o", "%N %t").splitlines()}
        idle = sorted(n for n, st in rows if st == "idle")
        if (idle and len(idle) == len(rows)) or time.monotonic() > deadline:
            return idle
        time.sleep(0.5)


def _wait(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _srun_id(env: dict[str, str]) -> str | None:
    for line in _run(env, "squeue", "-h", "-n", NAME, "-o", "%i %T").splitlines():
        job, _state = line.split()
        return job
    return None


def _state(adapter, job: str) -> str:
    return adapter.job_fields(job)["JobState"].split(" ")[0]


def test_the_user_reads_why_their_srun_waits_and_keeps_their_comment(slurm_cluster, slurm_adapter, tmp_path: Path):
    from vjob.store.db import Store

    env = slurm_cluster.env
    user_env = {"PATH": "/usr/bin:/bin", **env}
    config = _config(tmp_path / "agent", slurm_cluster, 0.5)
    capped_config = _config(tmp_path / "capped", slurm_cluster, 0.0)  # its own store: its own lease
    for cfg in (config, capped_config):
        cfg.data_path.mkdir(parents=True)
        Store(cfg.database_url).upgrade()
    idle = _idle_after_clean_up(env)
    assert idle, "no idle node on the dev cluster after clean-up"
    sbatch = ("sbatch", "--parsable", "--exclusive", "--output=/dev/null", f"-N{len(idle)}", "-t", "5")
    batch = _run(env, *sbatch, "--wrap", "sleep 300").strip().split(";")[0]
    srun: subprocess.Popen[str] | None = None
    try:
        _wait("the batch job on every node", lambda: "RUNNING" in _run(env, "squeue", "-h", "-j", batch, "-o", "%T"))
        srun_args = ("-J", NAME, "-N1", "--exclusive", "-t", "1", "--chdir=/tmp", f"--comment={USER_COMMENT}")
        srun = subprocess.Popen(
            [*RUNUSER, "srun", *srun_args, "/bin/sleep", "8"],
            env=user_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        job = _wait("the srun's job id", lambda: _srun_id(env))
        before = slurm_adapter.job_fields(job)
        original = "" if before.get("AdminComment", "(null)") == "(null)" else before["AdminComment"]
        assert _state(slurm_adapter, job) == "PENDING"

        agent = Agent(config, slurm_adapter, rms="slurm")
        first = agent.tick()
        assert not first.errors, first.errors
        reason = first.decision.waits[job].text()
        assert reason.startswith("vjob: no checkpointable victim"), reason
        fields = slurm_adapter.job_fields(job)
        assert fields["AdminComment"] == (f"{original} [{reason}]" if original else f"[{reason}]")
        assert fields["Comment"] == USER_COMMENT
        for _ in range(2):  # the same reason: no further write
            assert not agent.tick().errors
        assert agent.notices.writes == 1

        # what the user sees, as an ordinary user
        seen = _run(user_env, *RUNUSER, "squeue", "-h", "-j", job, "-O", "AdminComment:400,Comment:200")
        assert f"[{reason}]" in seen and USER_COMMENT in seen, seen
        shown = _run(user_env, *RUNUSER, "scontrol", "show", "job", job)
        assert f"[{reason}]" in shown and f"Comment={USER_COMMENT}" in shown, shown

        capped = Agent(capped_config, slurm_adapter, rms="slurm")
        now_capped = capped.tick().decision.waits[job].text()
        assert now_capped.startswith("vjob: interactive cap reached (0/0 nodes"), now_capped
        fields = slurm_adapter.job_fields(job)
        assert fields["AdminComment"] == (f"{original} [{now_capped}]" if original else f"[{now_capped}]")
        assert fields["AdminComment"].count("[vjob: ") == 1 and fields["Comment"] == USER_COMMENT

        _run(env, "scancel", batch)
        _wait("Slurm starting the srun", lambda: _state(slurm_adapter, job) == "RUNNING")
        assert not capped.tick().errors
        fields = slurm_adapter.job_fields(job)
        assert fields.get("AdminComment", "(null)") in ((original or "(null)"), original)
        assert fields["Comment"] == USER_COMMENT
        assert capped.notices.writes == 2 and capped.notices.told == {}
        assert srun.wait(timeout=60) == 0, srun.stderr.read() if srun.stderr else ""
    finally:
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait()
        _run(env, "scancel", batch, check=False)
        _run(env, "scancel", "-n", NAME, check=False)  # runuser's srun, should the kill miss it
