"""End to end on the real development cluster with real QEMU guests (devkit.demo_scenario).

Batch vjobs running the counter guest fill the cluster, each `-N2` job two VMs (one per node,
as a real image gets); an interactive `srun` arrives. The agent must checkpoint the
lowest-priority victims — both VMs of each in one cut — requeue-hold them, let the interactive
job start, then release the victims, whose guests continue counting (one boot, no counter going
back), with Pn = 1 in the store. The second test kills the agent with SIGKILL in the middle of
the switch and restarts it: no VM may be lost and no job may stay running with its VM saved.
"""

from __future__ import annotations

import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devkit.demo_scenario import Scenario
from devkit.guest_probe import boots, split_counters
from provisioning.driver import Driver
from tests.services import wait_for
from vjob.config import load
from vjob.model import VMState
from vjob.pilot_files import PilotState, vms_of

pytestmark = [pytest.mark.slurm, pytest.mark.realvm]

INTERACTIVE_BOUND_S = 90.0
"""A generous bound for CI on 2 shared cores; the demo measures about 5 s on a quiet machine."""


@pytest.fixture
def scenario(slurm_cluster, libvirt_system):
    # Not under pytest's tmp_path: QEMU runs as libvirt-qemu and must traverse to the VM disks,
    # and pytest makes its temporary directories owner-only.
    base = Path(tempfile.mkdtemp(prefix="vjob-e2e-", dir="/var/tmp"))
    base.chmod(0o711)
    made: list[Scenario] = []

    def make(**kwargs) -> Scenario:
        sc = Scenario(slurm_cluster, base / f"run{len(made)}", **kwargs)
        made.append(sc)
        sc.prepare()
        return sc

    yield make
    for sc in made:
        _tell(sc)
        sc.cleanup()
    shutil.rmtree(base, ignore_errors=True)


def _tell(sc: Scenario) -> None:
    """What a failed run leaves to look at (pytest shows a teardown's stderr only on failure):
    the agent's warnings, errors and switches, and each pilot's last state and history."""
    try:
        lines = (sc.work / "agent.log").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    keep = ("warning", "error", "switch", "checkpoint", "released", "resumed", "plan")
    for line in [ln for ln in lines if any(k in ln for k in keep)][-80:]:
        print(f"agent: {line[:600]}", file=sys.stderr)
    for job in sc.jobs:
        st = sc.pilot(job)
        what = "no state" if st is None else f"{st.state.value} {st.vm} {st.member_nodes} {st.message[:200]!r}"
        print(
            f"pilot {job}: {what}; history {[(h['state'], round(h['at'], 1)) for h in (st.history if st else [])]}",
            file=sys.stderr,
        )
        try:
            output = (sc.work / "out" / f"{job}.out").read_text(errors="replace").splitlines()
        except OSError:
            output = []
        for line in [ln for ln in output if "COUNTER" not in ln][-15:]:
            print(f"job {job} output: {line[:300]}", file=sys.stderr)


def _rms_states(sc: Scenario) -> dict[str, str]:
    res = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %r", "-j", ",".join(sc.jobs)],
        env=sc.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {line.split()[0]: line.split(maxsplit=1)[1] for line in res.stdout.splitlines()}


def test_interactive_job_preempts_batch_vjobs_which_resume_and_continue(scenario):
    sc = scenario(batch_jobs=4, nodes_per_batch=2, interactive_nodes=4)
    sc.start_agent()
    sc.submit_batch()
    sc.wait_guests_counting()
    started_s = sc.run_interactive(timeout_s=2 * INTERACTIVE_BOUND_S)  # no victim: a clear error, not 600 s
    assert started_s < INTERACTIVE_BOUND_S

    victims = sc.victims()
    assert len(victims) == 2, "four nodes are needed and each vjob holds two"
    resumed = sc.wait_resumed(victims)
    assert sorted(resumed) == sorted(victims)
    for v in victims:  # the resumed guests go on counting
        log = Path(sc.pilot(v).console_log)
        wait_for(
            lambda log=log, v=v: len(split_counters(log, sc.pilot(v).console_bytes_at_save)[1]) >= 2,
            120,
            f"job {v}'s guest counting after its resume",
        )
    out = sc.outcome(started_s, victims, resumed)
    assert out.work_lost_s == 0
    for v in victims:
        before, after = out.counters[v]
        assert after == before + 1, f"job {v}: counter went {before} -> {after} across its checkpoint"
        assert out.preempt_counts[v] == 1
        st = sc.pilot(v)
        assert st.boots == 1 and st.restores == 1 and st.state is PilotState.RUNNING
    untouched = [j for j in sc.jobs if j not in victims]
    assert all(sc.pilot(j).restores == 0 for j in untouched)
    _each_victim_is_two_vms_cut_once_and_running_again(sc, victims)


def _each_victim_is_two_vms_cut_once_and_running_again(sc: Scenario, victims: list[str]) -> None:
    """Each victim is a vjob of two VMs (one per node, `vjob-slurm-<id>-0` and `-1`): the agent
    recorded both, journalled a suspend of each (done) and had its pilot save them in one cut
    (one save, Pn = 1); resumed, both run again without a second boot."""
    with sqlite3.connect(sc.data / "vjob.sqlite") as conn:
        suspends = conn.execute("SELECT job_key, vm_name, state FROM actions WHERE action = 'suspend'").fetchall()
        recorded = {row[0] for row in conn.execute("SELECT name FROM vms")}
    cfg = load(sc.config)
    driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
    try:
        for v in victims:
            st = sc.pilot(v)
            placed = vms_of(st)
            names = [vm for vm, _node in placed]
            assert names == [f"vjob-slurm-{v}-0", f"vjob-slurm-{v}-1"], f"job {v}: VMs {placed}"
            assert set(names) <= recorded, f"job {v}: the store records {sorted(recorded)}"
            mine = sorted((vm, state) for key, vm, state in suspends if key == f"slurm:{v}")
            assert mine == [(vm, "done") for vm in names], f"job {v}: journalled suspends {mine}"
            assert [h["state"] for h in st.history].count("saved") == 1, f"job {v}: saved more than once"
            for vm, node in placed:
                assert driver.state(vm, node) is VMState.RUNNING, f"{vm} on {node} not running after the resume"
                assert boots(driver.console_log(vm, node)) == 1, f"{vm} booted again instead of being restored"
    finally:
        driver.close()


def _switch_running(db: Path) -> bool:
    if not db.exists():
        return False
    with sqlite3.connect(db, timeout=5) as conn:
        return conn.execute("SELECT count(*) FROM switches WHERE state = 'running'").fetchone()[0] > 0


def test_agent_killed_mid_switch_finishes_it_after_restart_and_loses_no_vm(scenario):
    _kill_mid_switch(scenario, kill_delay_s=0.0)


@pytest.mark.soak
@pytest.mark.parametrize("round_", range(6))
def test_agent_killed_at_random_points_of_a_switch_loses_nothing(scenario, round_):
    """Soak: the same, with the kill at a random point of the switch (before the request, while
    the pilot saves, after the save but before the requeue-hold)."""
    _kill_mid_switch(scenario, kill_delay_s=random.Random(round_).uniform(0.0, 2.5))


def _kill_mid_switch(scenario, *, kill_delay_s: float) -> None:
    sc = scenario(batch_jobs=2, nodes_per_batch=4, interactive_nodes=4)
    sc.start_agent()
    sc.submit_batch()
    sc.wait_guests_counting()
    srun = subprocess.Popen(
        ["srun", "-N4", "--exclusive", "/bin/true"],
        env=sc.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _switch_running(sc.data / "vjob.sqlite"), 120, "a switch in progress", interval=0.05)
        time.sleep(kill_delay_s)
        sc.stop_agent(signal.SIGKILL)
        time.sleep(2)  # the victim's pilot saves its VM meanwhile and waits to be requeued

        sc.start_agent()
        srun.wait(timeout=120)
        assert srun.returncode == 0, srun.stderr.read() if srun.stderr else ""
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    with sqlite3.connect(sc.data / "vjob.sqlite") as conn:
        states = [row[0] for row in conn.execute("SELECT state FROM switches ORDER BY id")]
    assert states and states[0] in ("done", "rolled_back") and "running" not in states

    # Every VM is accounted for: running behind a running job, or saved behind a held one.
    def consistent() -> bool:
        rms = _rms_states(sc)
        for job in sc.jobs:
            st = sc.pilot(job)
            running = rms.get(job, "").startswith("RUNNING")
            if running and st.state is PilotState.RUNNING:
                continue
            if not running and st.state is PilotState.SAVED and st.memory_saved:
                continue
            return False
        return True

    wait_for(consistent, 120, "every vjob consistent (VM running with its job, or saved behind a held job)")
    # The victims come back once the interactive job is gone, their guests continuing.
    victims = sc.victims()
    assert victims
    assert sorted(sc.wait_resumed(victims)) == sorted(victims)
    wait_for(consistent, 60, "every vjob running again")
    out = sc.outcome(0.0, victims, victims)
    assert out.work_lost_s == 0
    assert all(out.preempt_counts[v] == 1 for v in victims)
