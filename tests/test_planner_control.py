"""The control loop's decision (preemption.planner.control): measured CPU demand, not requested
size; a pure function of the observed state; an overloaded node relieved by migration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.consolidate import ControlState, measured_mib, observed_vms
from agent.observe import Observation
from preemption.planner import NodeSpec, validate
from preemption.planner.control import ObservedVM, cpu_demand, decide, plan_for
from preemption.planner.experiment import VJobWork, simulate
from provisioning.profiling import DomainSample, Profiler
from vjob.errors import InputError
from vjob.model import Action, ClusterView, Job, Node, VJobState
from vjob.pilot_files import PilotState, PilotStatus

R, W = VJobState.RUNNING, VJobState.WAITING


def test_cpu_demand_counts_busy_vcpus_from_two_readings():
    assert cpu_demand(10.1, 11.0, 10.0, 10.0, 1) == 0  # 10 % of a CPU: idle
    assert cpu_demand(10.9, 11.0, 10.0, 10.0, 1) == 1
    assert cpu_demand(10.6, 11.0, 10.0, 10.0, 1) == 1  # half busy rounds up: never starved
    assert cpu_demand(13.2, 12.0, 10.0, 10.0, 2) == 2  # 1.6 CPUs of 2
    assert cpu_demand(12.4, 12.0, 10.0, 10.0, 2) == 1
    assert cpu_demand(50.0, 11.0, 10.0, 10.0, 2) == 2  # never more than its vCPUs
    assert cpu_demand(5.0, 11.0, None, None, 2) == 2  # no previous reading: its requested size
    assert cpu_demand(5.0, 11.0, 10.0, 10.0, 1) == 1  # counter went back (a restart): requested size
    with pytest.raises(InputError, match="busy = 0"):
        cpu_demand(1.0, 1.0, 0.0, 0.0, 1, busy=0)


NODES = (NodeSpec("n1", 2, 4096), NodeSpec("n2", 2, 4096))


def _vjob(name: str, state: VJobState, hosts: tuple[str | None, ...], demand: int) -> list[ObservedVM]:
    return [ObservedVM(f"{name}-{i}", name, state, h, 512, 1, demand) for i, h in enumerate(hosts)]


def test_idle_vms_measured_idle_let_a_waiting_vjob_run_where_requested_sizes_would_not():
    def observed(j1_demand: int) -> list[ObservedVM]:
        return [
            *_vjob("j1", R, ("n1", "n1"), j1_demand),
            *_vjob("j2", R, ("n2", "n2"), 1),
            *_vjob("j3", W, (None, None), 1),
        ]

    by_request = decide(NODES, observed(1), ["j1", "j2", "j3"])  # every VM weighs its vCPU
    assert by_request.selection.target["j3"] is W and not by_request.changes
    assert plan_for(by_request) is None

    measured = decide(NODES, observed(0), ["j1", "j2", "j3"])  # j1's VMs wait on I/O: idle
    assert measured.selection.target == {"j1": R, "j2": R, "j3": R}
    plan = plan_for(measured, time_limit_s=2)
    assert plan is not None
    validate(measured.instance, plan)
    assert sorted(a.vm for a in plan.actions if a.kind is Action.RUN) == ["j3-0", "j3-1"]
    assert {plan.placement["j3-0"], plan.placement["j3-1"]} == {"n1"}  # beside the idle VMs


def test_the_decision_is_a_pure_function_of_the_observed_state():
    observed = [*_vjob("a", R, ("n1", "n2"), 1), *_vjob("b", W, (None,), 1), *_vjob("c", W, (None, None), 0)]
    first = decide(NODES, observed, ["c", "a", "b"])
    again = decide(NODES, list(observed), ["c", "a", "b"])
    assert first == again
    # the requested size plays no part once the demand is measured
    bigger = [ObservedVM(o.vm, o.vjob, o.state, o.host, o.mem, 4, o.demand) for o in observed]
    assert decide(NODES, bigger, ["c", "a", "b"]) == first
    # the queue order does: b first takes a CPU c would not have needed, and nothing is refused
    assert decide(NODES, observed, ["b", "a", "c"]).selection.target == first.selection.target


def test_an_overloaded_node_is_relieved_by_migration():
    # Three vjobs' VMs all compute on n1 (2 CPUs); n2 is idle.
    observed = [*_vjob("x", R, ("n1",), 1), *_vjob("y", R, ("n1",), 1), *_vjob("z", R, ("n1",), 1)]
    decision = decide(NODES, observed, ["x", "y", "z"])
    assert decision.overloaded == ("n1",) and decision.changes
    assert set(decision.selection.target.values()) == {R}  # room enough for all: nobody sleeps
    plan = plan_for(decision, time_limit_s=2)
    assert plan is not None
    validate(decision.instance, plan)
    (move,) = plan.actions
    assert (move.kind, move.src, move.dst) == (Action.MIGRATE, "n1", "n2")
    # once relieved, the same measurement asks for nothing more
    after = [ObservedVM(o.vm, o.vjob, o.state, plan.placement[o.vm], o.mem, o.vcpus, o.demand) for o in observed]
    settled = decide(NODES, after, ["x", "y", "z"])
    assert settled.overloaded == () and plan_for(settled) is None


def _status(
    job: str,
    node: str,
    cpu_s: float = 0.0,
    *,
    memory_mb: int = 64,
    vcpus: int = 1,
    state: PilotState = PilotState.RUNNING,
) -> PilotStatus:
    # What the job's user controls: the pilot's own CPU counter, memory and size.
    return PilotStatus(
        job_id=job,
        vm=f"vjob-slurm-{job}",
        node=node,
        uri="test:///default",
        state=state,
        since=1.0,
        memory_mb=memory_mb,
        vcpus=vcpus,
        cpu_seconds=cpu_s,
        cpu_at=10.0 if cpu_s else 0.0,
    )


def _obs(*pilots: PilotStatus, jobs: tuple[Job, ...] = ()) -> Observation:
    view = ClusterView(now=0.0, nodes=(Node("n1", 2, 4096), Node("n2", 2, 4096)), jobs=jobs)
    return Observation(view=view, pilots={p.job_id: p for p in pilots}, sleeping={}, store_ok=True)


class _Hypervisor:
    """What root reads through libvirt on each node: per VM, CPU seconds used, seconds its
    vCPUs waited for a host CPU, current memory and resident set (KiB); advanced by hand."""

    def __init__(self) -> None:
        self.t = 100.0
        self.vms: dict[str, dict[str, tuple[float, float | None, int, int | None]]] = {}
        self.calls: list[str] = []

    def run(self, node: str, vm: str, *, mem_kib: int = 262144, rss_kib: int | None = None) -> None:
        self.vms.setdefault(node, {})[vm] = (0.0, 0.0, mem_kib, rss_kib)

    def advance(self, dt: float, use: dict[str, tuple[float, float | None]]) -> None:
        """`dt` seconds pass; VM → (share of a core used, share waited; None: not reported)."""
        self.t += dt
        for vms in self.vms.values():
            for vm, (cpu, wait, mem, rss) in vms.items():
                u, w = use.get(vm, (0.0, 0.0))
                vms[vm] = (cpu + u * dt, None if w is None else (wait or 0.0) + w * dt, mem, rss)

    def __call__(self, node: str) -> dict[str, DomainSample]:
        self.calls.append(node)
        return {
            vm: DomainSample(
                vm,
                self.t,
                int(cpu * 1e9),
                1,
                memory_kib=mem,
                rss_kib=rss,
                vcpu_delay_ns=None if wait is None else int(wait * 1e9),
            )
            for vm, (cpu, wait, mem, rss) in self.vms.get(node, {}).items()
        }


def test_the_agent_measures_demand_through_libvirt_not_from_the_pilots_files():
    hv = _Hypervisor()
    hv.run("n1", "vjob-slurm-1")
    hv.run("n1", "vjob-slurm-2", mem_kib=786432)
    state = ControlState(sampler=hv)
    # The users' pilots lie: 1 claims it computes nothing, 2 that it is a 64 MiB VM.
    pilots = _obs(_status("1", "n1", cpu_s=0.5), _status("2", "n1", cpu_s=1e6, memory_mb=64))
    first = observed_vms(pilots, state, busy=0.5)
    assert [o.demand for o in first] == [1, 1]  # one sample only: the requested size
    hv.advance(5, {"vjob-slurm-1": (0.9, 0.0), "vjob-slurm-2": (0.05, 0.0)})
    second = observed_vms(pilots, state, busy=0.5)
    assert [(o.vjob, o.demand, o.mem) for o in second] == [("1", 1, 256), ("2", 0, 768)]  # root's figures
    assert hv.calls == ["n1", "n1"]  # one sample per node and step


def test_a_vm_root_cannot_find_on_its_node_weighs_what_the_rms_allocated_and_is_named():
    hv = _Hypervisor()
    hv.run("n1", "vjob-slurm-1")
    state = ControlState(sampler=hv)
    jobs = (Job("1", "alice", rms="slurm", memory_mb=256), Job("2", "bob", rms="slurm", memory_mb=512, cores=2))
    # 2's pilot claims a tiny VM: the RMS's allocation is what root knows (issue 39, item 9)
    pilots = _obs(_status("1", "n1"), _status("2", "n2", memory_mb=16, vcpus=1), jobs=jobs)
    observed_vms(pilots, state, busy=0.5)
    hv.advance(5, {})
    got = {o.vjob: (o.host, o.demand, o.mem) for o in observed_vms(pilots, state, busy=0.5)}
    assert got == {"1": ("n1", 0, 256), "2": ("n2", 2, 512)}
    assert state.unmeasured == ("vjob-slurm-2",)


def test_a_sleeping_vm_keeps_what_root_last_measured_and_its_window_restarts_at_the_resume(tmp_path: Path):
    hv = _Hypervisor()
    hv.run("n1", "vjob-slurm-1", mem_kib=524288)
    state = ControlState(sampler=hv)
    observed_vms(_obs(_status("1", "n1")), state, busy=0.5)
    hv.advance(5, {"vjob-slurm-1": (1.0, 0.0)})
    observed_vms(_obs(_status("1", "n1")), state, busy=0.5)
    (tmp_path / "mem").write_bytes(b"state")
    asleep = replace(
        _status("1", "n1", memory_mb=16), state=PilotState.SAVED, saved_node="n1", memory_path=str(tmp_path / "mem")
    )
    assert asleep.memory_saved
    (o,) = observed_vms(_obs(asleep), state, busy=0.5)
    assert (o.state, o.host, o.demand, o.mem) == (VJobState.SLEEPING, "n1", 1, 512)  # not the pilot's 16 MiB
    hv.advance(600, {})  # asleep ten minutes, then resumed
    (o,) = observed_vms(_obs(_status("1", "n1")), state, busy=0.5)
    assert o.demand == 1  # no window across the sleep (it would read idle): its size until the next sample


def test_a_starved_vm_counts_busy_by_the_time_its_vcpus_waited_for_a_host_cpu():
    # The host oversubscribed: a computing guest gets a third of a core and waits the rest.
    assert cpu_demand(10.33, 11.0, 10.0, 10.0, 1) == 0  # by time used alone it looks idle
    assert cpu_demand(10.33, 11.0, 10.0, 10.0, 1, delay_s=5.6, prev_delay_s=5.0) == 1  # starved: it wanted 0.93
    assert cpu_demand(10.05, 11.0, 10.0, 10.0, 1, delay_s=5.01, prev_delay_s=5.0) == 0  # idle: halted, no wait
    assert cpu_demand(10.3, 11.0, 10.0, 10.0, 2, delay_s=6.5, prev_delay_s=5.0) == 2  # 1.8 CPUs wanted of 2
    assert cpu_demand(10.3, 11.0, 10.0, 10.0, 1, delay_s=1.0, prev_delay_s=5.0) == 0  # delay went back: used only


def test_two_starved_vms_on_a_one_cpu_node_make_it_overloaded_where_time_used_alone_would_not():
    hv = _Hypervisor()
    for vm in ("vjob-slurm-1", "vjob-slurm-2"):
        hv.run("n1", vm)
    hv.run("n2", "vjob-slurm-3")
    state = ControlState(sampler=hv)
    pilots = _obs(_status("1", "n1"), _status("2", "n1"), _status("3", "n2"))
    observed_vms(pilots, state, busy=0.5)
    # 1 and 2 share n1's core under a loaded host (0.3 each, the rest waited); 3 is idle on n2
    hv.advance(5, {"vjob-slurm-1": (0.3, 0.65), "vjob-slurm-2": (0.3, 0.6), "vjob-slurm-3": (0.02, 0.0)})
    observed = observed_vms(pilots, state, busy=0.5)
    nodes = (NodeSpec("n1", 1, 4096), NodeSpec("n2", 1, 4096))
    decision = decide(nodes, observed, ["1", "2", "3"])
    assert [o.demand for o in observed] == [1, 1, 0]
    assert decision.overloaded == ("n1",) and decision.why == ("cpu 2 > 1",)
    plan = plan_for(decision, time_limit_s=2)
    assert plan is not None
    validate(decision.instance, plan)
    (move,) = plan.actions  # one of the two goes beside the idle VM on n2
    assert (move.kind, move.src, move.dst) == (Action.MIGRATE, "n1", "n2")
    # the same host without the wait figures (a kernel without schedstat): nothing seen
    blind = [ObservedVM(o.vm, o.vjob, o.state, o.host, o.mem, o.vcpus, 0) for o in observed]
    assert decide(nodes, blind, ["1", "2", "3"]).overloaded == ()


def test_memory_measured_beyond_a_node_overloads_it_and_is_relieved():
    # Two VMs idle on n1 (1 GiB) but their measured memory (resident set above the balloon) is 1.2 GiB.
    hv = _Hypervisor()
    hv.run("n1", "vjob-slurm-1", mem_kib=262144, rss_kib=614400)
    hv.run("n1", "vjob-slurm-2", mem_kib=262144, rss_kib=614400)
    state = ControlState(sampler=hv)
    pilots = _obs(_status("1", "n1", memory_mb=256), _status("2", "n1", memory_mb=256))
    observed_vms(pilots, state, busy=0.5)
    hv.advance(5, {})
    observed = observed_vms(pilots, state, busy=0.5)
    assert [(o.demand, o.mem) for o in observed] == [(0, 600), (0, 600)]
    nodes = (NodeSpec("n1", 2, 1024), NodeSpec("n2", 2, 1024))
    decision = decide(nodes, observed, ["1", "2"])
    assert decision.overloaded == ("n1",) and decision.why == ("memory 1200 > 1024 MB",)
    plan = plan_for(decision, time_limit_s=2)
    assert plan is not None
    validate(decision.instance, plan)
    (move,) = plan.actions
    assert (move.kind, move.src, move.dst) == (Action.MIGRATE, "n1", "n2")
    # with no room anywhere, the queue's last vjob sleeps
    small = (NodeSpec("n1", 2, 1024),)
    full = decide(small, observed, ["1", "2"])
    assert full.selection.target == {"1": R, "2": VJobState.SLEEPING}
    # the requested sizes (256 MiB each) would have seen nothing
    booked = [ObservedVM(o.vm, o.vjob, o.state, o.host, 256, o.vcpus, o.demand) for o in observed]
    assert decide(nodes, booked, ["1", "2"]).overloaded == ()


def test_the_simulated_cluster_experiment_runs_more_vjobs_at_once_than_fcfs():
    # 3 vjobs of 4 VMs on 3 nodes of 2 CPUs: booked by request, one vjob runs at a time
    # (4 + 4 > 6 CPUs); measured, each needs one CPU, and all three run together.
    jobs = [VJobWork(f"j{k}", (512,) * 4, ((600.0, frozenset({0})), (300.0, frozenset({1})))) for k in range(3)]
    fcfs = simulate("fcfs", jobs, nodes=3, cpus=2, mem=4096, dt=5)
    entropy = simulate("entropy", jobs, nodes=3, cpus=2, mem=4096, dt=5, time_limit_s=1)
    assert fcfs.switches == 0 and fcfs.completion_s >= 3 * 900  # one after the other
    assert entropy.completion_s < 1.5 * 900 < fcfs.completion_s
    assert entropy.switches >= 1 and entropy.actions["run"] == 12
    with pytest.raises(ValueError, match="policy = 'lifo'"):
        simulate("lifo", jobs)


class _Dom:
    def name(self) -> str:
        return "h16probe"


# libvirt 9.0's bulk statistics of a real QEMU guest on this machine (1 vCPU, 256 MiB), recorded.
QEMU_STATS = {
    "state.state": 1,
    "cpu.time": 6723547000,
    "cpu.user": 5026788000,
    "cpu.system": 1696758000,
    "balloon.current": 262144,
    "balloon.maximum": 262144,
    "balloon.swap_in": 0,
    "balloon.swap_out": 0,
    "balloon.major_fault": 0,
    "balloon.minor_fault": 545,
    "balloon.unused": 195084,
    "balloon.rss": 203012,
    "vcpu.current": 1,
    "vcpu.maximum": 1,
    "vcpu.0.state": 1,
    "vcpu.0.time": 6190000000,
    "vcpu.0.wait": 0,
    "vcpu.0.delay": 902258658,
}


def test_libvirts_statistics_give_the_memory_held_and_the_time_the_vcpus_waited():
    sample = Profiler(None)._from_stats(_Dom(), QEMU_STATS, 5.0)  # type: ignore[arg-type]
    assert (sample.memory_kib, sample.rss_kib, sample.vcpu_delay_ns) == (262144, 203012, 902258658)
    assert measured_mib(sample) == 256  # the balloon, larger than QEMU's resident set here
    two = Profiler(None)._from_stats(_Dom(), {**QEMU_STATS, "vcpu.current": 2, "vcpu.1.delay": 1000}, 5.0)  # type: ignore[arg-type]
    assert two.vcpu_delay_ns == 902259658  # summed over the vCPUs
    bare = Profiler(None)._from_stats(_Dom(), {"cpu.time": 5, "balloon.current": 1024}, 5.0)  # type: ignore[arg-type]
    assert (bare.rss_kib, bare.vcpu_delay_ns) == (None, None)  # a host that does not say: unknown, not 0
