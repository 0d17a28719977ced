"""The agent's lease while a switch waits for a save (issue 39, item 6), on SQLite and PostgreSQL.

A save takes about 5 s per GiB: a big victim outlasts the lease (30 s) and the old fixed 120 s
timeout. Before, the lease was not renewed while the switch waited: a standby took it
mid-switch, rolled the switch back and withdrew the live request; and a VM over ~23 GiB was
withdrawn mid-save. Here the real agent's switch path (planner, executor, journal, pilot files,
lease rows) runs against a stand-in pilot that saves when the test says.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent import act
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pilot_performer import checkpoint_timeout_for
from preemption.scheduling.tick import Preemption
from tests.services import wait_for
from tests.stand_ins import HoldingAdapter, answering_pilot
from vjob.config import parse
from vjob.errors import ConfigError, VjobError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store import journal, leases
from vjob.store.db import Store

JOB = "77"


def _agent(store: Store, tmp_path: Path, **agent_cfg: Any) -> tuple[Agent, HoldingAdapter]:
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"pilot_dir": str(tmp_path / "pilots"), **agent_cfg}})
    adapter = HoldingAdapter()
    agent = Agent(cfg, adapter, rms="slurm", metrics=AgentMetrics(), owner="A")  # type: ignore[arg-type]
    agent.ports.store.opened = store
    return agent, adapter


def _observation(memory_mb: int) -> tuple[Observation, PilotStatus]:
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
    view = ClusterView(now=time.time(), jobs=(job,), nodes=(Node("n1", 64, 1 << 20),))
    st = PilotStatus(
        job_id=JOB,
        vm=f"vjob-slurm-{JOB}",
        node="n1",
        uri="qemu:///system",
        state=PilotState.RUNNING,
        since=time.time(),
        memory_mb=memory_mb,
        image="debian12",
    )
    return Observation(view=view, pilots={JOB: st}, sleeping={}, store_ok=True), st


def _pilot(
    pdir: PilotDir, st: PilotStatus, tmp_path: Path, save_when: Callable[[], bool]
) -> contextlib.AbstractContextManager[list[str]]:
    """The stand-in pilot (tests.stand_ins) in state `st`: it answers the agent's checkpoint
    request with a save once `save_when()` holds; yields the request ids it saw."""
    pdir.write_state(st)
    return answering_pilot(pdir, save_when, tmp_path / "memory.state")


def _ready(store: Store, agent: Agent, obs: Observation, st: PilotStatus, tmp_path: Path) -> PilotDir:
    store_jobs.track(store, obs.view.jobs[0])
    pdir = PilotDir(agent.ports.root, "slurm", JOB)
    pdir.ensure()
    assert agent.ports.lease.hold()
    return pdir


def _preempt(agent: Agent, obs: Observation) -> list[str]:
    pre = Preemption(job_id="interactive", victims=(JOB,), nodes=("n1",), checkpoint_bytes=0.0)
    with agent.ports.lease.keeping():  # the tick's acting phase
        return act.preempt(agent.ports, pre, obs)


def test_a_switch_longer_than_the_lease_keeps_it_and_a_standby_stays_out(store: Store, tmp_path: Path) -> None:
    """The save comes after 3 lease times; a standby tries all along and never gets in."""
    agent, adapter = _agent(store, tmp_path, lease_s=5, checkpoint_timeout_s=120)
    obs, st = _observation(1024)
    pdir = _ready(store, agent, obs, st, tmp_path)
    standby_won: list[float] = []
    stop = threading.Event()

    def standby() -> None:
        while not stop.wait(0.25):
            if leases.acquire(store, "agent:slurm", "B", 5):
                standby_won.append(time.time())
                return

    t0 = time.monotonic()
    with _pilot(pdir, st, tmp_path, lambda: time.monotonic() - t0 > 15 or bool(standby_won)) as seen:
        b = threading.Thread(target=standby, daemon=True)
        b.start()
        try:
            done = _preempt(agent, obs)
        finally:
            stop.set()
            b.join(timeout=10)
    assert standby_won == [], "the standby took the lease while the switch waited for the save"
    assert done == [JOB] and adapter.held == [JOB] and len(seen) == 1
    assert leases.holder(store, "agent:slurm") == "A"
    (last,) = journal.recent(store, limit=1)
    assert last.state == "done"


def test_an_agent_that_loses_the_lease_mid_switch_stops_and_leaves_it_to_the_holder(
    store: Store, tmp_path: Path
) -> None:
    """Another agent takes the lease (say A's store link was cut past its expiry): A stops
    waiting at once, withdraws nothing, requeue-holds nothing and leaves the journal as it is,
    for the new holder's recovery. Before, A waited on for its whole checkpoint timeout, then
    withdrew the request and journalled the switch failed under the new holder."""
    agent, adapter = _agent(store, tmp_path, lease_s=5, checkpoint_timeout_s=600)
    obs, st = _observation(1024)
    pdir = _ready(store, agent, obs, st, tmp_path)
    result: dict[str, Any] = {}

    def a_switch() -> None:
        try:
            result["done"] = _preempt(agent, obs)
        except VjobError as exc:
            result["error"] = str(exc)

    with _pilot(pdir, st, tmp_path, lambda: False) as seen:
        t = threading.Thread(target=a_switch, daemon=True)
        t.start()
        wait_for(lambda: bool(seen), 60, "the checkpoint request")
        leases.release(store, "agent:slurm", "A")  # taken from under A: it ran out while A was cut off
        assert leases.acquire(store, "agent:slurm", "B", 60)
        t.join(timeout=120)  # A's keeper notices at its next renewal (5/3 s)
        assert not t.is_alive(), "A still waits for a save under B's lease"
    assert result.get("done", []) == [] and adapter.held == []
    assert pdir.read_request() is not None, "A withdrew the request: it was B's to finish or undo"
    (sw,) = journal.open_switches(store, rms="slurm")
    assert [a.state for a in sw.actions] == ["running"], "A wrote to the journal after losing the lease"
    assert agent.metrics.errors.labels(kind="lease")._value.get() == 1
    assert leases.holder(store, "agent:slurm") == "B"


def test_a_big_vm_gets_a_checkpoint_timeout_that_scales_with_its_memory(store: Store, tmp_path: Path) -> None:
    """A floor of 1 s would withdraw this 8 GiB VM's save (it comes after 3 s); the floor plus
    30 s per GiB (241 s) waits for it."""
    agent, adapter = _agent(store, tmp_path, checkpoint_timeout_s=1, checkpoint_timeout_per_gib_s=30)
    obs, st = _observation(8 * 1024)
    pdir = _ready(store, agent, obs, st, tmp_path)
    t0 = time.monotonic()
    with _pilot(pdir, st, tmp_path, lambda: time.monotonic() - t0 > 3):
        done = _preempt(agent, obs)
    assert done == [JOB] and adapter.held == [JOB]


def test_the_checkpoint_timeout_keys() -> None:
    agent_cfg = parse({"agent": {"checkpoint_timeout_s": 60, "checkpoint_timeout_per_gib_s": 5}}).agent
    assert agent_cfg.checkpoint_timeout_for(0) == 60
    assert agent_cfg.checkpoint_timeout_for(23 * 1024) == 60 + 5 * 23
    assert agent_cfg.checkpoint_timeout_for(10**9) == agent_cfg.checkpoint_timeout_max_s  # capped
    with pytest.raises(ConfigError, match="checkpoint_timeout_max_s = 30 is below checkpoint_timeout_s = 60"):
        parse({"agent": {"checkpoint_timeout_s": 60, "checkpoint_timeout_max_s": 30}})
    with pytest.raises(ConfigError, match="checkpoint_timeout_per_gib_s"):
        parse({"agent": {"checkpoint_timeout_per_gib_s": -1}})


def test_a_claimed_memory_cannot_stretch_the_wait_past_the_allocation(store: Store, tmp_path: Path) -> None:
    agent, _ = _agent(store, tmp_path, checkpoint_timeout_s=10, checkpoint_timeout_per_gib_s=10)
    obs, _st = _observation(2048)
    obs.pilots[JOB] = obs.pilots[JOB].moved(PilotState.RUNNING, memory_mb=1 << 22)  # the user's 4 TiB claim
    assert checkpoint_timeout_for(agent.cfg, obs, JOB) == 10 + 10 * 2
