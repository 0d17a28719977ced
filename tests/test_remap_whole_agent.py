"""The agent's remapping acts on multi-VM vjobs whole: one suspend and one resume per job.

The real remap step (agent.remap_step: sampling, the policy, the arbiter's claims, the switch
plan, agent.pilot_coalesce, the executor, the journal, the store) against stand-in pilots that
answer a whole job's requests as the real multi-node pilot does (tests/test_remap_whole_pilot.py
runs that pilot: its one cut, its resume naming a node per VM, its rollback):
- two root jobs of two VMs, j busy on the slow kind and k idle on the fast one, swap whole:
  each pilot gets one `suspend` and one `resume` whose `nodes` name each of its VMs' new
  nodes; the journal holds one action per job and pool; the store records every VM on its new
  node; the next look believes the VMs off their allocations from that record; when k ends
  (saved on SIGTERM, its pilot holding), j goes home whole and k's pilot is released;
- an ordinary user's two-VM job (per-node pilots) is left alone with the reason;
- k's resume fails and its pilot rolls k back where it slept: the switch fails, no VM of k is
  recorded elsewhere, and j — now on k's nodes that k runs on — is sent home whole next look;
- the control loop marks a movable multi-VM vjob `whole` (its VMs unpinned), a user's pinned,
  and relieves an overloaded node by moving the whole vjob by one cut through its pilot.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from agent.consolidate import ControlState, observed_vms
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.remap_step import RemapState, summary
from provisioning.profiling import DomainSample
from tests.agent_steps import control_step, remap_look
from tests.services import wait_for
from vjob.config import Config, parse
from vjob.model import ClusterView, Job, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store

FARM = """
[[subcluster]]
name = "slow"
nodes = 4
cores_per_node = 1
memory_mb_per_node = 4096
freq_ghz = 1.0
cycles = { cycles = 1.0 }
[[subcluster]]
name = "fast"
nodes = 2
cores_per_node = 1
memory_mb_per_node = 4096
freq_ghz = 3.0
cycles = { cycles = 1.0 }
"""
NODES = tuple(Node(n, 1, 4096, features=("slow",)) for n in ("s1", "s2", "s3", "s4")) + tuple(
    Node(n, 1, 4096, features=("fast",)) for n in ("f1", "f2")
)
HOME = {"21": ("s1", "s2"), "22": ("f1", "f2"), "23": ("s3", "s4")}
USER = {"21": "root", "22": "root", "23": "alice"}
BUSY = {"21": 1.0, "22": 0.0, "23": 1.0}
SUSPENDS = [("suspend", "vjob-slurm-21-0", "s1", "done"), ("suspend", "vjob-slurm-22-0", "f1", "done")]
RESUMES = [("resume", "vjob-slurm-21-0", "s1", "done"), ("resume", "vjob-slurm-22-0", "f1", "done")]


class _NoRMS:
    name = "slurm"

    def __getattr__(self, name: str):
        raise AssertionError(f"the remapping step called the adapter's {name}")


def _cfg(tmp: Path) -> Config:
    (tmp / "farm.toml").write_text(FARM)
    return parse(
        {
            "data_dir": str(tmp / "data"),
            "agent": {"pilot_dir": str(tmp / "pilots"), "checkpoint_timeout_s": 30},
            "remap": {"farm_file": str(tmp / "farm.toml"), "tau_s": 50, "beta": 20, "threshold_s": 10},
        }
    )


def _job(job: str) -> Job:
    return Job(
        job, USER[job], rms="slurm", state=JobState.RUNNING, nodes=2, allocated_nodes=HOME[job], start_time=time.time()
    )


def _status(job: str) -> PilotStatus:
    return PilotStatus(
        job_id=job,
        vm=f"vjob-slurm-{job}-0",
        node=HOME[job][0],
        uri="test:///default",
        state=PilotState.RUNNING,
        since=time.time(),
        memory_mb=256,
        member_nodes=list(HOME[job]),
    )


class _StandIn:
    """A multi-node pilot as the agent sees it: `suspend` saves every VM where it runs (SAVED,
    `member_nodes` unchanged); `resume` puts VM `rank` on `nodes[rank]` — or, when told to
    fail, rolls back as the real pilot does (RUNNING where it slept, the request refused)."""

    def __init__(self, pdir: PilotDir, memory: Path) -> None:
        self.pdir, self.memory = pdir, memory
        self.fail_resume = False
        self.seen: list[tuple[str, str, tuple[str, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            req, st = self.pdir.read_request(), self.pdir.read_state()
            if req is None or st is None or req.request_id == st.request_id:
                continue
            self.seen.append((req.kind.value, req.node, req.nodes))
            if req.kind is RequestKind.SUSPEND:
                self.memory.write_bytes(b"saved")
                st = st.moved(PilotState.SAVED, request_id=req.request_id, memory_path=str(self.memory))
            elif req.kind is RequestKind.RESUME and self.fail_resume:
                error = f"VM {st.vm}: rolled back, every VM running where it slept: restore failed"
                st = st.moved(PilotState.RUNNING, request_id=req.request_id, request_error=error, memory_path="")
            elif req.kind is RequestKind.RESUME:
                nodes = list(req.nodes)
                st = st.moved(PilotState.RUNNING, request_id=req.request_id, node=nodes[0], member_nodes=nodes)
                st = st.moved(PilotState.RUNNING, memory_path="", request_error="")
            elif req.kind is RequestKind.RELEASE:  # the job ended: the pilot lets the RMS end it
                st = st.moved(st.state, request_id=req.request_id, request_error="")
            else:
                st = st.moved(st.state, request_id=req.request_id, request_error=f"{req.kind.value}: not here")
            self.pdir.write_state(st)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class _Hypervisor:
    """libvirt's readings of each VM: CPU time at its job's share, one window per node sample."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, node: str, vms: Sequence[str]) -> Mapping[str, DomainSample]:
        t = 50.0 * self.calls.get(node, 0)
        self.calls[node] = self.calls.get(node, 0) + 1
        share = {vm: BUSY[vm.split("-")[2]] for vm in vms}
        return {vm: DomainSample(vm, t, int(share[vm] * t * 1e9), 1, memory_kib=256 * 1024) for vm in vms}


@pytest.fixture
def site(tmp_path: Path, store: Store) -> Iterator[tuple[Agent, dict[str, _StandIn]]]:
    cfg = _cfg(tmp_path)
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    assert agent.ports.lease.hold()
    pilots: dict[str, _StandIn] = {}
    for job in HOME:
        pdir = PilotDir(agent.ports.root, "slurm", job)
        pdir.ensure()
        pdir.write_state(_status(job))
        pilots[job] = _StandIn(pdir, tmp_path / f"memory-{job}")
    yield agent, pilots
    for p in pilots.values():
        p.stop()


def _obs(agent: Agent) -> Observation:
    jobs = tuple(_job(j) for j in HOME)
    states = {j: PilotDir(agent.ports.root, "slurm", j).read_state() for j in HOME}
    return Observation(ClusterView(now=time.time(), nodes=NODES, jobs=jobs), states, {}, True)  # type: ignore[arg-type]


def _profiled(agent: Agent, state: RemapState) -> None:
    """Two looks τ apart: every VM has a window (the first look only samples)."""
    assert remap_look(agent.ports, _obs(agent), state) is None
    state.last_profile -= 50


def test_two_vm_jobs_swap_whole_through_one_suspend_and_one_resume_each(
    site: tuple[Agent, dict[str, _StandIn]], store: Store
) -> None:
    agent, pilots = site
    state = RemapState(sampler=_Hypervisor())
    _profiled(agent, state)
    report = remap_look(agent.ports, _obs(agent), state)
    assert report is not None and report.state == "done", report
    (d,) = summary(state)["decisions"]
    assert (d["kind"], set(d["jobs"])) == ("swap", {"21", "22"})  # 23, busy on the slow kind too, is left alone
    assert "per-node pilots (an ordinary user's job)" in summary(state)["skipped"]["23"]
    assert pilots["23"].seen == []
    # One suspend and one resume per job, the resume naming each VM's new node in rank order.
    assert pilots["21"].seen == [("suspend", "", ("s1", "s2")), ("resume", "f1", ("f1", "f2"))]
    assert pilots["22"].seen == [("suspend", "", ("f1", "f2")), ("resume", "s1", ("s1", "s2"))]
    sw = journal.load(store, report.switch_id)
    assert [(a.action, a.vm_name, a.source, a.state) for a in sw.actions] in (
        [*suspends, *resumes] for suspends in (SUSPENDS, SUSPENDS[::-1]) for resumes in (RESUMES, RESUMES[::-1])
    )
    assert [(a["vm"], a["on"]) for pool in sw.plan["pools"][1:] for a in pool] in (
        [("vjob-slurm-21-0", "f1"), ("vjob-slurm-22-0", "s1")],
        [("vjob-slurm-22-0", "s1"), ("vjob-slurm-21-0", "f1")],
    )
    recorded = {j: sorted((v.name, v.node) for v in store_vms.of_job(store, "slurm", j)) for j in ("21", "22")}
    assert recorded == {
        "21": [("vjob-slurm-21-0", "f1"), ("vjob-slurm-21-1", "f2")],
        "22": [("vjob-slurm-22-0", "s1"), ("vjob-slurm-22-1", "s2")],
    }
    # The next look believes the VMs off their allocations (root recorded them) and, within τ
    # and with both jobs away on each other's nodes (each lends its own), moves nothing.
    assert remap_look(agent.ports, _obs(agent), state) is None
    assert set(summary(state)["skipped"]) == {"23"}

    # k ends (the RMS's SIGTERM): its pilot saves its VMs where they are (s1, s2, j's nodes) and
    # holds f1, f2. j, on k's nodes no running job lends any more, goes home whole; then k's
    # pilot is released (nothing foreign on its nodes).
    pdir = PilotDir(agent.ports.root, "slurm", "22")
    ended = pdir.read_state()
    assert ended is not None
    pdir.write_state(ended.moved(PilotState.SAVED, request_id="", memory_path=str(pilots["22"].memory)))
    home = remap_look(agent.ports, _obs(agent), state)
    assert home is not None and home.state == "done", home
    assert [(m["vm"], m["dst"], m["why"]) for m in summary(state)["moves"]] == [
        ("vjob-slurm-21-0", "s1", "home"),
        ("vjob-slurm-21-1", "s2", "home"),
    ]
    assert pilots["21"].seen[-2:] == [("suspend", "", ("f1", "f2")), ("resume", "s1", ("s1", "s2"))]
    assert state.released == ["22"]
    wait_for(lambda: pilots["22"].seen[-1] == ("release", "", ()), 10, "k's pilot released")


def test_a_failed_resume_leaves_no_vm_half_moved_and_the_other_job_goes_home_whole(
    site: tuple[Agent, dict[str, _StandIn]], store: Store
) -> None:
    agent, pilots = site
    pilots["22"].fail_resume = True
    state = RemapState(sampler=_Hypervisor())
    _profiled(agent, state)
    report = remap_look(agent.ports, _obs(agent), state)
    assert report is not None and report.state == "failed", report
    assert [a.vjob for a, _err in report.failed] == ["22"] and "rolled back" in report.failed[0][1]
    assert {v.node for v in store_vms.of_job(store, "slurm", "22")} <= {"f1", "f2"}  # nothing of k elsewhere
    k = PilotDir(agent.ports.root, "slurm", "22").read_state()
    assert k is not None and (k.state, k.member_nodes) == (PilotState.RUNNING, ["f1", "f2"])
    assert sorted((v.name, v.node) for v in store_vms.of_job(store, "slurm", "21")) == [
        ("vjob-slurm-21-0", "f1"),
        ("vjob-slurm-21-1", "f2"),
    ]
    # j sits on k's nodes, which k runs on at home (not lent): j goes home whole at the next look.
    home = remap_look(agent.ports, _obs(agent), state)
    assert home is not None and home.state == "done", home
    assert [(m["vm"], m["dst"], m["why"]) for m in summary(state)["moves"]] == [
        ("vjob-slurm-21-0", "s1", "home"),
        ("vjob-slurm-21-1", "s2", "home"),
    ]
    assert pilots["21"].seen[-2:] == [("suspend", "", ("f1", "f2")), ("resume", "s1", ("s1", "s2"))]
    assert sorted(v.node for v in store_vms.of_job(store, "slurm", "21")) == ["s1", "s2"]


def test_the_control_loop_marks_a_movable_multi_vm_vjob_whole_and_a_users_pinned(tmp_path: Path) -> None:
    def sample(node: str) -> Mapping[str, DomainSample]:
        return {f"vjob-slurm-{j}-{r}": DomainSample(f"vjob-slurm-{j}-{r}", 0.0, 0, 1, memory_kib=256 * 1024)
                for j, nodes in HOME.items() for r, n in enumerate(nodes) if n == node}  # fmt: skip

    jobs = tuple(_job(j) for j in HOME)
    obs = Observation(ClusterView(now=0, nodes=NODES, jobs=jobs), {j: _status(j) for j in HOME}, {}, True)
    cfg = _cfg(tmp_path)
    from agent.remap_whole import unmovable

    movable = {j.id for j in jobs if not unmovable(cfg, j)}
    assert movable == {"21", "22"}
    vms = observed_vms(obs, ControlState(sampler=sample), busy=0.5, whole=movable)
    assert {(o.vjob, o.pinned) for o in vms} == {("21", False), ("22", False), ("23", True)}


def test_the_control_loop_moves_a_whole_vjob_by_one_cut_through_its_pilot(tmp_path: Path, store: Store) -> None:
    """n1 is overloaded by 6's first VM (a user's 2-VM job: pinned) and 7's first VM (root's:
    whole); n4 is free. The planner moves 7 by one cut (both VMs suspended, then resumed, the
    first on n4), its pilot gets one suspend and one resume naming both nodes, and the store
    records 7's VMs where they went; 6 is not touched."""
    homes = {"6": ("n1", "n2"), "7": ("n1", "n3")}
    users = {"6": "alice", "7": "root"}
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"pilot_dir": str(tmp_path / "pilots"), "checkpoint_timeout_s": 30},
            "planner": {"interval_s": 30, "optimizer": "ffd"},
        }
    )
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    assert agent.ports.lease.hold()
    pilots = {}
    for job, nodes in homes.items():
        pdir = PilotDir(agent.ports.root, "slurm", job)
        pdir.ensure()
        pdir.write_state(dataclasses.replace(_status("21"), job_id=job, vm=f"vjob-slurm-{job}-0", node=nodes[0],
                                             member_nodes=list(nodes)))  # fmt: skip
        pilots[job] = _StandIn(pdir, tmp_path / f"memory-{job}")
    jobs = tuple(
        Job(j, users[j], rms="slurm", state=JobState.RUNNING, nodes=2, allocated_nodes=n, submit_time=float(i))
        for i, (j, n) in enumerate(homes.items())
    )

    def sample(node: str) -> Mapping[str, DomainSample]:
        here = [f"vjob-slurm-{j}-{r}" for j, ns in homes.items() for r, n in enumerate(ns) if n == node]
        return {vm: DomainSample(vm, 0.0, 0, 1, memory_kib=500 * 1024) for vm in here}

    nodes = tuple(Node(n, 1, 1024) for n in ("n1", "n2", "n3", "n4"))
    states = {j: PilotDir(agent.ports.root, "slurm", j).read_state() for j in homes}
    obs = Observation(ClusterView(now=0, nodes=nodes, jobs=jobs), states, {}, True)  # type: ignore[arg-type]
    state = ControlState(sampler=sample)
    try:
        report = control_step(agent.ports, obs, state)
    finally:
        for p in pilots.values():
            p.stop()
    assert state.decision is not None and state.decision.instance.whole == frozenset({"7"})
    assert report is not None and report.state == "done", report
    assert pilots["6"].seen == []
    ((_, _, held), (kind, first, dest)) = pilots["7"].seen
    assert (held, kind, first) == (("n1", "n3"), "resume", dest[0]) and "n1" not in dest, pilots["7"].seen
    assert sorted(store_vms.of_job(store, "slurm", "7"), key=lambda v: v.name) == [
        store_vms.OwnedVM("vjob-slurm-7-0", dest[0]),
        store_vms.OwnedVM("vjob-slurm-7-1", dest[1]),
    ]
