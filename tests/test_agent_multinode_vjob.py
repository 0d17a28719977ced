"""The agent and a vjob of several VMs (one per node): read, chosen, checkpointed, cleaned up.

Issue 32: the agent believed only `vjob-<rms>-<id>` in a pilot's state, so it ignored every
multi-node pilot (`vjob-<rms>-<id>-0`…) — never a victim, never cleaned up. Here a real pilot
process (`vjob run --nodes node1,node2`, two counter-guest VMs on libvirt's test driver, as in
test_multinode_pilot_requests.py) holds job 81's two VMs; the agent ticks for real (store,
planner, executor, pilot files, VM driver) against an RMS whose answers the test scripts: job
81 runs on both nodes of the cluster, an interactive job wants both. The agent must read the
two-VM state, choose job 81 as the victim, send its pilot one checkpoint request (one cut of
both VMs, one requeue-hold, Pn = 1), record both VMs and both saved states in the store (`vjob
status` lists both), and once the RMS has forgotten the job delete both VMs, where the store
recorded them.

What a state file may claim is checked without a pilot: names derived from the job id, one VM
per node, no more than the cluster has nodes, rank 0's name first.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import read_pilots
from agent.status_cmd import collect
from plugins import job_environment
from provisioning.driver import Driver
from tests.services import wait_for
from tests.services.libvirt import make_test_node
from vjob.config import Config, parse
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs, claimed_vms, vm_names
from vjob.rms import Abilities, PriorityKnob
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store import snapshots as store_snapshots
from vjob.store import vms as store_vms
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt
REPO = Path(__file__).resolve().parents[1]
JOB = "81"
NODES = ("node1", "node2")
VMS = ("vjob-slurm-81-0", "vjob-slurm-81-1")
PLACED = list(zip(VMS, NODES, strict=True))
USER = pwd.getpwuid(os.getuid()).pw_name


class ScriptedRMS:
    """The RMS side of the agent's contract (vjob.rms.RMSAdapter) as a table the test sets,
    with Slurm's abilities; every action the agent asks is recorded and applied to the table
    as Slurm would (a requeue-hold makes the job held, its nodes free)."""

    name = "slurm"

    def __init__(self, jobs: Sequence[Job], nodes: Sequence[Node]) -> None:
        self.table = {j.id: j for j in jobs}
        self.node_list = list(nodes)
        self.calls: list[tuple[str, str]] = []
        self.abilities = Abilities(
            priority=PriorityKnob(0, 1000),
            requeue_hold=True,
            hold_release=True,
            suspend=False,
            pin_nodes=True,
            start_now=False,
            environment=job_environment("slurm"),
        )

    def jobs(self) -> list[Job]:
        return list(self.table.values())

    def nodes(self) -> list[Node]:
        return list(self.node_list)

    def set_priority(self, job_id: str, value: int) -> None:
        self.calls.append(("set_priority", job_id))

    def hold(self, job_id: str) -> None:
        self.calls.append(("hold", job_id))

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id))

    def requeue_hold(self, job_id: str) -> None:
        """Held, its nodes free, and — as Slurm reports a requeued job until it is placed again
        (seen on the dev cluster) — one node asked for."""
        self.calls.append(("requeue_hold", job_id))
        self.table[job_id] = replace(self.table[job_id], state=JobState.HELD, allocated_nodes=(), nodes=1)

    def require_nodes(self, job_id: str, nodes: Sequence[str]) -> None:
        self.calls.append(("require_nodes", job_id))

    def start_now(self, job_id: str) -> None:
        self.calls.append(("start_now", job_id))


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Config, Path]]:
    uris = {n: make_test_node(tmp_path / "nodes", n) for n in NODES}
    prov = {
        "default_uri": "test:///default",
        "nodes": uris,
        "vm_dir": str(tmp_path / "vms" / "{node}"),
        "snapshot_dir": str(tmp_path / "snap" / "{node}"),
    }
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n'
        f'vm_dir = "{prov["vm_dir"]}"\nsnapshot_dir = "{prov["snapshot_dir"]}"\n'
        "[provisioning.nodes]\n" + "".join(f'{n} = "{u}"\n' for n, u in uris.items())
    )
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "provisioning": prov,
            "priority": {"interactive_cap": 1.0},
            "agent": {"checkpoint_timeout_s": 60, "cleanup_after_s": 0},
        }
    )
    Store(cfg.database_url).upgrade()
    yield cfg, conf


def _paths(cfg: Config) -> Driver:
    return Driver(cfg.provisioning, data_dir=cfg.data_path)  # for its paths only: never connects


def test_a_two_vm_vjob_is_read_chosen_checkpointed_in_one_cut_recorded_and_cleaned_up(site) -> None:
    cfg, conf = site
    now = time.time()
    batch = Job(
        JOB,
        USER,
        rms="slurm",
        nodes=2,
        state=JobState.RUNNING,
        allocated_nodes=NODES,
        submit_time=now - 60,
        start_time=now - 50,
    )
    interactive = Job("82", USER, JobClass.INTERACTIVE, rms="slurm", nodes=2, submit_time=now)
    rms = ScriptedRMS([batch], [Node(n, 2, 4096) for n in NODES])
    cmd = [
        sys.executable,
        "-m",
        "vjob.cli",
        "--config",
        str(conf),
        "run",
        "--job-id",
        JOB,
        "--node",
        "node1",
        "--nodes",
        ",".join(NODES),
        "--memory",
        "128",
        "--orphan-resume",
        "600",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    pilot = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pdir = PilotDir(cfg.data_path / "pilots", "slurm", JOB)
    paths = _paths(cfg)
    try:
        wait_for(lambda: (st := pdir.read_state()) is not None and st.state is PilotState.RUNNING, 60, "pilot running")
        agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics())
        store = agent.ports.store()

        # Read: both VMs, named from the job id, each on its node, recorded in the store.
        first = agent.tick()
        assert not first.errors and first.checkpointed == []
        assert sorted((v.name, v.node) for v in store_vms.of_job(store, "slurm", JOB)) == PLACED

        # Chosen and checkpointed: one request, both VMs saved in one cut, one requeue-hold.
        rms.table["82"] = interactive
        second = agent.tick()
        assert second.checkpointed == [JOB], second.errors
        assert [c for c in rms.calls if c[0] == "requeue_hold"] == [("requeue_hold", JOB)]
        st = pdir.read_state()
        assert st is not None and st.state is PilotState.SAVED and st.member_nodes == list(NODES)
        assert all(paths.state_path(vm, node).is_file() for vm, node in PLACED)
        (sw,) = journal.recent(agent.ports.store())
        assert sw.state == "done" and sorted(a.vm_name for a in sw.actions) == list(VMS)
        assert all(a.state == "done" for a in sw.actions)
        record = store_jobs.get(store, "slurm", JOB)
        assert record is not None and record.preempt_count == 1

        # Recorded: the next look still hears the held job's pilot (Slurm now says one node) and
        # records each VM's saved state, on its node; no other victim is taken.
        third = agent.tick()
        assert not third.errors and third.checkpointed == []
        saved = {(r.vm, r.node) for r in store_snapshots.listing(store, rms="slurm") if r.job == JOB}
        assert saved == set(PLACED)
        (shown,) = [v for v in collect(cfg, "slurm")["vjobs"] if v["job"] == JOB]  # `vjob status`
        assert shown["vms"] == [{"vm": vm, "node": node} for vm, node in PLACED] and shown["preempt_count"] == 1
    finally:
        if pilot.poll() is None:  # the RMS ends the requeued job's old step
            pilot.send_signal(signal.SIGTERM)
        _out, err = pilot.communicate(timeout=60)
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    cuts = [e for e in events if e.get("event") == "multi-node job saved"]
    assert len(cuts) == 1 and cuts[0]["vms"] == 2 and cuts[0]["consistent"] is True, err[-2000:]

    # Cleaned up: the RMS forgets the job; after two ticks without it, both VMs are deleted
    # where the store recorded them (their overlays and saved states on each node).
    after = pdir.read_state()
    assert after is not None and after.state is PilotState.SAVED, after
    del rms.table[JOB]
    agent.ports.lease.give_up()  # stopped; a new agent knows of the job only what the store recorded
    agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics())
    assert agent.tick().cleaned == []
    assert agent.tick().cleaned == [JOB]
    for vm, node in PLACED:
        assert not paths.state_path(vm, node).exists() and not paths.overlay_path(vm, node).exists()
    assert store_vms.of_job(agent.ports.store(), "slurm", JOB) == [] and not pdir.path.exists()


def _write(root: Path, job: str, **fields: object) -> PilotDir:
    pdir = PilotDir(root, "slurm", job)
    pdir.ensure()
    base = PilotStatus(
        job_id=job,
        vm=f"vjob-slurm-{job}",
        node="node1",
        uri="test:///default",
        state=PilotState.RUNNING,
        since=time.time(),
    )
    pdir.state_file.write_text(json.dumps({**base.to_json(), **fields}))
    return pdir


def test_a_state_claims_only_the_vms_named_from_its_job_id_one_per_node_of_the_cluster(tmp_path: Path) -> None:
    root = tmp_path / "pilots"
    two = {"member_nodes": list(NODES)}
    _write(root, "1")  # one VM: vjob-slurm-1
    _write(root, "2", vm="vjob-slurm-2-0", **two)  # two VMs: vjob-slurm-2-0, -1
    _write(root, "3", vm="vjob-slurm-2-1", **two)  # another job's VM
    _write(root, "4", vm="vjob-slurm-4-0", member_nodes=["node1", "node2", "node3"])  # more VMs than nodes
    _write(root, "5", **two)  # the one-VM name for two VMs
    _write(root, "6", vm="vjob-slurm-6-1", **two)  # not rank 0's name
    _write(root, "7", vm="vjob-slurm-7-0")  # a rank's name for a job of one VM
    _write(root, "8", vm="vjob-slurm-8-0", member_nodes=["node1", "node1"])  # two VMs on one node
    _write(root, "9", vm="vjob-slurm-9-0", **two)  # the RMS no longer knows job 9
    agent = Agent(parse({"data_dir": str(tmp_path / "data")}), object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    users = {j: USER for j in "12345678"}
    pilots = read_pilots(agent.ports, all_dirs(root, "slurm"), users, max_vms=len(NODES))
    assert sorted(pilots) == ["1", "2", "9"]
    assert claimed_vms("slurm", "1", pilots["1"]) == [("vjob-slurm-1", "node1")]
    assert claimed_vms("slurm", "2", pilots["2"]) == [("vjob-slurm-2-0", "node1"), ("vjob-slurm-2-1", "node2")]

    st = pilots["2"]
    with pytest.raises(InputError, match="field 'member_nodes' lists 2 nodes: the cluster has 1"):
        claimed_vms("slurm", "2", st, max_vms=1)
    with pytest.raises(InputError, match="field 'member_nodes' names 'node2' twice: one VM per node"):
        claimed_vms("slurm", "2", replace(st, member_nodes=["node2", "node2"]))
    with pytest.raises(InputError, match="field 'job_id' = '2': not this job"):
        claimed_vms("slurm", "9", st)
    with pytest.raises(InputError, match="field 'vm' = 'vjob-slurm-2-0': must be 'vjob-slurm-2'"):
        claimed_vms("slurm", "2", replace(st, member_nodes=[]))
    assert vm_names("slurm", "2", 2) == ["vjob-slurm-2-0", "vjob-slurm-2-1"] and vm_names("pbs", "5") == ["vjob-pbs-5"]
    for bad in (0, -1, True):
        with pytest.raises(InputError, match="VM count"):
            vm_names("slurm", "2", bad)


def test_a_restarted_agent_finishes_a_two_vm_checkpoint_with_one_requeue_hold(site) -> None:
    """An agent killed after the pilot's one cut but before the requeue-hold left a switch with a
    suspend of each VM, both running: the next agent finishes it once for the job (one
    requeue-hold, Pn = 1), not once per VM."""
    cfg, _conf = site
    batch = Job(JOB, USER, rms="slurm", nodes=2, state=JobState.RUNNING, allocated_nodes=NODES)
    rms = ScriptedRMS([batch], [Node(n, 2, 4096) for n in NODES])
    agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics())
    store = agent.ports.store()
    store_jobs.track(store, batch)
    memory = cfg.data_path / "saved.state"
    memory.write_bytes(b"state")
    pdir = PilotDir(cfg.data_path / "pilots", "slurm", JOB)
    pdir.ensure()
    pdir.write_state(
        PilotStatus(
            job_id=JOB,
            vm=VMS[0],
            node="node1",
            uri="test:///default",
            state=PilotState.SAVED,
            since=time.time(),
            request_id="r1",
            memory_path=str(memory),
            member_nodes=list(NODES),
        )
    )
    planned = [journal.PlannedAction(0, "suspend", vm, f"slurm:{JOB}", node, None) for vm, node in PLACED]
    switch, ids = journal.open_switch(store, "interactive job 82", {"cost": 256}, planned)
    for action in ids:
        journal.set_action(store, action, "running")

    assert agent.recover() == [switch]
    assert rms.calls == [("requeue_hold", JOB)]
    record = store_jobs.get(store, "slurm", JOB)
    assert record is not None and record.preempt_count == 1
    sw = journal.load(store, switch)
    assert sw.state == "done" and [a.state for a in sw.actions] == ["done", "done"]
