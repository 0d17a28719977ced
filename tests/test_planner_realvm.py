"""A planned live context switch on real QEMU guests, with the executor killed half-way.

Two libvirtds on this machine are the nodes a and b; four vjobs are real pilot processes
(`vjob run`, the counter guest). The planner (make_plan) turns the target into a plan with a
suspend, a live migration and a remote resume; the agent's executor carries it out through
the pilots, journalled, in a process of its own that is killed with SIGKILL once the
migration is done and before the remote resume is asked for; the recovery
(agent.recover.finish_live_switches) rolls the switch forward. Every guest's counter goes
on n → n+1 with a single boot: nothing restarted, nothing lost. The timings of each action
kind are bench/planner_live.py's, which holds the site set-up shared here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.recover import finish_live_switches
from devkit import guest_probe
from preemption.planner import Instance, NodeSpec, VMSpec, make_plan, validate
from provisioning import guest
from tests import bench_scripts
from tests.test_planner_live import kill_stalled_executor
from vjob import log
from vjob.model import Action, VJobState, VMState
from vjob.pilot_files import PilotState, vm_name
from vjob.store import journal

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]
REPO = Path(__file__).resolve().parents[1]
R, S = VJobState.RUNNING, VJobState.SLEEPING
MEM = 96


@pytest.fixture
def site(libvirt_system: str, libvirt_second_node: str, tiny_guest: guest.GuestFiles) -> Iterator[Any]:
    live = bench_scripts.load("planner_live").LiveSite({"a": libvirt_system, "b": libvirt_second_node}, memory_mib=MEM)
    try:
        yield live
    finally:
        live.close()


KILLED = """
import sys, time
from agent.pilot_performer import EXECUTOR_TAG, PilotRequestPerformer
from preemption.executor import Executor
from preemption.planner import Plan
from vjob.model import Action
from vjob.pilot_files import PilotDir
from vjob.store.db import Store
import json

root, url, plan_file = sys.argv[1:4]

class Stalling(PilotRequestPerformer):
    # The pools before the remote resume are carried out; then the executor hangs before asking
    # for it, and is killed there.
    def perform(self, action, key):
        if action.kind is Action.RESUME:
            print("stalled", flush=True)
            time.sleep(600)
        super().perform(action, key)

plan = Plan.from_dict(json.load(open(plan_file)))
Executor(Stalling(lambda a: PilotDir(root, "slurm", a.vjob), timeout_s=120), Store(url), pipeline_interval_s=0.1,
         tag=EXECUTOR_TAG, job_key=lambda a: "slurm:" + a.vjob).execute(plan, reason="to be killed")
"""


def _vm(job: str, state: VJobState, host: str) -> VMSpec:
    return VMSpec(vm_name("slurm", job), job, 1, MEM, state, host)


def test_a_planned_switch_with_a_migration_and_a_remote_resume_survives_a_killed_executor(site: Any) -> None:
    # a (1 CPU) is overloaded by 2401 and 2402, and holds the memory state of 2404; on b
    # (2 CPUs) runs 2403, to be put to sleep. 2401, 2402 and 2404 must all run at the end.
    homes = {"2401": "a", "2402": "a", "2403": "b", "2404": "a"}
    for job, node in homes.items():
        site.pilot(job, node)
    for job in homes:
        site.wait_counting(job)
    site.asleep("2404")
    inst = Instance(
        nodes=(NodeSpec("a", 1, 1024), NodeSpec("b", 2, 1024)),
        vms=(_vm("2401", R, "a"), _vm("2402", R, "a"), _vm("2403", R, "b"), _vm("2404", S, "a")),
        target={"2401": R, "2402": R, "2403": S, "2404": R},
    )
    plan = make_plan(inst, time_limit_s=5)
    validate(inst, plan)
    first, second = plan.pools
    assert {(x.kind, x.src, x.dst) for x in first} >= {(Action.SUSPEND, "b", None), (Action.MIGRATE, "a", "b")}
    (moved,) = [x.vjob for x in first if x.kind is Action.MIGRATE]
    stays = "2401" if moved == "2402" else "2402"
    assert [(x.kind, x.vjob, x.src, x.dst) for x in second] == [(Action.RESUME, "2404", "a", "b")]  # remote

    kill_stalled_executor(KILLED, site.work, site.data / "pilots", site.store.url, plan, timeout_s=120)

    (sw,) = journal.open_switches(site.store, rms="slurm")
    states = {x.rms_job_id: (x.action, x.state) for x in sw.actions}
    assert states == {"2403": ("suspend", "done"), moved: ("migrate", "done"), "2404": ("resume", "running")}
    assert site.state("2404").state is PilotState.SAVED  # the remote resume was never asked for
    before = {job: guest_probe.last_counter(site.console(job)) or 0 for job in homes}

    (report,) = finish_live_switches(site.store, "slurm", lambda _sw: site.performer(), log.get("test"))
    assert report.state == "done", report.summary()
    assert journal.open_switches(site.store) == [] and journal.load(site.store, sw.id).state == "done"

    where = {stays: "a", moved: "b", "2404": "b"}
    for job, node in where.items():
        st = site.state(job)
        assert (st.state, st.node) == (PilotState.RUNNING, node), job
        assert site.driver.state(vm_name("slurm", job), node) is VMState.RUNNING
        assert site.driver.state(vm_name("slurm", job), "b" if node == "a" else "a") is None  # no copy left
        site.wait_counting(job, before[job] + 2, timeout_s=60)
    st = site.state("2403")
    assert (st.state, st.saved_node, st.memory_saved) == (PilotState.SAVED, "b", True)
    assert site.driver.state(vm_name("slurm", "2403"), "b") is VMState.SAVED
    assert (site.state(moved).restores, site.state("2404").restores, site.state("2404").local_restores) == (0, 1, 0)
    for job in homes:  # n → n+1 across the suspend, the live migration and the remote resume; one boot each
        seen = guest_probe.counters(site.console(job))
        assert seen == list(range(1, len(seen) + 1)), f"vjob {job}: the counter did not continue: {seen}"
        assert guest_probe.boots(site.console(job)) == 1 and site.state(job).boots == 1, job
    assert all(p.poll() is None for p in site.procs.values())  # every pilot still holds its VM
