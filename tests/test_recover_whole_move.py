"""An agent killed in the middle of a whole move: its successor's recovery finishes the move.

A vjob of several VMs moves whole by one cut (agent.remap_whole): a `suspend` of all its VMs in
the first pool, one `resume` naming each VM's new node in the second. The journal holds that
resume as the first VM's action alone; the other VMs' nodes are in the plan's placement. The
recovery repeated the journalled resume as it stands, naming one node: the pilot refused it (a
multi-node job does not move VM by VM) and the job, saved on disk, slept on until some later
decision woke it. Now the recovery asks for the whole move (journalled_moves) and records every
VM where it went, as the remap step would have.

The pilot is the real one (`vjob run --nodes node1,node2`, leader mode) over libvirt's test
driver with four nodes (tests/test_remap_whole_pilot.py's fixture); the agent is killed between
the pools (its resume journalled running, its request never written) or just after the pilot
answered the resume (not journalled done).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.remap_whole import executor_for
from preemption.executor import Abandoned
from preemption.planner.plan import PlanAction
from preemption.remap.live import Move, Placement, switch_plan
from provisioning.driver import Driver
from tests.services import wait_for
from tests.test_remap_whole_pilot import ALL, JOB, VMS, _running
from tests.test_remap_whole_pilot import pilot as pilot
from vjob.config import parse
from vjob.model import Action, ClusterView, Job, JobState, Node
from vjob.pilot_files import PilotDir, PilotState
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt
HOME = ("node1", "node2")
AWAY = ("node3", "node4")


class _Jobs:
    """The RMS as the recovery asks it: the job, running on its allocation."""

    name = "slurm"

    def jobs(self) -> list[Job]:
        return [Job(JOB, "root", rms="slurm", state=JobState.RUNNING, nodes=2, allocated_nodes=HOME)]


class _Killed:
    """The whole move's performer, the agent killed at the resume: before it wrote the request
    (`after_answer` False), or once the pilot answered it (the journal never hears)."""

    def __init__(self, inner: object, after_answer: bool) -> None:
        self.inner, self.after_answer = inner, after_answer
        self.dead = threading.Event()

    def perform(self, action: PlanAction, key: str) -> None:
        if action.kind is Action.RESUME:
            if self.after_answer:
                self.inner.perform(action, key)  # type: ignore[attr-defined]
            self.dead.set()
            raise Abandoned("the agent was killed")
        self.inner.perform(action, key)  # type: ignore[attr-defined]


def _agent(tmp: Path, store: Store, owner: str) -> Agent:
    cfg = parse({"data_dir": str(tmp / "data"), "agent": {"checkpoint_timeout_s": 60}})
    agent = Agent(cfg, _Jobs(), rms="slurm", metrics=AgentMetrics(), owner=owner)  # type: ignore[arg-type]
    agent.ports.store.opened = store
    return agent


def _killed_mid_move(
    tmp: Path, store: Store, pdir: PilotDir, src: tuple[str, ...], dst: tuple[str, ...], *, after_answer: bool
) -> int:
    """Agent A moves the job whole from `src` to `dst` and dies at the resume; returns the
    switch it left open."""
    a = _agent(tmp, store, "A")
    assert a.ports.lease.hold()
    st = pdir.read_state()
    assert st is not None and st.member_nodes == list(src)
    job = _Jobs().jobs()[0]
    view = ClusterView(now=time.time(), jobs=(job,), nodes=tuple(Node(n, 1, 1024) for n in ALL))
    obs = Observation(view=view, pilots={JOB: st}, sleeping={}, store_ok=True)
    moves = [Move(JOB, vm, s, d, "test") for vm, s, d in zip(VMS, src, dst, strict=True)]
    plan = switch_plan(moves, [Placement(JOB, tuple(zip(VMS, src, strict=True)), HOME, 128)])
    members = {JOB: tuple(zip(VMS, src, strict=True))}
    executor, requests = executor_for(a.ports, obs, "remap", plan, members, movable={JOB})
    killed = _Killed(executor.performer, after_answer)
    executor.performer = killed
    executor.still_ours = lambda: not killed.dead.is_set()
    report = executor.execute(requests, reason="remap: test")
    assert report.state == "abandoned", report
    (sw,) = journal.open_switches(store, rms="slurm")
    assert [(x.action, x.state) for x in sw.actions] == [("suspend", "done"), ("resume", "running")]
    a.ports.lease.give_up()
    a.close()
    return sw.id


def _recovered(tmp: Path, store: Store, pdir: PilotDir, switch: int, nodes: tuple[str, ...]) -> None:
    """Agent B takes the lease: its recovery ends the switch done, the job running on `nodes`
    and recorded there."""
    with _agent(tmp, store, "B") as b:
        assert b.ports.lease.hold()
        assert b.recover() == [switch]
        sw = journal.load(store, switch)
        assert sw.state == "done" and [x.state for x in sw.actions] == ["done", "done"], sw
        st = pdir.read_state()
        assert st is not None and not st.request_error, st
        assert (st.state, st.node, st.member_nodes) == (PilotState.RUNNING, nodes[0], list(nodes))
        recorded = sorted((v.name, v.node) for v in store_vms.of_job(store, "slurm", JOB))
        assert recorded == list(zip(VMS, nodes, strict=True))  # root's record: the next looks believe them
        assert b.ports.recorded_vms[JOB] == (",".join(nodes), st.image)
        b.ports.lease.give_up()


def test_the_next_agent_finishes_a_whole_move_its_predecessor_died_in(
    pilot: tuple[subprocess.Popen[str], PilotDir, Driver, Path],
) -> None:
    """Away, A killed before the resume's request: the job asleep on its own nodes until B's
    recovery moves it. Home again, A killed once the pilot answered: B's recovery asks nothing
    twice, ends the switch and records the VMs home."""
    proc, pdir, _paths, tmp = pilot
    wait_for(lambda: pdir.exists() and _running(pdir), 60, "pilot running")
    store = Store(f"sqlite:///{tmp / 'vjob.sqlite'}")
    store.upgrade()
    switch = _killed_mid_move(tmp, store, pdir, HOME, AWAY, after_answer=False)
    left = pdir.read_state()
    assert left is not None and (left.state, left.member_nodes) == (PilotState.SAVED, list(HOME))  # the bug's end
    _recovered(tmp, store, pdir, switch, AWAY)

    switch = _killed_mid_move(tmp, store, pdir, AWAY, HOME, after_answer=True)
    left = pdir.read_state()
    assert left is not None and (left.state, left.member_nodes) == (PilotState.RUNNING, list(HOME))
    _recovered(tmp, store, pdir, switch, HOME)
    assert proc.poll() is None  # the pilot watches its job
    store.close()
