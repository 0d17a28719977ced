"""A held-back interactive job's reason on the real Slurm development cluster (plain jobs, no VMs).

One batch job holds every idle node; an interactive `srun` that an ordinary user (`nobody`)
starts with their own `--comment` waits. The agent's ticks (in this process, `Agent.tick`)
write why into the job's AdminComment: first "no checkpointable victim" (the batch job is no
vjob), then, under a second agent whose cap is 0, "interactive cap reached" in its place.
Everything the user does is done as the user (runuser): they read the reason with `scontrol
show job` and `squeue -O admin_comment` (22.05's name for the column: `AdminComment` is refused
with an error on stderr and an exit code of 0, which is how the column once looked empty), cannot
overwrite it (`scontrol update AdminComment=` is refused), and change their own Comment while
the job waits, which the agent's next write keeps. The label job_submit.lua wrote stays byte for
byte; a steady reason costs no further `scontrol update`; `vjob status` lists the reason; once
the batch job is cancelled and Slurm starts the srun, the next tick removes the reason, the
AdminComment is what it was before, and the finished job's record in slurmdbd (`sacct`, as the
user) carries no reason. About 30 s of wall time.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent import status_cmd
from agent.loop import Agent
from vjob.config import Config, parse

pytestmark = pytest.mark.slurm
NAME = "vjob-wait-notice-srun"
USER_COMMENT = "my own note, [brackets] and  two spaces"
USER_COMMENT_NEW = "changed while it waits [vjob: not from vjob]"
"""What the user writes into their own Comment mid-wait: even a look-alike of vjob's group there
is theirs, and stays (vjob edits AdminComment only)."""
RUNUSER = ("/usr/sbin/runuser", "-u", "nobody", "--")
"""The user's side, as an ordinary user (no Slurm association is enforced on the dev cluster)."""


def _run(env: dict[str, str], *args: str, check: bool = True) -> str:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30, check=check).stdout


def _as_user(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A Slurm command run by the ordinary user, as they would run it."""
    return subprocess.run([*RUNUSER, *args], env=env, capture_output=True, text=True, timeout=30, check=False)


def _user_reads(env: dict[str, str], *args: str) -> str:
    """What the user's command prints; any complaint on stderr fails the test (squeue warns
    about an unknown -O field there and still exits 0)."""
    done = _as_user(env, *args)
    assert done.returncode == 0 and not done.stderr, (args, done.returncode, done.stderr)
    return done.stdout


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


def _the_user_reads_it_and_cannot_overwrite_it(user_env: dict[str, str], job: str, group: str) -> None:
    """As the user: `squeue -O admin_comment` and `scontrol show job` show vjob's group beside
    their own Comment; `scontrol update AdminComment=` is refused and changes nothing."""
    seen = _user_reads(user_env, "squeue", "-h", "-j", job, "-O", "JobID:8,State:10,admin_comment:400,comment:100")
    print("squeue -O as the user:", seen, sep="\n")
    assert seen.split()[1] == "PENDING" and group in seen and USER_COMMENT in seen, seen
    shown = _user_reads(user_env, "scontrol", "show", "job", job)
    lines = [x.strip() for x in shown.splitlines() if "Comment=" in x]
    print("scontrol show job as the user:", *lines, sep="\n")
    assert any(x.startswith("AdminComment=") and group in x for x in lines), shown
    assert f"Comment={USER_COMMENT}" in lines, shown
    forged = _as_user(user_env, "scontrol", "update", f"JobId={job}", "AdminComment=forged by the user")
    assert forged.returncode != 0 and "denied" in forged.stderr, (forged.returncode, forged.stderr)
    assert group in _user_reads(user_env, "scontrol", "show", "job", job)


def _sacct_admin_comment_as_user(user_env: dict[str, str], job: str) -> str:
    """The finished job's AdminComment in slurmdbd, read by its user (30 s at most for the
    controller to send the end of the job)."""

    def ended() -> str | None:
        out = _user_reads(user_env, "sacct", "-n", "-P", "-X", "-j", job, "-o", "State,AdminComment")
        state, _, comment = out.strip().partition("|")
        return f"={comment}" if state == "COMPLETED" else None

    return _wait("slurmdbd recording the srun's end", ended, timeout=30)[1:]


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

        assert status_cmd.collect(config, "slurm")["waiting"]["jobs"] == {job: reason}
        _the_user_reads_it_and_cannot_overwrite_it(user_env, job, f"[{reason}]")
        assert _user_reads(user_env, "scontrol", "update", f"JobId={job}", f"Comment={USER_COMMENT_NEW}") == ""

        capped = Agent(capped_config, slurm_adapter, rms="slurm")
        now_capped = capped.tick().decision.waits[job].text()
        assert now_capped.startswith("vjob: interactive cap reached (0/0 nodes"), now_capped
        fields = slurm_adapter.job_fields(job)
        assert fields["AdminComment"] == (f"{original} [{now_capped}]" if original else f"[{now_capped}]")
        assert fields["AdminComment"].count("[vjob: ") == 1 and fields["Comment"] == USER_COMMENT_NEW

        _run(env, "scancel", batch)
        _wait("Slurm starting the srun", lambda: _state(slurm_adapter, job) == "RUNNING")
        assert not capped.tick().errors
        fields = slurm_adapter.job_fields(job)
        assert fields.get("AdminComment", "(null)") in ((original or "(null)"), original)
        assert fields["Comment"] == USER_COMMENT_NEW
        assert capped.notices.writes == 2 and capped.notices.told == {}
        assert status_cmd.collect(capped_config, "slurm")["waiting"]["jobs"] == {}
        seen = _user_reads(user_env, "squeue", "-h", "-j", job, "-O", "State:10,admin_comment:400").split()
        assert seen == ["RUNNING", *original.split()], seen
        assert f"Comment={USER_COMMENT_NEW}" in _user_reads(user_env, "scontrol", "show", "job", job)
        assert srun.wait(timeout=60) == 0, srun.stderr.read() if srun.stderr else ""
        recorded = _sacct_admin_comment_as_user(user_env, job)
        print("sacct -o AdminComment as the user, after the job:", recorded)
        assert recorded == original  # slurmdbd got the removal too: no stale reason after the job
    finally:
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait()
        _run(env, "scancel", batch, check=False)
        _run(env, "scancel", "-n", NAME, check=False)  # runuser's srun, should the kill miss it
