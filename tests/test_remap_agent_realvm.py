"""The agent's remapping step on real QEMU guests: libvirt sampling, a swap by two crossing live
migrations through the pilots, journalled, the guests counting on.

The swap runs across two hosts that share nothing but the wire: the dev cluster's two
network-namespace hosts (tests/services/two_hosts.py, `deploy/devcluster up --hosts 2`), node a
on host A and node b on host B, each its own system libvirtd and its own VM directory (the
cluster's per-host bind over <run dir>/vjob/vms). Two vjobs are real root pilot processes (`vjob
run`, the counter guest), each started on its node's host as slurmd would start it, one on each.
The step (this process, in the root namespace) samples both guests through the libvirt sampler
(real domain statistics), prices the window on both sub-clusters and — the threshold set so low
that any swap passes, since two idle counter guests gain nothing — swaps them: one executor switch
of two `migrate` actions at the same time between the two libvirtds. Each migration pauses its
guest (TCG), copies its overlay to the other host over ssh, checks it there, sends the memory over
the hosts' link and runs it there (provisioning.migration); nothing of the VM stays behind. The
decision's quality is the pure tests'; this is the real plumbing. How each libvirtd is reached:
its own socket through its host's mount namespace (/proc/PID/root), the one thing not over the
wire (a site would use qemu+ssh or TLS); the memory and the disks do cross it.

The second test swaps two 2-VM jobs whole (suspend, resume elsewhere) on this machine's two
libvirtds: soak, its path is in CI in parts — the remap step moving 2-VM jobs whole through their
pilots (tests/test_remap_whole_agent.py), the real multi-node pilot's one cut and resume naming a
node per VM (tests/test_remap_whole_pilot.py), and real guests' multi-node cut resumed on other
nodes across hosts (tests/test_two_hosts_slurm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.remap_step import RemapState
from agent.status_cmd import collect
from devkit import guest_probe
from devkit.devcluster import DevCluster
from devkit.devcluster_hosts import Topology
from provisioning import guest, transfer
from provisioning.driver import Driver
from tests import bench_scripts
from tests.agent_steps import remap_look
from tests.services.two_hosts import two_host_cluster  # noqa: F401 - the fixture
from tests.test_remap_agent_live import FARM, _NoRMS
from vjob import config as vconfig
from vjob.model import ClusterView, Job, JobState, Node, VMState
from vjob.pilot_files import PilotState, vm_name
from vjob.store import journal

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]
REPO = Path(__file__).resolve().parents[1]
SUB = "remap-agent-test"
"""This test's VM and snapshot directories, under each host's own ones."""
HOST_OF = {"a": "hosta", "b": "hostb"}


def _site_config(site: Any, topology: Topology) -> str:
    """Node a on host A, node b on host B: their libvirtds, the hosts' addresses for the memory,
    the VMs' files on each host reached over ssh (rsync), the VM directory one path on both hosts
    but each host's own filesystem."""
    hosts = {h.name: h for h in topology.hosts()}
    uris = "".join(
        f'{n} = "qemu:///system?socket=/proc/{topology.holder(h)}/root/run/libvirt/libvirt-sock"\n'
        for n, h in HOST_OF.items()
    )
    migrate = "".join(f'{n} = "tcp://{hosts[h].address}"\n' for n, h in HOST_OF.items())
    names = ", ".join(f'{n} = "{h}"' for n, h in HOST_OF.items())
    vjob_dir = topology.root / "vjob"
    return (
        f'data_dir = "{site.data}"\n[provisioning]\noperation_timeout_s = 120.0\n'
        f'vm_dir = "{vjob_dir / "vms" / SUB}"\nsnapshot_dir = "{vjob_dir / "snapshots" / SUB}"\n'
        f'copy_method = "rsync"\nhosts = {{ {names} }}\n'
        f"[provisioning.nodes]\n{uris}[provisioning.migrate_uris]\n{migrate}"
        '[logging]\nformat = "json"\n'
    )


@pytest.fixture
def site(
    two_host_cluster: tuple[DevCluster, Topology],  # noqa: F811 - the fixture
    tiny_guest: guest.GuestFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Any, Topology]]:
    """A LiveSite whose nodes a and b are the two hosts; root enrolled for ssh between them (the
    site's ssh_config names the hosts, in the root namespace too)."""
    _cluster, topology = two_host_cluster
    topology.enrol("root")
    monkeypatch.setenv(transfer.SSH_CONFIG_ENV, str(topology.ssh_dir / "ssh_config"))
    live = bench_scripts.load("planner_live").LiveSite({"a": "test:///default"}, memory_mib=96, prefix="vjob-remap-2h-")
    try:
        live.config.write_text(_site_config(live, topology))
        live.driver.close()
        cfg = vconfig.load(live.config)
        live.driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
        live.nodes = tuple(HOST_OF)
        yield live, topology
    finally:
        live.close()
        for host in HOST_OF.values():
            for kind in ("vms", "snapshots"):
                shutil.rmtree(topology.base / host / kind / SUB, ignore_errors=True)


def _pilot_on_host(site: Any, topology: Topology, job: str, node: str) -> None:
    """Vjob `job`'s root pilot started on `node`'s host (its namespaces), as slurmd starts it."""
    cmd = [*topology.enter(HOST_OF[node]), sys.executable, "-m", "vjob.cli", "--config", str(site.config)]
    cmd += ["run", "--job-id", job, "--node", node, "--memory", str(site.memory_mib)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    with open(site.work / f"pilot-{job}.out", "ab") as out:
        site.procs[job] = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _console(topology: Topology, job: str, node: str) -> Path:
    """The guest's console log on `node`'s host, seen from here (its host's VM directory)."""
    return topology.base / HOST_OF[node] / "vms" / SUB / f"{vm_name('slurm', job)}.console.log"


@pytest.mark.slurm  # the two-host dev cluster's hosts
def test_the_step_swaps_two_real_guests_on_two_hosts_by_crossing_live_migrations(site: Any) -> None:
    site, topology = site
    homes = {"2501": "a", "2502": "b"}
    for job, node in homes.items():
        _pilot_on_host(site, topology, job, node)
    for job, node in homes.items():
        site.wait(f"pilot {job} running", lambda j=job: site.state(j).state is PilotState.RUNNING, 180)
        guest_probe.wait_for_counter(_console(topology, job, node), 2, 180)
    (site.work / "farm.toml").write_text(FARM)
    site.config.write_text(
        site.config.read_text() + f'[remap]\nfarm_file = "{site.work / "farm.toml"}"\ntau_s = 2\nthreshold_s = -1e9\n'
    )
    cfg = vconfig.load(site.config)
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = site.store
    nodes = (Node("a", 1, 4096, features=("slow",)), Node("b", 1, 4096, features=("fast",)))
    jobs = tuple(Job(j, "alice", rms="slurm", state=JobState.RUNNING, allocated_nodes=(n,)) for j, n in homes.items())

    def observation() -> Observation:
        view = ClusterView(now=time.time(), nodes=nodes, jobs=jobs)
        return Observation(view, {j: site.state(j) for j in homes}, {}, True)

    state = RemapState()
    assert remap_look(agent.ports, observation(), state) is None  # first samples, through libvirt
    assert {s.name for s in state.samples.values()} == {vm_name("slurm", j) for j in homes}
    assert all(s.cpu_time_ns > 0 for s in state.samples.values())
    time.sleep(2.5)
    report = remap_look(agent.ports, observation(), state)
    assert report is not None and report.state == "done", report.summary() if report else state.decisions
    (d,) = state.decisions
    assert d.kind == "swap" and set(d.jobs) == set(homes)

    for job, node in (("2501", "b"), ("2502", "a")):
        st = site.state(job)
        assert (st.state, st.node) == (PilotState.RUNNING, node), job
        vm = vm_name("slurm", job)
        assert site.driver.state(vm, node) is VMState.RUNNING
        assert site.driver.state(vm, homes[job]) is None  # no domain left behind
        left = sorted(p.name for p in (topology.base / HOST_OF[homes[job]] / "vms" / SUB).glob(f"{vm}.*"))
        assert left in ([], [f"{vm}.console.log"]), f"host {HOST_OF[homes[job]]} kept {left}"
        arrived = sorted(p.name for p in (topology.base / HOST_OF[node] / "vms" / SUB).glob(f"{vm}.*"))
        assert f"{vm}.qcow2" in arrived, f"host {HOST_OF[node]} holds {arrived}"
        there = _console(topology, job, node)
        guest_probe.wait_for_counter(there, (guest_probe.last_counter(there) or 0) + 2, 60)
        seen = guest_probe.counters(_console(topology, job, homes[job])) + guest_probe.counters(there)
        assert seen == list(range(1, len(seen) + 1)), (job, seen)
        assert guest_probe.boots(_console(topology, job, homes[job])) + guest_probe.boots(there) == 1, job
    sw = journal.load(site.store, report.switch_id)
    assert sorted((a.rms_job_id, a.action, a.source, a.state) for a in sw.actions) == [
        ("2501", "migrate", "a", "done"),
        ("2502", "migrate", "b", "done"),
    ]
    times = journal.action_times(site.store, report.switch_id)
    status = {v["job"]: v for v in collect(cfg, "slurm")["vjobs"]}
    assert status["2501"]["hosts"] == ["b"] and status["2502"]["migrations"] == ["b->a"]
    moved = {job: _disks_moved(site, job) for job in homes}
    assert {job: (m["source"], m["destination"]) for job, m in moved.items()} == {
        "2501": ("a", "b"),
        "2502": ("b", "a"),
    }
    print(
        "swap across hosts:",
        {a.rms_job_id: round(times[a.id][1] - times[a.id][0], 2) for a in sw.actions},
        "s; disk bytes copied",
        {job: m["bytes"] for job, m in moved.items()},
    )


def _disks_moved(site: Any, job: str) -> dict[str, Any]:
    """The pilot's one "vm disks moved" record (provisioning.migration: copied over ssh, checked
    on arrival): the disks crossed the hosts' link, they were not found shared."""
    text = (site.work / f"pilot-{job}.out").read_text(errors="replace")
    moved = [json.loads(line) for line in text.splitlines() if '"vm disks moved"' in line]
    assert len(moved) == 1 and moved[0]["bytes"] > 0, text[-3000:]
    return moved[0]


FARM_WHOLE = """
[[subcluster]]
name = "slow"
nodes = 2
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


@pytest.fixture
def four_nodes(libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Any]:
    """Nodes a1, a2 on the system libvirtd ("slow"), b1, b2 on the second one ("fast")."""
    uris = {"a1": libvirt_system, "a2": libvirt_system, "b1": libvirt_second_node, "b2": libvirt_second_node}
    live = bench_scripts.load("planner_live").LiveSite(uris, memory_mib=96, prefix="vjob-remap-whole-")
    try:
        yield live
    finally:
        live.close()


def _multi_pilot(site: Any, job: str, nodes: tuple[str, str]) -> None:
    """A root job's leader-mode pilot of two counter guests, one per node (what `--nodes` gives
    the counter guest: pilot.multinode on real QEMU); LiveSite cleans up its VMs and bridge."""
    for n in site.nodes:
        for rank in range(2):
            site.driver.delete(f"vjob-slurm-{job}-{rank}", n)
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(site.config), "run", "--job-id", job, "--node", nodes[0]]
    cmd += ["--nodes", ",".join(nodes), "--memory", "96"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    with open(site.work / f"pilot-{job}.out", "ab") as out:
        site.procs[job] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    site.multi.add(job)


@pytest.mark.soak
def test_the_step_swaps_two_real_two_vm_jobs_whole(four_nodes: Any) -> None:
    """Two 2-VM jobs (four counter guests) swapped whole by the agent's remap step: each pilot
    gets one suspend (one cut of its two guests) and one resume naming each guest's new node on
    the other libvirtd; every guest counts on from where it was (n → n+1), booted once."""
    site = four_nodes
    homes = {"2601": ("a1", "a2"), "2602": ("b1", "b2")}
    for job, nodes in homes.items():
        _multi_pilot(site, job, nodes)
    console = {(job, r): site.driver.console_log(f"vjob-slurm-{job}-{r}", "a1") for job in homes for r in (0, 1)}
    for job in homes:
        site.wait(f"pilot {job} running", lambda j=job: site.state(j).state is PilotState.RUNNING, 120)
        for r in (0, 1):
            guest_probe.wait_for_counter(console[(job, r)], 2, 120)
    (site.work / "farm.toml").write_text(FARM_WHOLE)
    site.config.write_text(
        site.config.read_text() + f'[remap]\nfarm_file = "{site.work / "farm.toml"}"\ntau_s = 2\nthreshold_s = -1e9\n'
    )
    cfg = vconfig.load(site.config)
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = site.store
    nodes = tuple(Node(n, 1, 4096, features=("slow" if n.startswith("a") else "fast",)) for n in site.nodes)
    jobs = tuple(
        Job(j, "root", rms="slurm", state=JobState.RUNNING, nodes=2, allocated_nodes=n) for j, n in homes.items()
    )

    def observation() -> Observation:
        return Observation(
            ClusterView(now=time.time(), nodes=nodes, jobs=jobs), {j: site.state(j) for j in homes}, {}, True
        )

    state = RemapState()
    assert remap_look(agent.ports, observation(), state) is None  # first samples, through libvirt
    time.sleep(2.5)
    before = {k: guest_probe.last_counter(log) or 0 for k, log in console.items()}
    t0 = time.monotonic()
    report = remap_look(agent.ports, observation(), state)
    took = time.monotonic() - t0
    assert report is not None and report.state == "done", report.summary() if report else state.skipped
    (d,) = state.decisions
    assert d.kind == "swap" and set(d.jobs) == set(homes)
    for job, want in (("2601", ["b1", "b2"]), ("2602", ["a1", "a2"])):
        st = site.state(job)
        assert (st.state, st.member_nodes) == (PilotState.RUNNING, want), job
        for r, node in enumerate(want):
            vm = f"vjob-slurm-{job}-{r}"
            assert site.driver.state(vm, node) is VMState.RUNNING, (vm, node)
            guest_probe.wait_for_counter(console[(job, r)], before[(job, r)] + 2, 60)
            seen = guest_probe.counters(console[(job, r)])
            assert seen == list(range(1, len(seen) + 1)) and guest_probe.boots(console[(job, r)]) == 1, vm
    sw = journal.load(site.store, report.switch_id)
    assert sorted((a.rms_job_id, a.action, a.state) for a in sw.actions) == [
        ("2601", "resume", "done"),
        ("2601", "suspend", "done"),
        ("2602", "resume", "done"),
        ("2602", "suspend", "done"),
    ]
    print(f"whole swap of two 2-VM jobs: {took:.2f} s")
