"""Live remapping in the agent, end to end on real pilots over libvirt's test driver.

Two vjobs run through real pilots (`vjob run`): job 11 on a slow node, job 12 on a fast one.
The remapping step samples them (the hypervisor's readings: 11 busy, 12 idle), decides a swap,
and carries it out as a journalled switch of two `migrate` actions through the pilots; the store
then records each VM on its new host, a restarted agent believes the pilots' off-allocation
nodes from the journal, and `vjob status` shows the real hosts and the moves. When job 12 ends,
job 11 goes home to the node the RMS allocated it.

The test driver cannot migrate between two libvirts, so both nodes are the same test-driver
libvirt in each pilot: there the migration is libvirt's "already there" and the pilot moves its
VM's node; the real live migration between two libvirtds is tests/test_remap_live.py's (realvm).
The sampler is the test's (each pilot's test driver lives in its own process, out of the
agent's sight); the libvirt sampler itself is tested on a test-driver node below.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from agent import observe as agent_observe
from agent.arbiter import TickPlan
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pilot_performer import EXECUTOR_TAG, PilotRequestPerformer
from agent.recover import finish_live_switches
from agent.remap_step import RemapState, libvirt_sampler, summary
from agent.status_cmd import collect
from preemption.planner.plan import Plan, PlanAction
from preemption.remap.claims import PassClaims
from provisioning.driver import Driver
from provisioning.profiling import DomainSample
from provisioning.vm_types import DriverError
from tests.agent_steps import remap_look
from tests.services import wait_for
from tests.services.libvirt import make_test_node
from vjob import log
from vjob.config import Config, parse
from vjob.model import Action, ClusterView, Job, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import journal
from vjob.store import vms as store_vms
from vjob.store.db import Store

pytestmark = pytest.mark.libvirt
REPO = Path(__file__).resolve().parents[1]
FARM = """
[[subcluster]]
name = "slow"
nodes = 1
cores_per_node = 1
memory_mb_per_node = 2048
freq_ghz = 1.0
cycles = { cycles = 1.0 }
[[subcluster]]
name = "fast"
nodes = 1
cores_per_node = 1
memory_mb_per_node = 4096
freq_ghz = 3.0
cycles = { cycles = 1.0 }
"""
NODES = (Node("s1", 1, 2048, features=("slow",)), Node("f1", 1, 4096, features=("fast",)))


class _NoRMS:
    """The remapping step never asks the RMS anything: the observation carries its view."""

    name = "slurm"

    def __getattr__(self, name: str):
        raise AssertionError(f"the remapping step called the adapter's {name}")


@pytest.fixture
def site(tmp_path: Path):
    (tmp_path / "farm.toml").write_text(FARM)
    # Remapping on for the pilots too (the farm file): only then does a pilot hold its node for a
    # VM a swap lent it, since only the remap step releases it.
    (tmp_path / "vjob.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n'
        f'[remap]\nfarm_file = "{tmp_path / "farm.toml"}"\n'
    )
    # Job 11's pilot holds its node 3 s at most when nobody releases it (the default is 25 s).
    (tmp_path / "vjob-11.toml").write_text((tmp_path / "vjob.toml").read_text() + "partner_hold_s = 3\n")
    procs: list[subprocess.Popen[str]] = []
    yield tmp_path, procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def _cfg(path: Path, db_url: str) -> Config:
    return parse(
        {
            "data_dir": str(path / "data"),
            "database": {"url": db_url},
            "agent": {"checkpoint_timeout_s": 60},
            "remap": {"farm_file": str(path / "farm.toml"), "tau_s": 50, "beta": 20, "threshold_s": 10},
        }
    )


def _pilot(site, job: str, node: str) -> subprocess.Popen[str]:
    path, procs = site
    conf = path / f"vjob-{job}.toml" if (path / f"vjob-{job}.toml").exists() else path / "vjob.toml"
    cmd = [
        sys.executable,
        "-m",
        "vjob.cli",
        "--config",
        str(conf),
        "run",
        "--job-id",
        job,
        "--node",
        node,
        "--memory",
        "128",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(proc)
    return proc


def _st(site, job: str) -> PilotStatus:
    st = PilotDir(site[0] / "data" / "pilots", "slurm", job).read_state()
    assert st is not None
    return st


def _job(job: str, node: str) -> Job:
    return Job(job, "alice", rms="slurm", state=JobState.RUNNING, allocated_nodes=(node,), start_time=time.time())


class _Hypervisor:
    """What libvirt would report of each VM: CPU time growing at `share` of a vCPU per second,
    on a clock that advances one window τ per sample of a node, and its current memory."""

    def __init__(self, share: Mapping[str, float], memory_mib: Mapping[str, int]) -> None:
        self.share = share
        self.memory_mib = memory_mib
        self.calls: dict[str, int] = {}

    def __call__(self, node: str, vms: Sequence[str]) -> Mapping[str, DomainSample]:
        t = 50.0 * self.calls.get(node, 0)
        self.calls[node] = self.calls.get(node, 0) + 1
        return {
            vm: DomainSample(vm, t, int(self.share[vm] * t * 1e9), 1, memory_kib=self.memory_mib[vm] * 1024)
            for vm in vms
        }


def test_a_busy_vjob_on_a_slow_node_swaps_with_an_idle_one_journalled_stored_and_shown(site, store: Store, db_url: str):
    path, procs = site
    _pilot(site, "11", "s1")
    _pilot(site, "12", "f1")
    for j in ("11", "12"):
        pdir = PilotDir(path / "data" / "pilots", "slurm", j)
        wait_for(lambda: pdir.exists() and _st(site, j).state is PilotState.RUNNING, 60, f"pilot {j}")  # noqa: B023
    cfg = _cfg(path, db_url)
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    jobs = (_job("11", "s1"), _job("12", "f1"))

    def observation(jobs: tuple[Job, ...]) -> Observation:
        view = ClusterView(now=time.time(), nodes=NODES, jobs=jobs)
        return Observation(view, {j.id: _st(site, j.id) for j in jobs}, {}, True)

    # The balloon act on libvirt's test driver: the pilots' domains live in the pilots' processes,
    # so the agent's driver sees copies defined as a remappable pilot defines them (ceiling 3 GiB,
    # booted with the 128 MiB asked), one per node: whichever node a VM lands on, it is there.
    memory = Driver(
        parse({"provisioning": {"nodes": {n: make_test_node(path / "nodes", n) for n in ("s1", "f1")}}}).provisioning,
        data_dir=path / "agent-libvirt",
    )
    for n in ("s1", "f1"):
        for vm in ("vjob-slurm-11", "vjob-slurm-12"):
            memory.connection(n).defineXML(BALLOONED.format(name=vm)).create()
    # libvirt holds 512 MiB for 11's VM (its pilot's state file says 128): T^M is priced on 512.
    hypervisor = _Hypervisor({"vjob-slurm-11": 1.0, "vjob-slurm-12": 0.0}, {"vjob-slurm-11": 512, "vjob-slurm-12": 128})
    state = RemapState(sampler=hypervisor, memory=memory)
    assert remap_look(agent.ports, observation(jobs), state) is None  # the first samples: no window yet
    assert state.decisions == [] and set(state.samples) == {"vjob-slurm-11", "vjob-slurm-12"}
    assert remap_look(agent.ports, observation(jobs), state) is None  # τ has not passed: no new look
    state.last_profile -= cfg.remap.tau_s  # τ later, but the vjob policy suspends 12 in this tick
    assert remap_look(agent.ports, observation(jobs), state, PassClaims(suspending=frozenset({"12"}))) is None
    assert state.decisions == [] and summary(state)["skipped"] == {"12": "the vjob policy suspends it this tick"}
    shown = {v["job"]: v["remap_skipped"] for v in collect(cfg, "slurm")["vjobs"]}  # why, in `vjob status`
    assert shown == {"11": None, "12": "the vjob policy suspends it this tick"}
    state.last_profile -= cfg.remap.tau_s  # τ later: 12, not sampled in the claimed tick, has no window yet
    assert remap_look(agent.ports, observation(jobs), state) is None and state.decisions == []
    state.last_profile -= cfg.remap.tau_s

    report = remap_look(agent.ports, observation(jobs), state)
    assert report is not None and report.state == "done", report
    (d,) = summary(state)["decisions"]
    assert d["kind"] == "swap" and set(d["jobs"]) == {"11", "12"}
    assert _st(site, "11").memory_mb == 128
    assert d["gain_s"] == pytest.approx(50 * (2 / 3) * 20 - (512 + 128) * 1.2 / 110)
    assert (_st(site, "11").node, _st(site, "12").node) == ("f1", "s1")

    sw = journal.load(store, report.switch_id)
    assert sw.state == "done" and sw.reason.startswith("remap: ") and sw.plan["executor"] == EXECUTOR_TAG
    assert sorted((a.action, a.rms_job_id, a.source, a.state) for a in sw.actions) == [
        ("migrate", "11", "s1", "done"),
        ("migrate", "12", "f1", "done"),
    ]
    assert [(m.rms_job_id, m.source, m.destination) for m in journal.migrations(store, "slurm")] in (
        [("11", "s1", "f1"), ("12", "f1", "s1")],
        [("12", "f1", "s1"), ("11", "s1", "f1")],
    )
    assert [v.node for v in store_vms.of_job(store, "slurm", "11")] == ["f1"]
    assert [v.node for v in store_vms.of_job(store, "slurm", "12")] == ["s1"]
    # Each moved VM got its new kind's memory per slot: 11 the fast kind's 4096 bounded by its
    # domain's 3072 ceiling, 12 the slow kind's 2048 — set live through the driver.
    got = {t["job"]: (t["node"], t["kind"], t["from_mib"], t["mib"]) for t in summary(state)["memory"]}
    assert got == {"11": ("f1", "fast", 128, 3072), "12": ("s1", "slow", 128, 2048)}
    assert memory.memory("vjob-slurm-11", "f1") == (3072, 3072) and memory.memory("vjob-slurm-12", "s1") == (2048, 3072)

    # A restarted agent (nothing in memory) believes the pilots' off-allocation nodes: the journal moved them.
    fresh = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent_observe._remember_vms(fresh.ports, store, list(jobs), {j.id: _st(site, j.id) for j in jobs})
    assert {j: n for j, (n, _img) in fresh.ports.recorded_vms.items()} == {"11": "f1", "12": "s1"}
    # ... and not a pilot that claims a node nobody moved it to.
    liar = {"11": _st(site, "11"), "12": _st(site, "12").moved(PilotState.RUNNING, node="f9")}
    fresh.ports.recorded_vms.clear()
    agent_observe._remember_vms(fresh.ports, store, list(jobs), liar)
    assert set(fresh.ports.recorded_vms) == {"11"}

    status = {v["job"]: v for v in collect(cfg, "slurm")["vjobs"]}
    assert (status["11"]["node"], status["11"]["hosts"], status["11"]["migrations"]) == ("f1", ["f1"], ["s1->f1"])
    assert (status["12"]["node"], status["12"]["hosts"], status["12"]["migrations"]) == ("s1", ["s1"], ["f1->s1"])

    # Within τ again: nothing more (the bound and the threshold are the policy's tests).
    assert remap_look(agent.ports, observation(jobs), state) is None

    # Job 12 ends (the RMS's SIGTERM): its VM is saved on s1, and 11's VM still runs on f1, 12's
    # own node. Its pilot does not end the job yet — the RMS would free f1 under 11's VM — but
    # holds it (bounded) until the agent sends 11 home and releases it.
    procs[1].send_signal(signal.SIGTERM)
    wait_for(lambda: _st(site, "12").state is PilotState.SAVED, 60, "12 saved on SIGTERM")
    time.sleep(0.5)
    assert procs[1].poll() is None  # holding f1: the RMS still runs job 12
    report = remap_look(agent.ports, observation(jobs), state)
    assert report is not None and report.state == "done", report
    assert state.released == ["12"]  # 11 went home in this step: nothing foreign on f1 any more
    out, _ = procs[1].communicate(timeout=20)
    assert procs[1].returncode == 0 and "holding f1" in out and "not released" not in out, out
    assert _st(site, "12").request_id == "release-vjob-slurm-12"
    assert [(m["vm"], m["src"], m["dst"], m["why"]) for m in summary(state)["moves"]] == [
        ("vjob-slurm-11", "f1", "s1", "home")
    ]
    assert _st(site, "11").node == "s1"
    assert [v.node for v in store_vms.of_job(store, "slurm", "11")] == ["s1"]
    assert collect(cfg, "slurm")["vjobs"][0]["migrations"] == ["s1->f1", "f1->s1"]
    # Home on the slow kind: 11's balloon goes back down to its kind's 2048 (never below the 128 asked).
    assert [(t["job"], t["node"], t["mib"]) for t in summary(state)["memory"]] == [("11", "s1", 2048)]
    # 12 gone from the RMS
    assert remap_look(agent.ports, observation(jobs[:1]), state) is None and state.released == []
    assert memory.memory("vjob-slurm-11", "s1") == (2048, 3072)
    memory.close()

    # An agent killed right after journalling a remapping move: the next one finishes it from the journal.
    move = PlanAction(Action.MIGRATE, "vjob-slurm-11", "11", "s1", "f1")
    plan = Plan(pools=((move,),), placement={move.vm: "f1"}, cost=1, optimizer="remap")
    journal.open_switch(
        store,
        "remap: 11 swap",
        plan.to_dict() | {"executor": EXECUTOR_TAG},
        [journal.PlannedAction(0, "migrate", move.vm, "slurm:11", "s1", "f1")],
    )
    performer = PilotRequestPerformer(lambda a: PilotDir(path / "data" / "pilots", "slurm", a.vjob), timeout_s=60)
    (finished,) = finish_live_switches(store, "slurm", lambda _sw: performer, log.get("test"))
    assert finished.state == "done" and _st(site, "11").node == "f1"
    assert [m.destination for m in journal.migrations(store, "slurm", ["11"])] == ["f1", "s1", "f1"]

    # 11 ends away from s1 again and no agent releases it: its pilot holds s1 for its bound, then
    # ends anyway (fail open: a hook never holds the RMS longer than the bound).
    procs[0].send_signal(signal.SIGTERM)
    out, _ = procs[0].communicate(timeout=60)
    assert procs[0].returncode == 0 and "holding s1 (at most 3 s)" in out and "not released within 3 s" in out, out


BALLOONED = """<domain type='test'><name>{name}</name><memory unit='MiB'>3072</memory>
<currentMemory unit='MiB'>128</currentMemory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"""
DOMAIN = """<domain type='test'><name>{name}</name><memory>131072</memory><vcpu>1</vcpu>
<os><type>hvm</type></os></domain>"""


def test_the_libvirt_sampler_reads_each_nodes_vms_through_the_drivers_connection(tmp_path: Path) -> None:
    uri = make_test_node(tmp_path / "nodes", "n1")
    driver = Driver(parse({"provisioning": {"nodes": {"n1": uri}}}).provisioning, data_dir=tmp_path)
    conn = driver.connection("n1")
    for name in ("vm1", "vm2"):
        conn.defineXML(DOMAIN.format(name=name)).create()
    sample = libvirt_sampler(driver.connection)
    first = sample("n1", ["vm1"])
    again = sample("n1", ["vm1", "vm2"])
    assert set(first) == {"vm1"} and set(again) == {"vm1", "vm2"}
    assert again["vm1"].t > first["vm1"].t and again["vm1"].cpu_time_ns >= first["vm1"].cpu_time_ns > 0
    perf = conn.lookupByName("vm1").perfEvents()  # turned on once, when first sampled
    assert perf["instructions"] and perf["cpu_cycles"]
    with pytest.raises(DriverError, match="ghost"):
        sample("n1", ["ghost"])
    driver.close()


def test_a_pilot_whose_guest_ends_away_from_its_own_node_holds_it_until_released(tmp_path: Path) -> None:
    # In this process (a subprocess pilot's test driver is out of reach): the pilot runs in the
    # main thread; "the agent" migrates its VM to f1, the guest then ends there by itself, and the
    # pilot holds s1 — where a swap partner's VM would run — until the release comes.
    from pilot.pilot import Pilot
    from pilot.settings import PilotSettings
    from pilot.specs import TINY_IMAGE, guest_spec
    from pilot.vm import DriverVM
    from vjob.pilot_files import RequestKind

    driver = Driver(parse({"provisioning": {"default_uri": "test:///default"}}).provisioning, data_dir=tmp_path)
    name = "vjob-slurm-hold-21"
    vm = DriverVM(driver, name, "s1", lambda: guest_spec(TINY_IMAGE, name, 128, None))
    settings = PilotSettings("slurm", "21", "s1", TINY_IMAGE, 128, poll_s=0.05, partner_hold_s=60)
    pdir = PilotDir(tmp_path / "pilots", "slurm", "21")
    out = io.StringIO()
    pilot = Pilot(settings, pdir, vm, out=out, err=out)
    seen: list[str] = []
    in_run = threading.Event()  # set while pilot.run() has not returned

    def agent() -> None:
        try:
            steps()
        finally:
            if not seen:  # a step failed: end the pilot (as SIGTERM would) rather than hang the test
                pilot.signals.terminate.set()
                pilot.signals.wake.set()

    def steps() -> None:
        def state() -> PilotStatus | None:
            return pdir.read_state() if pdir.exists() else None

        wait_for(lambda: (st := state()) is not None and st.state is PilotState.RUNNING, 30, "pilot running")
        pdir.request(RequestKind.MIGRATE, "m1", node="f1")
        wait_for(lambda: (st := state()) is not None and st.request_id == "m1" and st.node == "f1", 30, "migrated")
        driver.connection("f1").lookupByName(name).destroy()  # the job's guest ends, on f1
        wait_for(lambda: (st := state()) is not None and st.state is PilotState.FINISHED, 30, "finished")
        time.sleep(0.5)
        seen.append("holding" if in_run.is_set() else "gone")
        pdir.request(RequestKind.RELEASE, "release-21")

    runner = threading.Thread(target=agent)
    in_run.set()
    runner.start()
    try:
        code = pilot.run()  # signal handlers: the main thread's
    finally:
        in_run.clear()
        runner.join(timeout=60)
        driver.close()
    assert code == 0
    assert seen == ["holding"]  # the pilot had not ended half a second after its guest did
    text = out.getvalue()
    assert "guest ended" in text and "holding s1" in text and "not released" not in text, text
    st = pdir.read_state()
    assert st is not None and st.state is PilotState.FINISHED and st.request_id == "release-21"


def test_a_bad_farm_file_is_logged_and_the_tick_goes_on(tmp_path: Path) -> None:
    cfg = parse({"data_dir": str(tmp_path / "data"), "remap": {"farm_file": str(tmp_path / "none.toml")}})
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    view = ClusterView(now=time.time(), nodes=NODES, jobs=())
    agent._remap(Observation(view, {}, {}, True), TickPlan(remap=True))  # no exception: logged and counted
    assert agent.metrics.errors.labels(kind="remap")._value.get() == 1
