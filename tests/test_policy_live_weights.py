"""One weight changed in vjob.toml changes the order the agent sends to the real Slurm dev
cluster (issue 34 item 1: the vjob policy ranks each tier by the UBIS priority).

Why two agents on one queue: the same pending jobs, observed by an agent loaded from a
vjob.toml with `[priority.weights] usage = 0` and by one loaded from the same file with
`usage = 0.5`, must be ranked the other way round by each tick's pass, by the site factors
each agent writes, and by the priorities Slurm then holds (`squeue %Q`). The jobs differ only
in their user and submission: root's job is the older one; the ordinary test user's (`vjrun`,
submitted with `runuser`) the newer. root has used the cluster much (its usage seeded in each
agent's store; both agents also charge the running filler job to root), that user nothing, so
only the usage term can put the user's job first. Plain jobs, no VMs; all nodes are held by a
filler job so the two stay pending. About 15 s.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent.loop import Agent
from tests.test_policy_live_order import _cleared, _sbatch
from tests.test_realjob_slurm import USER, _user
from vjob.config import Config, load
from vjob.store.db import Store
from vjob.store.schema import UsageRecord

pytestmark = pytest.mark.slurm


def _config(tmp_path: Path, name: str, slurm_conf: str, usage_weight: float) -> Config:
    """A site's vjob.toml with one weight set, loaded as the agent loads it; root's heavy
    usage seeded in its store."""
    site = tmp_path / name
    site.mkdir()
    toml = site / "vjob.toml"
    toml.write_text(
        f'data_dir = "{site / "data"}"\n\n[slurm]\nconf = "{slurm_conf}"\n\n'
        f'[scheduling]\npolicy = "vjob"\ntier_order = "ubis"\n\n[priority.weights]\nusage = {usage_weight}\n'
    )
    cfg = load(toml)
    store = Store(cfg.database_url)
    store.upgrade()
    with store.session() as s:
        s.add(UsageRecord(entity_kind="user", name="root", node_seconds=1e9, decayed_at=time.time()))
    return cfg


def _sbatch_as_user(env: dict[str, str], *args: str) -> str:
    """sbatch as the ordinary test user (tests/test_realjob_slurm.py `_user` creates it)."""
    clean = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    res = subprocess.run(
        ["runuser", "-u", USER, "--", *clean, "sbatch", "--parsable", *args],
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _slurm_order(env: dict[str, str], jobs: list[str]) -> list[str]:
    """`jobs` by the priority Slurm holds for them, highest first."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %Q", "-j", ",".join(jobs)], env=env, capture_output=True, text=True, timeout=30
    ).stdout
    prio = {line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line.strip()}
    assert set(prio) == set(jobs), out
    return sorted(jobs, key=lambda j: -prio[j])


def _wait_order(env: dict[str, str], jobs: list[str], want: list[str]) -> list[str]:
    """Slurm's order of `jobs` once it is `want` (10 s at most: slurmctld recomputes)."""
    deadline = time.monotonic() + 10
    while True:
        got = _slurm_order(env, jobs)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def test_one_weight_in_vjob_toml_reorders_what_the_agent_sends(slurm_cluster, slurm_adapter, tmp_path: Path):
    _user()
    env = slurm_cluster.env
    conf = str(slurm_cluster.conf)
    no_usage = _config(tmp_path, "no-usage", conf, 0.0)
    usage = _config(tmp_path, "usage", conf, 0.5)
    idle, busy = _cleared(env, 1)
    assert idle, f"no idle node on the dev cluster after clean-up: {busy}"
    avoid = [f"--exclude={','.join(busy)}"] if busy else []
    jobs: list[str] = []
    try:
        filler = _sbatch(env, *avoid, f"-N{len(idle)}", "-t", "2", "--wrap", "sleep 100")
        jobs.append(filler)
        deadline = time.monotonic() + 30
        while (
            "RUNNING"
            not in subprocess.run(
                ["squeue", "-h", "-o", "%T", "-j", filler], env=env, capture_output=True, text=True, timeout=30
            ).stdout
        ):
            assert time.monotonic() < deadline, "the filler job never started"
            time.sleep(0.2)
        old = _sbatch(env, *avoid, "-N1", "-t", "1", "--wrap", "sleep 1")
        jobs.append(old)
        time.sleep(1.1)  # a later submission second: the queue-time term is root's, however small
        new = _sbatch_as_user(
            {k: v for k, v in env.items() if k.startswith("SLURM")} | {"PATH": "/usr/bin:/bin"},
            *avoid,
            "--exclusive",
            "--output=/dev/null",
            "-N1",
            "-t",
            "1",
            "--wrap",
            "sleep 1",
        )
        jobs.append(new)
        pair = [old, new]

        report = Agent(no_usage, slurm_adapter, rms="slurm").tick()
        assert not report.errors, report.errors
        d = report.decision
        assert [j for j in d.order if j in pair] == [old, new]  # usage weight 0: the older job first
        assert d.tiers[old] == d.tiers[new] == 3  # both in the batch tier
        assert d.rms_priorities[old] > d.rms_priorities[new]
        assert _wait_order(env, pair, [old, new]) == [old, new]

        report = Agent(usage, slurm_adapter, rms="slurm").tick()
        assert not report.errors, report.errors
        d = report.decision
        assert d.priorities[new] > d.priorities[old]
        assert [j for j in d.order if j in pair] == [new, old]  # root's usage now counts
        assert d.rms_priorities[new] > d.rms_priorities[old]
        assert _wait_order(env, pair, [new, old]) == [new, old]
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=30, check=False)
