"""The agent's remapping step on real QEMU guests: libvirt sampling, a swap by two crossing live
migrations through the pilots, journalled, the guests counting on.

Two libvirtds on this machine are the nodes a ("slow") and b ("fast"); two vjobs are real pilot
processes (`vjob run`, the counter guest), one on each. The step samples both guests through
the libvirt sampler (real domain statistics), prices the window on both sub-clusters and —
the threshold set so low that any swap passes, since two idle counter guests gain nothing —
swaps them: one executor switch of two `migrate` actions, run at the same time between the
same two libvirtds. The decision's quality is the pure tests'; this is the real plumbing.
"""

from __future__ import annotations

import os
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
from provisioning import guest
from tests import bench_scripts
from tests.agent_steps import remap_look
from tests.test_remap_agent_live import FARM, _NoRMS
from vjob import config as vconfig
from vjob.model import ClusterView, Job, JobState, Node, VMState
from vjob.pilot_files import PilotState, vm_name
from vjob.store import journal

# Not in CI (soak): tests/test_planner_realvm.py already drives a live migrate through real pilots
# and the journal; this one adds the remap step's sampling and a parallel swap (about 55 s).
pytestmark = [pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.soak]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Any]:
    live = bench_scripts.load("planner_live").LiveSite(
        {"a": libvirt_system, "b": libvirt_second_node}, memory_mib=96, prefix="vjob-remap-agent-"
    )
    try:
        yield live
    finally:
        live.close()


def test_the_step_swaps_two_real_guests_by_crossing_live_migrations(site: Any) -> None:
    homes = {"2501": "a", "2502": "b"}
    for job, node in homes.items():
        site.pilot(job, node)
    for job in homes:
        site.wait_counting(job)
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
    before = {job: guest_probe.last_counter(site.console(job)) or 0 for job in homes}
    report = remap_look(agent.ports, observation(), state)
    assert report is not None and report.state == "done", report.summary() if report else state.decisions
    (d,) = state.decisions
    assert d.kind == "swap" and set(d.jobs) == set(homes)

    for job, node in (("2501", "b"), ("2502", "a")):
        st = site.state(job)
        assert (st.state, st.node) == (PilotState.RUNNING, node), job
        assert site.driver.state(vm_name("slurm", job), node) is VMState.RUNNING
        assert site.driver.state(vm_name("slurm", job), homes[job]) is None  # no copy left behind
        site.wait_counting(job, before[job] + 2, timeout_s=60)
        seen = guest_probe.counters(site.console(job))
        assert seen == list(range(1, len(seen) + 1)) and guest_probe.boots(site.console(job)) == 1, job
    sw = journal.load(site.store, report.switch_id)
    assert sorted((a.rms_job_id, a.action, a.source, a.state) for a in sw.actions) == [
        ("2501", "migrate", "a", "done"),
        ("2502", "migrate", "b", "done"),
    ]
    times = journal.action_times(site.store, report.switch_id)
    status = {v["job"]: v for v in collect(cfg, "slurm")["vjobs"]}
    assert status["2501"]["hosts"] == ["b"] and status["2502"]["migrations"] == ["b->a"]
    print("swap seconds", {a.rms_job_id: round(times[a.id][1] - times[a.id][0], 2) for a in sw.actions})


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
