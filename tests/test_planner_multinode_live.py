"""The control loop with a real multi-node pilot: its VMs measured one by one, one request per switch.

A multi-node pilot (`vjob run --nodes node1,node2`, VMs `vjob-slurm-79-0` and `-1`) and a
one-VM pilot (78) over libvirt's test driver. As in test_planner_live.py, the pilots' test
drivers live in their own processes, so root's view of each node is a mirror connection with
one running domain per VM, sampled through the real sampler (libvirt's domain statistics).
The loop weighs each of 79's VMs on its node (the pilots' files claim 1 MiB VMs: not read),
suspends 79 as one coordinated cut (one request, one journalled action), and when room comes
back resumes it in place with one request; a repeated action after a crash is recognised.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import libvirt
import pytest

from agent import consolidate
from agent.consolidate import ControlState
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pilot_performer import PilotRequestPerformer
from agent.recover import finish_live_switches
from agent.status_cmd import read_control_status
from provisioning.profiling import node_sampler
from tests.agent_steps import control_step
from tests.services import wait_for
from tests.services.libvirt import make_test_node
from tests.test_planner_live import MIRROR, _NoRMS
from vjob import log
from vjob.config import parse
from vjob.model import Action, ClusterView, Node, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import journal
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt
REPO = Path(__file__).resolve().parents[1]
MEMBERS = ("vjob-slurm-79-0", "vjob-slurm-79-1")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    uris = {n: make_test_node(tmp_path / "nodes", n) for n in ("node1", "node2")}
    (tmp_path / "vjob.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n'
        f'vm_dir = "{tmp_path / "vms" / "{node}"}"\nsnapshot_dir = "{tmp_path / "snap" / "{node}"}"\n'
        "[provisioning.nodes]\n" + "".join(f'{n} = "{u}"\n' for n, u in uris.items())
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    procs = []
    for job, nodes in (("78", "node1"), ("79", "node1,node2")):
        cmd = [
            sys.executable,
            "-m",
            "vjob.cli",
            "--config",
            str(tmp_path / "vjob.toml"),
            "run",
            "--job-id",
            job,
            "--node",
            "node1",
            "--nodes",
            nodes,
            "--memory",
            "128",
        ]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    yield tmp_path
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def _pdir(site: Path, job: str) -> PilotDir:
    return PilotDir(site / "data" / "pilots", "slurm", job)


def _st(site: Path, job: str) -> PilotStatus:
    st = _pdir(site, job).read_state()
    assert st is not None
    return st


def _domain(conn: libvirt.virConnect, name: str, mib: int) -> None:
    conn.defineXML(MIRROR.format(name=name, kib=mib * 1024)).create()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_loop_suspends_and_resumes_a_multi_node_vjob_as_one_request_each(site: Path, store: Store):
    for job in ("78", "79"):
        wait_for(lambda j=job: _pdir(site, j).exists() and _st(site, j).state is PilotState.RUNNING, 60, f"pilot {job}")
    assert _st(site, "79").member_nodes == ["node1", "node2"]  # where root looks for each VM
    # Root's view: node1 (1 GiB) holds 78 (768 MiB) and 79-0 (384 MiB): 1152 > 1024, overloaded;
    # node2 (512 MiB) holds 79-1 (384 MiB) and has no room for 79-0. FCFS keeps 78: 79 sleeps.
    hv = {n: libvirt.open(make_test_node(site / "mirror", n)) for n in ("node1", "node2")}
    _domain(hv["node1"], "vjob-slurm-78", 768)
    _domain(hv["node1"], MEMBERS[0], 384)
    _domain(hv["node2"], MEMBERS[1], 384)
    cfg = parse(
        {
            "data_dir": str(site / "data"),
            "planner": {"interval_s": 30, "optimizer": "ffd"},
            "agent": {"checkpoint_timeout_s": 60},
        }
    )
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    view = ClusterView(now=time.time(), nodes=(Node("node1", 2, 1024), Node("node2", 2, 512)), jobs=())

    def observation() -> Observation:
        claims = {j: replace(_st(site, j), memory_mb=1) for j in ("78", "79")}  # the pilots' claims: not read
        return Observation(view, claims, {}, True)

    state = ControlState(sampler=node_sampler(lambda node: hv[node]))
    consolidate.observed_vms(observation(), state, busy=0.5)  # first samples
    time.sleep(0.3)
    report = control_step(agent.ports, observation(), state)

    assert state.decision is not None and state.decision.overloaded == ("node1",)
    assert [(v.id, v.host, v.mem) for v in state.decision.instance.vms] == [
        ("vjob-slurm-78", "node1", 768),
        (MEMBERS[0], "node1", 384),
        (MEMBERS[1], "node2", 384),
    ]
    assert state.unmeasured == () and state.members == {"79": tuple(zip(MEMBERS, ("node1", "node2"), strict=True))}
    assert state.plan is not None and sorted((a.kind, a.vm) for a in state.plan.actions) == [
        (Action.SUSPEND, MEMBERS[0]),
        (Action.SUSPEND, MEMBERS[1]),
    ]
    assert report is not None and report.state == "done", report.summary()
    sw = journal.load(store, report.switch_id)
    assert [(a.action, a.vm_name, a.state) for a in sw.actions] == [("suspend", MEMBERS[0], "done")]  # one request
    st = _st(site, "79")
    assert st.state is PilotState.SAVED and st.memory_saved and st.saved_nodes == ["node1", "node2"]
    assert _st(site, "78").state is PilotState.RUNNING
    errors: list[str] = []
    shown = read_control_status(cfg, errors)  # what `vjob status` shows of this step
    assert shown["vjobs"]["79"]["why"] == (
        "sleeps: #2 in the FCFS queue, measured 0 CPU, 768 MiB over 2 VM(s): no room on the nodes it is pinned "
        "to (node1, node2) beside the 1 vjob(s) before it"
    )
    assert (shown["plan"]["outcome"], shown["plan"]["switch"], shown["overloaded"]) == (
        "done",
        report.switch_id,
        {"node1": "memory 1152 > 1024 MB"},
    )
    assert errors == []

    # The agent killed after the pilot answered but before the journal said so: the recovery
    # repeats the action with the same request id, and the pilot is not asked to sleep twice.
    (row,) = sw.actions
    journal.set_action(store, row.id, "running")
    journal.set_switch(store, sw.id, "running")
    performer = PilotRequestPerformer(lambda a: _pdir(site, a.vjob), timeout_s=30)
    (again,) = finish_live_switches(store, "slurm", lambda _sw: performer, log.get("test"))
    assert again.state == "done", again.summary()
    assert (_st(site, "79").state, _st(site, "79").request_error) == (PilotState.SAVED, "")

    # 78 shrinks to 512 MiB: room for one of 79's VMs on each node, where they slept.
    hv["node1"].lookupByName("vjob-slurm-78").destroy()
    hv["node1"].lookupByName("vjob-slurm-78").undefine()
    _domain(hv["node1"], "vjob-slurm-78", 512)
    asleep = [o for o in consolidate.observed_vms(observation(), state, busy=0.5) if o.vjob == "79"]
    assert [(o.vm, o.state, o.host, o.mem) for o in asleep] == [
        (MEMBERS[0], VJobState.SLEEPING, "node1", 384),
        (MEMBERS[1], VJobState.SLEEPING, "node2", 384),
    ]
    report = control_step(agent.ports, observation(), state)
    assert report is not None and report.state == "done", report.summary()
    assert state.plan is not None and sorted((a.kind, a.vm, a.src, a.dst) for a in state.plan.actions) == [
        (Action.RESUME, MEMBERS[0], "node1", "node1"),
        (Action.RESUME, MEMBERS[1], "node2", "node2"),
    ]
    sw = journal.load(store, report.switch_id)
    assert [(a.action, a.vm_name, a.state) for a in sw.actions] == [("resume", MEMBERS[0], "done")]
    st = _st(site, "79")
    assert (st.state, st.node, st.restores, st.local_restores) == (PilotState.RUNNING, "node1", 1, 1)
    assert read_control_status(cfg, errors)["vjobs"]["79"]["why"].startswith("wakes: #2 in the FCFS queue")
    for conn in hv.values():
        conn.close()
