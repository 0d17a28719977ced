"""Issue 39, item 6 everywhere: the remap step and recovery wait as the preemption switch does.

Before, the live switches of the control loop, the remap step and recovery waited a fixed
`checkpoint_timeout_s` for each pilot's answer (a big VM's suspend was withdrawn mid-save) and
their executors went on after the agent lost its lease (withdrawing, then journalling, under
the new holder). Here the real agent's paths (agent.remap_step's switch, agent.recover, the
executor, the journal, pilot files, lease rows) run on SQLite and PostgreSQL against a stand-in
pilot that answers when the test says. The control loop builds its performer and executor by
the same agent.pilot_performer.live_performer and lease check as the remap step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import remap_step
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pilot_performer import EXECUTOR_TAG
from preemption.planner.plan import Plan, PlanAction
from preemption.remap.live import Move, Placement
from tests.services import wait_for
from tests.stand_ins import answering_pilot
from vjob.config import parse
from vjob.errors import VjobError
from vjob.model import Action, ClusterView, Job, JobClass, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store import journal, leases
from vjob.store.db import Store

JOB = "78"
VM = f"vjob-slurm-{JOB}"


class _Adapter:
    """The RMS as recovery asks it: its jobs."""

    name = "slurm"

    def __init__(self, jobs: tuple[Job, ...]) -> None:
        self._jobs = jobs

    def jobs(self) -> list[Job]:
        return list(self._jobs)


def _setup(store: Store, tmp_path: Path, memory_mb: int, **agent_cfg: Any) -> tuple[Agent, Observation, PilotDir]:
    job = Job(
        id=JOB,
        user="root",
        job_class=JobClass.BATCH,
        rms="slurm",
        memory_mb=memory_mb,
        state=JobState.RUNNING,
        allocated_nodes=("n1",),
        start_time=time.time() - 60,
        submit_time=time.time() - 120,
    )
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"pilot_dir": str(tmp_path / "pilots"), **agent_cfg}})
    agent = Agent(cfg, _Adapter((job,)), rms="slurm", metrics=AgentMetrics(), owner="A")  # type: ignore[arg-type]
    agent.ports.store.opened = store
    view = ClusterView(now=time.time(), jobs=(job,), nodes=(Node("n1", 64, 1 << 20), Node("n2", 64, 1 << 20)))
    st = PilotStatus(
        job_id=JOB,
        vm=VM,
        node="n1",
        uri="qemu:///system",
        state=PilotState.RUNNING,
        since=time.time(),
        memory_mb=memory_mb,
        image="debian12",
    )
    store_jobs.track(store, job)
    pdir = PilotDir(agent.ports.root, "slurm", JOB)
    pdir.ensure()
    pdir.write_state(st)
    assert agent.ports.lease.hold()
    return agent, Observation(view=view, pilots={JOB: st}, sleeping={}, store_ok=True), pdir


def _pilot(pdir: PilotDir, answer_when: Callable[[], bool]) -> contextlib.AbstractContextManager[list[str]]:
    """The stand-in pilot (tests.stand_ins), its saved state beside the pilot directories."""
    return answering_pilot(pdir, answer_when, pdir.path.parent / "memory.state")


def _migrate(agent: Agent, obs: Observation) -> Any:
    with agent.ports.lease.keeping():
        placed = Placement(JOB, ((VM, "n1"),), ("n1",), memory_mb=obs.pilots[JOB].memory_mb)
        return remap_step._migrate(agent.ports, obs, [Move(JOB, VM, "n1", "n2", "home")], [placed])


def _open_live_suspend(store: Store) -> int:
    """A live suspend a killed agent left running (the control loop's, journalled with EXECUTOR_TAG)."""
    action = PlanAction(Action.SUSPEND, VM, JOB, "n1", None)
    plan = Plan(pools=((action,),), placement={}, cost=1, optimizer="test")
    planned = [journal.PlannedAction(0, "suspend", VM, f"slurm:{JOB}", "n1", None)]
    switch, ids = journal.open_switch(store, "consolidation", plan.to_dict() | {"executor": EXECUTOR_TAG}, planned)
    journal.set_action(store, ids[0], "running")
    return switch


def test_a_remap_migration_of_a_big_vm_waits_as_long_as_its_memory_needs(store: Store, tmp_path: Path) -> None:
    """A floor of 1 s gave up on this 8 GiB VM's migration (it ends after 3 s); the floor plus
    30 s per GiB, the preemption switch's rule, waits for it."""
    agent, obs, pdir = _setup(store, tmp_path, 8 * 1024, checkpoint_timeout_s=1, checkpoint_timeout_per_gib_s=30)
    t0 = time.monotonic()
    with _pilot(pdir, lambda: time.monotonic() - t0 > 3):
        report = _migrate(agent, obs)
    assert report.state == "done", report.summary()
    assert pdir.read_state().node == "n2"


def test_recovery_of_a_big_vm_suspend_waits_as_long_as_its_memory_needs(store: Store, tmp_path: Path) -> None:
    agent, _obs, pdir = _setup(store, tmp_path, 8 * 1024, checkpoint_timeout_s=1, checkpoint_timeout_per_gib_s=30)
    switch = _open_live_suspend(store)
    t0 = time.monotonic()
    with agent.ports.lease.keeping(), _pilot(pdir, lambda: time.monotonic() - t0 > 3):
        assert agent.recover() == [switch]
    (sw,) = journal.recent(store, limit=1)
    assert sw.state == "done" and [a.state for a in sw.actions] == ["done"]


def _lose_lease_while(store: Store, pdir: PilotDir, acting: Callable[[], Any]) -> dict[str, Any]:
    """Run `acting` under A's lease until the pilot sees its request, then let B take the
    lease; A must stop waiting (within its keeper's next renewal, far below the 600 s timeout)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["out"] = acting()
        except VjobError as exc:  # the test reports what A did
            result["error"] = exc

    with _pilot(pdir, lambda: False) as seen:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        wait_for(lambda: bool(seen), 60, "the pilot request")
        leases.release(store, "agent:slurm", "A")  # it ran out while A was cut off
        assert leases.acquire(store, "agent:slurm", "B", 60)
        t.join(timeout=120)
        assert not t.is_alive(), "A still waits for its pilot under B's lease"
    assert pdir.read_request() is not None, "A withdrew the request: it was B's to finish or undo"
    return result


def test_a_remap_step_that_loses_the_lease_stops_and_leaves_the_switch(store: Store, tmp_path: Path) -> None:
    agent, obs, pdir = _setup(store, tmp_path, 1024, lease_s=5, checkpoint_timeout_s=600)
    result = _lose_lease_while(store, pdir, lambda: _migrate(agent, obs))
    assert result["out"].state == "abandoned", result
    (sw,) = journal.open_switches(store, rms="slurm")
    assert [a.state for a in sw.actions] == ["running"], "A wrote to the journal after losing the lease"


def test_a_recovery_that_loses_the_lease_stops_and_leaves_the_switch(store: Store, tmp_path: Path) -> None:
    agent, _obs, pdir = _setup(store, tmp_path, 1024, lease_s=5, checkpoint_timeout_s=600)
    switch = _open_live_suspend(store)

    def recovering() -> list[int]:
        with agent.ports.lease.keeping():
            return agent.recover()

    _lose_lease_while(store, pdir, recovering)
    (sw,) = journal.open_switches(store, rms="slurm")
    assert sw.id == switch and [a.state for a in sw.actions] == ["running"]
