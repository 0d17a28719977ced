"""An agent that dies in the middle of a pause-first checkpoint (docs/preempt-pause.md), and the
agent after it (agent.recover).

Agent A runs the real preemption path (planner, executor, journal, pilot files, lease rows on
SQLite) against a stand-in pilot that answers a pause checkpoint as pilot.pause_drain does and
an RMS that suspends as Slurm does (tests.stand_ins). A pauses the victim, suspends it in the
RMS (its CPUs go to the interactive job) and dies while the drainer saves: its lease is taken,
as when its host is gone. Agent B, holding the lease, recovers the switch:
- the drainer finished: the job, still suspended, is requeue-held and counted once (Pn = 1);
- it did not: the request is withdrawn and the job resumed in the RMS, so its pilot runs the VM
  again — a suspended job nobody resumes would hold its memory for ever.
And with "auto" on an RMS whose suspend would freeze the drainer, the agent checkpoints
save-first and never suspends.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from agent import act
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from preemption.scheduling.tick import Preemption
from tests.services import wait_for
from tests.stand_ins import SuspendingAdapter, answering_pilot, pausing_pilot
from vjob.config import parse
from vjob.errors import VjobError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store import journal, leases
from vjob.store.db import Store

JOB = "91"
INTERACTIVE = "92"
LEASE = "agent:slurm"


def _site(tmp_path: Path, spares: tuple[bool, str] = (True, "stand-in: proctrack/linuxproc")) -> dict[str, Any]:
    """The victim running on n1, the interactive job pending, the RMS, the store, the pilot's
    directory in state `running`, and agent A holding the lease."""
    now = time.time()
    victim = Job(
        JOB, "root", rms="slurm", memory_mb=1024, cores=4, state=JobState.RUNNING, allocated_nodes=("n1",),
        start_time=now - 60, submit_time=now - 120,
    )  # fmt: skip
    interactive = Job(INTERACTIVE, "root", job_class=JobClass.INTERACTIVE, rms="slurm", memory_mb=512, cores=4)
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"pilot_dir": str(tmp_path / "pilots"), "lease_s": 5, "checkpoint_timeout_s": 600},
        }
    )
    assert cfg.agent.pause_first == "auto"  # the default: on where the RMS's suspend spares the drainer
    Store(cfg.database_url).upgrade()
    rms = SuspendingAdapter((victim, interactive), spares=spares)
    agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics(), owner="A")  # type: ignore[arg-type]
    store = agent.ports.store()
    store_jobs.track(store, victim)
    st = PilotStatus(
        job_id=JOB, vm=f"vjob-slurm-{JOB}", node="n1", uri="qemu:///system", state=PilotState.RUNNING,
        since=now, memory_mb=1024, image="debian12",
    )  # fmt: skip
    pdir = PilotDir(agent.ports.root, "slurm", JOB)
    pdir.ensure()
    pdir.write_state(st)
    assert agent.ports.lease.hold()
    view = ClusterView(now=now, jobs=(victim, interactive), nodes=(Node("n1", 4, 8192),))
    obs = Observation(view=view, pilots={JOB: st}, sleeping={}, store_ok=True)
    return {"cfg": cfg, "rms": rms, "agent": agent, "store": store, "pdir": pdir, "obs": obs}


def _preempt(agent: Agent, obs: Observation) -> list[str]:
    pre = Preemption(job_id=INTERACTIVE, victims=(JOB,), nodes=("n1",), checkpoint_bytes=0.0)
    with agent.ports.lease.keeping():  # the tick's acting phase
        return act.preempt(agent.ports, pre, obs)


def _a_dies_after_the_suspend(site: dict[str, Any]) -> None:
    """Agent A checkpoints the victim pause-first; once the RMS has suspended it, A's lease is
    taken (its host gone, say) and B holds it. A stops at its next renewal, leaving the
    switch open with its action running, the job suspended and the request in place."""
    rms, store = site["rms"], site["store"]
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["done"] = _preempt(site["agent"], site["obs"])
        except VjobError as exc:
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: ("suspend", JOB) in rms.calls, 60, "agent A to suspend the paused victim")
    leases.release(store, LEASE, "A")
    assert leases.acquire(store, LEASE, "B", 60)
    t.join(timeout=60)
    assert not t.is_alive(), "agent A still waits for the save under B's lease"
    assert rms.calls == [("suspend", JOB)] and rms.table[JOB].state is JobState.SUSPENDED, rms.calls
    (sw,) = journal.open_switches(store, rms="slurm")
    assert [a.state for a in sw.actions] == ["running"]
    assert site["pdir"].read_request() is not None, "A withdrew the request: it was B's to finish or undo"


def _b_recovers(site: dict[str, Any]) -> journal.JournalSwitch:
    b = Agent(site["cfg"], site["rms"], rms="slurm", metrics=AgentMetrics(), owner="B")
    b.ports.store.opened = site["store"]
    assert b.ports.lease.hold()
    (sw,) = journal.open_switches(site["store"], rms="slurm")
    with b.ports.lease.keeping():
        assert b.recover() == [sw.id]
    return journal.load(site["store"], sw.id)


def test_a_victim_saved_while_no_agent_watched_is_requeue_held_once(tmp_path: Path) -> None:
    site = _site(tmp_path)
    pdir, rms = site["pdir"], site["rms"]
    drained = threading.Event()
    with pausing_pilot(pdir, drained.is_set, tmp_path / "memory.state") as done:
        _a_dies_after_the_suspend(site)
        drained.set()  # the drainer ends its save after A died
        wait_for(lambda: "saved" in done, 30, "the stand-in drainer's `saved`")
        sw = _b_recovers(site)
        time.sleep(0.3)  # the stand-in pilot would react to a withdrawal within 0.05 s
        assert done == ["saving", "saved"], "the saved VM was run again: the request was withdrawn"
    assert rms.calls == [("suspend", JOB), ("requeue_hold", JOB)]
    assert rms.table[JOB].state is JobState.HELD
    assert sw.state == "done" and [a.state for a in sw.actions] == ["done"]
    record = store_jobs.get(site["store"], "slurm", JOB)
    assert record is not None and record.preempt_count == 1


def test_a_victim_whose_save_did_not_finish_is_resumed_and_runs_again(tmp_path: Path) -> None:
    site = _site(tmp_path)
    pdir, rms = site["pdir"], site["rms"]
    with pausing_pilot(pdir, lambda: False, tmp_path / "memory.state") as done:
        _a_dies_after_the_suspend(site)
        sw = _b_recovers(site)
        wait_for(lambda: "running" in done, 30, "the stand-in pilot to run its VM again")
    assert done == ["saving", "running"]
    assert rms.calls == [("suspend", JOB), ("resume", JOB)] and rms.held == []
    assert rms.table[JOB].state is JobState.RUNNING  # its CPUs back, its memory never given away
    assert pdir.read_request() is None and pdir.read_state().state is PilotState.RUNNING
    assert sw.state == "rolled_back" and [a.state for a in sw.actions] == ["undone"]
    record = store_jobs.get(site["store"], "slurm", JOB)
    assert record is not None and record.preempt_count == 0


def test_auto_where_the_suspend_would_freeze_the_drainer_checkpoints_save_first(tmp_path: Path) -> None:
    """ProctrackType=proctrack/cgroup (plugins.slurm.proctrack says no): a plain checkpoint
    request, a save, the requeue-hold; the RMS never asked to suspend."""
    site = _site(tmp_path, spares=(False, "stand-in: proctrack/cgroup freezes the job whole"))
    pdir, rms = site["pdir"], site["rms"]
    with answering_pilot(pdir, lambda: True, tmp_path / "memory.state") as seen:
        assert _preempt(site["agent"], site["obs"]) == [JOB]
    assert len(seen) == 1 and rms.calls == [("requeue_hold", JOB)]
