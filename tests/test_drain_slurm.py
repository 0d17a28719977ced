"""`vjob drain` on the real Slurm development cluster (plain jobs, no VMs), issue 36 item 2.

The state vjob leaves behind is made by vjob's own code on real jobs: an agent tick writes the
site factors of two pending jobs and a wait note into an ordinary user's interactive srun (one
that cannot start: a plain job holds the other nodes); the agent's checkpoint ending
(`act.finish_checkpoint`: `scontrol requeuehold` and Pn in the store, after the pilot's save)
requeue-holds the batch vjob A. The pilot is played by its state files (RUNNING, then SAVED with
a memory file, then RUNNING again): no guest boots here, the real-guest checkpoint path is
tests/test_agent_e2e_slurm.py's. Then, as an operator would:

* `vjob drain` with no agent running: the command's own pass releases A, which Slurm runs again,
  puts site factor 0 back on the pending jobs (sprio) and removes the note (scontrol); `vjob
  status` says drained;
* a new agent (a restart: the mark is in the store) ticks while the srun could start by
  checkpointing A (the filler cancelled): it sends no checkpoint request, no site factor, no
  note; A runs on, the srun waits;
* `vjob uninstall` refuses while A runs (exit 1, naming it);
* `vjob drain --undo`: the agent orders again (site factors back on the pending jobs);
* `vjob drain` with that agent running: the agent, woken, does the pass and the command says so.
About 40 s of wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent import act
from agent.loop import Agent
from agent.metrics import AgentMetrics
from vjob.config import parse
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, pilot_root

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parent.parent
RUNUSER = ("/usr/sbin/runuser", "-u", "nobody", "--")
NAME = "vjob-drain-srun"


def wait_for(check, timeout: float, what: str):
    """Poll `check` until it returns something true, and return that; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen after {timeout:.0f} s")
        time.sleep(0.3)


def _run(env: dict[str, str], *args: str, check: bool = True) -> str:
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60, check=check).stdout


def _state(env: dict[str, str], job: str) -> str:
    out = _run(env, "squeue", "-h", "-j", job, "-o", "%T %r", check=False).strip()
    return out or "GONE"


def _idle(env: dict[str, str]) -> list[str]:
    """Cancel what earlier tests left (whoever holds the flock owns the cluster) and wait for idle."""
    left = _run(env, "squeue", "-h", "-o", "%i").split()
    if left:
        _run(env, "scancel", *left, check=False)

    def idle() -> list[str] | None:
        rows = {tuple(line.split()) for line in _run(env, "sinfo", "-h", "-N", "-o", "%N %t").splitlines()}
        names = sorted(n for n, st in rows if st == "idle")
        return names if names and len(names) == len(rows) else None

    return wait_for(idle, 60, "every node idle")


def _sbatch(env: dict[str, str], *args: str) -> str:
    base = ("sbatch", "--parsable", "--output=/dev/null", "-t", "10")
    return _run(env, *base, *args).strip().split(";")[0]


def _vjob(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(conf), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))


SRUNS: list[subprocess.Popen[bytes]] = []
"""The sruns this test started (killed at its end)."""


def _srun(user_env: dict[str, str], env: dict[str, str], *args: str) -> str:
    """An ordinary user's interactive job (runuser nobody), named so it can be found: its id."""
    name = f"{NAME}-{len(SRUNS)}"
    SRUNS.append(
        subprocess.Popen(
            [*RUNUSER, "srun", "-J", name, *args, "--exclusive", "-t", "1", "--chdir=/tmp", "/bin/true"],
            env=user_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    return wait_for(lambda: _run(env, "squeue", "-h", "-n", name, "-o", "%i").strip() or None, 60, f"{name}'s id")


def _pilot(pdir: PilotDir, job: str, node: str, state: PilotState, **more: object) -> None:
    pdir.write_state(
        PilotStatus(
            job_id=job,
            vm=f"vjob-slurm-{job}",
            node=node,
            uri="test:///default",
            state=state,
            since=time.time(),
            **more,  # type: ignore[arg-type]
        )
    )


def test_drain_releases_resets_clears_and_a_drained_agent_preempts_nothing(slurm_cluster, slurm_adapter, tmp_path):
    from vjob.store.db import Store

    env = slurm_cluster.env
    user_env = {"PATH": "/usr/bin:/bin", **env}
    settings = {
        "data_dir": str(tmp_path / "data"),
        "slurm": {"conf": str(slurm_cluster.conf)},
        "scheduling": {"policy": "vjob"},
        "priority": {"interactive_cap": 1.0},
        "agent": {"interval_s": 1.0},
    }
    cfg = parse(settings)
    cfg.data_path.mkdir(parents=True)
    Store(cfg.database_url).upgrade()
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{cfg.data_path}"\n[slurm]\nconf = "{slurm_cluster.conf}"\n'
        '[scheduling]\npolicy = "vjob"\n[priority]\ninteractive_cap = 1.0\n'
    )
    idle = _idle(env)
    assert len(idle) >= 2, idle
    jobs: list[str] = []
    stop = threading.Event()
    loop = None
    try:
        a = _sbatch(env, "-N1", "--exclusive", "--wrap", "sleep 600")  # the batch vjob
        filler = _sbatch(env, f"-N{len(idle) - 1}", "--exclusive", "--wrap", "sleep 600")  # a plain job
        jobs += [a, filler]
        wait_for(
            lambda: _state(env, a).startswith("RUNNING") and _state(env, filler).startswith("RUNNING"),
            60,
            "the vjob and the filler running",
        )
        node_a = _run(env, "squeue", "-h", "-j", a, "-o", "%N").strip()
        filler_nodes = _run(env, "squeue", "-h", "-j", filler, "-o", "%N").strip()
        first_filler = _run(env, "scontrol", "show", "hostnames", filler_nodes).split()[0]
        pending = [_sbatch(env, "-N1", "-w", first_filler, "--wrap", "true") for _ in range(2)]  # wait for it
        jobs += pending
        pdir = PilotDir(pilot_root(cfg), "slurm", a)
        pdir.ensure()
        _pilot(pdir, a, node_a, PilotState.RUNNING)
        interactive = _srun(user_env, env, f"-N{len(idle) - 1}", "-w", filler_nodes)  # the filler's nodes only
        jobs.append(interactive)

        agent = Agent(cfg, slurm_adapter, rms="slurm")
        first = agent.tick()
        assert not first.errors, first.errors
        assert first.checkpointed == []  # the filler is no vjob: A alone frees too little
        assert interactive in first.decision.waits
        vjob_set = slurm_adapter.knob_values()
        assert all(vjob_set[j] > 0 for j in pending), vjob_set  # vjob's order on the pending jobs
        assert "[vjob: " in slurm_adapter.job_fields(interactive)["AdminComment"]

        memory = tmp_path / "mem.save"
        memory.write_bytes(b"\0" * 4096)
        _pilot(pdir, a, node_a, PilotState.SAVED, saved_node=node_a, saved_nodes=[node_a], memory_path=str(memory))
        act.finish_checkpoint(agent.ports, a)  # the agent's own ending of a checkpoint: requeuehold, Pn
        wait_for(lambda: "Held" in _state(env, a) or "held" in _state(env, a), 60, "A requeue-held")
        agent.ports.lease.give_up()  # the agent stops: nobody would ever release A

        res = _vjob(conf, "drain", "--rms", "slurm", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        done = json.loads(res.stdout)
        assert done["released"] == [a] and done["done_by"].startswith("vjob-drain@"), done
        assert done["priorities_reset"] >= 2 and interactive in done["notes_cleared"], done
        wait_for(lambda: _state(env, a).startswith("RUNNING"), 60, "A running again after the drain's release")
        after = slurm_adapter.knob_values()
        assert all(after[j] == 0 for j in pending), after  # Slurm's own site factor
        assert "[vjob: " not in slurm_adapter.job_fields(interactive).get("AdminComment", "")
        status = json.loads(_vjob(conf, "status", "--json").stdout)
        assert status["drained"] and status["drained"]["by"].endswith(os.uname().nodename), status["drained"]

        _pilot(pdir, a, node_a, PilotState.RUNNING, boots=1, restores=1)  # the pilot restored A
        second = _srun(user_env, env, "-N1")  # every node busy: undrained, the agent would checkpoint A
        jobs.append(second)
        metrics = AgentMetrics()
        restarted = Agent(cfg, slurm_adapter, rms="slurm", metrics=metrics)
        loop = threading.Thread(target=restarted.run, args=(stop,), daemon=True)
        loop.start()
        wait_for(lambda: (metrics.registry.get_sample_value("vjob_agent_ticks_total") or 0) >= 3, 120, "3 ticks")
        assert not pdir.request_file.exists(), "a drained agent asked for a checkpoint"
        assert (metrics.registry.get_sample_value("vjob_preemptions_total") or 0) == 0
        assert _state(env, a).startswith("RUNNING") and _state(env, second).startswith("PENDING")
        assert all(v == 0 for j, v in slurm_adapter.knob_values().items() if j in pending)
        for job in (interactive, second):
            assert "[vjob: " not in slurm_adapter.job_fields(job).get("AdminComment", "")

        refused = _vjob(conf, "uninstall", "--rms", "slurm", "--root", str(tmp_path / "root"))
        assert refused.returncode == 1 and f"vjobs still run: {a}" in refused.stderr, refused.stderr

        _run(env, "scancel", interactive, second)  # undrained, the agent would checkpoint A for them
        wait_for(lambda: _state(env, second) == "GONE", 60, "the sruns gone")
        res = _vjob(conf, "drain", "--undo", "--rms", "slurm")
        assert res.returncode == 0 and "undrained slurm" in res.stdout, res.stdout + res.stderr
        wait_for(
            lambda: all(slurm_adapter.knob_values().get(j, 0) > 0 for j in pending),
            60,
            "vjob's order back on the pending jobs",
        )
        assert json.loads(_vjob(conf, "status", "--json").stdout)["drained"] is None

        res = _vjob(conf, "drain", "--rms", "slurm", "--json")  # with an agent running: it does the pass
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(res.stdout)["done_by"] == restarted.ports.lease.owner
        assert all(v == 0 for j, v in slurm_adapter.knob_values().items() if j in pending)
    finally:
        stop.set()
        if loop is not None:
            loop.join(timeout=60)
        if jobs:
            _run(env, "scancel", *jobs, check=False)
        for proc in SRUNS:
            proc.kill()
            proc.wait(timeout=30)
        SRUNS.clear()
