"""The agent ticking over a real OAR 2.5.9 (issue: `vjob agent --rms oar` aborted every tick
that saw a pending job, because OAR has no per-job priority and the agent asked for one).

Now the OAR adapter declares its abilities (no priority knob, no requeue of a running job,
hold/release through the commands), and the agent plans with them: a tick over pending, held
and running jobs acts on what OAR can do — here it releases a checkpointed vjob — and asks
for nothing OAR cannot do.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from plugins.oar.adapter import OarAdapter
from plugins.oar.client import OarCommands, SubmitRequest
from vjob.config import parse
from vjob.model import Job, JobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store.db import Store

pytestmark = pytest.mark.oar


def _state(cli: OarCommands, job_id: str, user: str) -> str:
    job = cli.job(job_id, user=user)
    return job.state if job is not None else "gone"


def _wait(cli: OarCommands, job_id: str, user: str, states: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = _state(cli, job_id, user)
        if state in states:
            return state
        time.sleep(0.5)
    raise AssertionError(f"OAR job {job_id}: {state!r}, not in {states} after {timeout} s")


def test_an_agent_tick_over_oar_acts_on_pending_held_and_running_jobs(oar_cluster, tmp_path: Path) -> None:
    user = oar_cluster.user
    cli = OarCommands(timeout_s=30)
    site_b = oar_cluster.properties("b")
    big = cli.submit(
        SubmitRequest(command=["sleep", "300"], resource="/resource_id=2", walltime="0:10:00", properties=site_b),
        user=user,
    )
    victim = small = ""
    try:
        _wait(cli, big, user, {"Running"})
        # Two jobs wait behind it: one plain pending job, one vjob vjob has checkpointed and holds.
        small = cli.submit(SubmitRequest(command=["sleep", "1"], walltime="0:05:00", properties=site_b), user=user)
        victim = cli.submit(SubmitRequest(command=["sleep", "1"], walltime="0:05:00", properties=site_b), user=user)
        _wait(cli, small, user, {"Waiting"})
        _wait(cli, victim, user, {"Waiting"})
        cli.hold(victim)
        _wait(cli, victim, user, {"Hold"})

        cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"rms": "oar"}})
        store = Store(cfg.database_url)
        store.upgrade()
        held = Job(id=victim, user=user, rms="oar", submit_time=time.time(), state=JobState.HELD)
        store_jobs.track(store, held)
        store_jobs.record_preemption(store, "oar", victim, at=time.time() - 60)
        pdir = PilotDir(cfg.data_path / "pilots", "oar", victim)
        pdir.ensure()
        pdir.write_state(
            PilotStatus(
                job_id=victim,
                vm=pdir.vm,
                node="127.0.0.1",
                uri="qemu:///system",
                state=PilotState.SAVED,
                since=time.time() - 60,
                saved_nodes=["127.0.0.1"],
            )
        )

        adapter = OarAdapter(cli)
        assert adapter.abilities.priority is None and not adapter.abilities.requeue_hold
        agent = Agent(cfg, adapter, rms="oar", metrics=AgentMetrics())
        report = agent.tick()

        assert report.errors == [], report.errors
        assert report.active and report.store_ok
        assert report.decision is not None
        assert {small, victim} <= set(report.decision.priorities), "pending and held jobs are ranked"
        assert report.decision.rms_priorities == {}, "OAR has no priority knob: nothing is sent"
        assert report.released == [victim]
        assert _wait(cli, victim, user, {"Waiting", "toLaunch", "Launching", "Running", "Terminated"}) != "Hold"
        errors = agent.metrics.registry.get_sample_value("vjob_agent_errors_total", {"kind": "rms"})
        assert not errors
    finally:
        for job_id in (big, small, victim):
            if job_id and _state(cli, job_id, user) not in ("Terminated", "Error", "gone"):
                cli.delete(job_id, user=user)
