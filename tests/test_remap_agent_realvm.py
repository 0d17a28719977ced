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
