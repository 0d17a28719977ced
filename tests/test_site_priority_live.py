"""The site's fair share inside vjob's tiers, on the real Slurm dev cluster (multifactor with
fair share through slurmdbd, plain jobs, no VMs; issue 34 item 2).

Why it is needed: the agent sends its tiers in bands above the site's own priority and, with
the default `[slurm] order_share = 0.5` and `tier_order = "submit"`, nothing else, so inside a
tier Slurm's multifactor (fair share, age) decides, and the pass walks the same order so that
the head it guards is the job Slurm starts first. What is observed, two ordinary users
submitting through `runuser` (one with the worse fair share, made so when they are equal by a
job of `vjobtest` running across Slurm's next usage update, up to a minute):

* the same tier, ordered by fair share: the worse user's large batch job is submitted first,
  the better user's identical job a second later; the pass orders, reserves and Slurm starts
  the later one first; both have the same site factor (sprio SITE), only FAIRSHARE differs;
* a tier beats fair share: an interactive `srun` of the worse user starts before both;
* the head is not overtaken by backfill it would delay: a one-node job of the worse user with a
  ten-minute limit fits beside the head once the interactive job runs, and does not start
  before it (neither in the pass's starts nor in Slurm).

About 20 s when the two users' fair shares already differ; 80 s measured on a fresh cluster
(the charge waits for Slurm's usage update).
"""

from __future__ import annotations

import pwd
import subprocess
import time

import pytest

from agent.loop import Agent
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from tests.services import wait_for
from tests.test_policy_live_order import _cleared, _sbatch, _states
from vjob.config import parse
from vjob.store.db import Store

pytestmark = pytest.mark.slurm
USERS = ("vjobtest", "vjrun")  # both have an association in the dev cluster's slurmdbd
INTERACTIVE = "vjob-site-prio-srun"


def _user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, timeout=30)


def _as(user: str, env: dict[str, str], *cmd: str) -> list[str]:
    """`cmd` as `user` with only the cluster's SLURM_CONF and a plain PATH."""
    return ["runuser", "-u", user, "--", "env", "-i", f"SLURM_CONF={env['SLURM_CONF']}", "PATH=/usr/bin:/bin", *cmd]


def _sbatch_as(user: str, env: dict[str, str], *args: str) -> str:
    res = subprocess.run(
        _as(user, env, "sbatch", "--parsable", "--exclusive", "--output=/dev/null", *args),
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _out(env: dict[str, str], *cmd: str) -> str:
    """stdout of `cmd`, asked again for up to 20 s while it fails (a controller just started, or
    busy on the 2 shared cores, answers late); the last error is the assertion's message."""
    deadline = time.monotonic() + 20
    while True:
        res = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=30, check=False)
        if res.returncode == 0:
            return res.stdout
        assert time.monotonic() < deadline, f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()[-300:]}"
        time.sleep(1)


def _fair_shares(env: dict[str, str]) -> dict[str, float]:
    rows = [line.split("|") for line in _out(env, "sshare", "-n", "-P", "-a", "-o", "Account,User,FairShare").split()]
    return {r[1]: float(r[2]) for r in rows if len(r) == 3 and r[0] == "vjob" and r[1] in USERS}


def _worse_and_better(env: dict[str, str], avoid: list[str]) -> tuple[str, str]:
    """The two users, the worse fair share first; when equal, vjobtest is charged with a job
    that runs across Slurm's next usage update (PriorityCalcPeriod = 1 min on the dev cluster)."""
    fs = _fair_shares(env)
    assert set(fs) == set(USERS), f"sshare lists {fs}: the dev cluster's slurmdbd misses a test user"
    if fs["vjobtest"] == fs["vjrun"]:
        charge = _sbatch_as("vjobtest", env, *avoid, "-N1", "-t", "3", "--wrap", "sleep 170")
        try:
            deadline = time.monotonic() + 150
            while fs["vjobtest"] == fs["vjrun"]:
                assert time.monotonic() < deadline, f"no usage charged to vjobtest in 150 s: {fs}"
                time.sleep(2)
                fs = _fair_shares(env)
        finally:
            subprocess.run(["scancel", charge], env=env, capture_output=True, timeout=30, check=False)
    worse, better = sorted(USERS, key=lambda u: fs[u])
    return worse, better


def _prio(env: dict[str, str]) -> dict[str, dict[str, int]]:
    """sprio's view of the pending jobs: {job: {priority, site, fairshare, age}}."""
    out = _out(env, "sprio", "-h", "-o", "%i|%Y|%S|%F|%A")
    rows = [line.split("|") for line in out.split()]
    names = ("priority", "site", "fairshare", "age")
    return {r[0]: {n: int(float(v)) for n, v in zip(names, r[1:], strict=True)} for r in rows}


def _agent(slurm_cluster, tmp_path) -> Agent:
    """The agent as `vjob agent --rms slurm` builds it (plugins.slurm.make_adapter's knob), with
    the defaults this test is about."""
    config = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(slurm_cluster.conf)},
            "scheduling": {"policy": "vjob"},
            "priority": {"interactive_cap": 0.5},
        }
    )
    assert config.slurm.order_share == 0.5 and config.scheduling.tier_order == "submit"  # the defaults
    Store(config.database_url).upgrade()
    adapter = SlurmAdapter(
        SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20),
        site_factor_max=config.slurm.site_factor_max,
        order_share=config.slurm.order_share,
    )
    return Agent(config, adapter, rms="slurm")


def test_fair_share_orders_a_tier_the_tier_beats_it_and_the_head_is_kept(slurm_cluster, tmp_path):
    for name in USERS:
        _user(name)
    agent = _agent(slurm_cluster, tmp_path)
    env = slurm_cluster.env
    idle, busy = _cleared(env, 4)
    assert len(idle) >= 4, f"the dev cluster has {len(idle)} idle nodes after clean-up (4 needed): {busy} not idle"
    size = len(idle)
    avoid = [f"--exclude={','.join(busy)}"] if busy else []
    worse, better = _worse_and_better(env, avoid)
    jobs: list[str] = []
    srun: subprocess.Popen[str] | None = None
    try:
        filler = _sbatch(env, *avoid, f"-N{size}", "-t", "1", "--wrap", "sleep 14")
        jobs.append(filler)
        wait_for(lambda: (_states(env, INTERACTIVE) or {}).get(filler) == "RUNNING", 30, "the filler job running")
        first = _sbatch_as(worse, env, *avoid, f"-N{size}", "-t", "1", "--wrap", "sleep 2")
        time.sleep(1.1)
        head = _sbatch_as(better, env, *avoid, f"-N{size}", "-t", "1", "--wrap", "sleep 2")
        small = _sbatch_as(worse, env, *avoid, "-N1", "-t", "10", "--wrap", "sleep 2")  # would delay the head
        jobs += [first, head, small]

        report = agent.tick()
        assert not report.errors, report.errors
        d = report.decision
        assert d.tiers[first] == d.tiers[head] == d.tiers[small] == 3
        assert [j for j in d.order if j in (first, head)] == [head, first]  # fair share, not submission
        assert d.reserved == head
        prio = _prio(env)
        print("sprio after the first tick:\n" + _out(env, "sprio", "-l"))  # docs/slurm.md's worked example
        assert prio[head]["fairshare"] > prio[first]["fairshare"]
        assert prio[head]["site"] == prio[first]["site"] == d.rms_priorities[head] > 0  # one band, no vjob opinion
        assert prio[head]["priority"] > prio[first]["priority"]

        srun = subprocess.Popen(
            _as(worse, env, "srun", *avoid, "-J", INTERACTIVE, "-N1", "--exclusive", "-t", "1", "/bin/sleep", "4"),
            cwd="/tmp",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        started: dict[str, float] = {}
        decisions = []
        tier_checked = False
        deadline = time.monotonic() + 90
        while "head" not in started or "interactive" not in started:
            assert time.monotonic() < deadline, f"still waiting: started {started}"
            report = agent.tick()
            assert not report.errors, report.errors
            decisions.append(report.decision)
            states = _states(env, INTERACTIVE)
            if states is None:
                continue
            inter = next((j for j in report.decision.order if report.decision.tiers.get(j) == 0), None)
            if not tier_checked and inter is not None and states.get(inter) == "PENDING":
                prio = _prio(env)
                if inter in prio and prio[inter]["site"] == report.decision.rms_priorities[inter]:
                    print("sprio with the interactive job:\n" + _out(env, "sprio", "-l"))
                    assert prio[inter]["fairshare"] < prio[head]["fairshare"]  # the worse user's
                    assert prio[inter]["priority"] > prio[head]["priority"]  # its tier wins
                    tier_checked = True
            now = time.monotonic()
            for name, job in (("first", first), ("head", head), ("small", small), ("interactive", INTERACTIVE)):
                if name not in started and states.get(job, "GONE") in ("RUNNING", "COMPLETING", "GONE"):
                    started[name] = now
            assert srun.poll() in (None, 0), srun.stderr.read() if srun.stderr else ""
            time.sleep(0.3)
        assert tier_checked, "the interactive job was never seen pending with its site factor"
        assert started["interactive"] <= started["head"], "the interactive job of the worse fair share waited"
        assert "first" not in started or started["first"] >= started["head"], (
            "the older job of the worse share went first"
        )
        assert "small" not in started or started["small"] >= started["head"], "the small job overtook the head"
        assert all(small not in d.starts for d in decisions if d.reserved == head)
        assert any(d.reserved == head for d in decisions)
        assert srun.wait(timeout=60) == 0, srun.stderr.read() if srun.stderr else ""
    finally:
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=30, check=False)
