"""The control loop's decision (preemption.planner.control): measured CPU demand, not requested
size; a pure function of the observed state; an overloaded node relieved by migration."""

from __future__ import annotations

import pytest

from agent.consolidate import ControlState, observed_vms
from agent.observe import Observation
from preemption.planner import NodeSpec, validate
from preemption.planner.control import ObservedVM, cpu_demand, decide, plan_for
from preemption.planner.experiment import VJobWork, simulate
from vjob.errors import InputError
from vjob.model import Action, ClusterView, Node, VJobState
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
        return [*_vjob("j1", R, ("n1", "n1"), j1_demand), *_vjob("j2", R, ("n2", "n2"), 1),
                *_vjob("j3", W, (None, None), 1)]  # fmt: skip

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


def _status(job: str, node: str, cpu_s: float, at: float, state: PilotState = PilotState.RUNNING) -> PilotStatus:
    return PilotStatus(job_id=job, vm=f"vjob-slurm-{job}", node=node, uri="test:///default", state=state, since=1.0,
                       memory_mb=256, vcpus=1, cpu_seconds=cpu_s, cpu_at=at)  # fmt: skip


def _obs(*pilots: PilotStatus) -> Observation:
    view = ClusterView(now=0.0, nodes=(Node("n1", 2, 4096), Node("n2", 2, 4096)), jobs=())
    return Observation(view=view, pilots={p.job_id: p for p in pilots}, sleeping={}, store_ok=True)


def test_the_agent_measures_demand_from_the_pilots_cpu_counters():
    state = ControlState()
    first = observed_vms(_obs(_status("1", "n1", 100.0, 10.0), _status("2", "n1", 50.0, 10.0)), state, busy=0.5)
    assert [o.demand for o in first] == [1, 1]  # one reading only: the requested size
    later = _obs(_status("1", "n1", 109.0, 20.0), _status("2", "n1", 50.5, 20.0))
    second = observed_vms(later, state, busy=0.5)
    assert [(o.vjob, o.demand) for o in second] == [("1", 1), ("2", 0)]  # 90 % busy; 5 %: idle
    assert observed_vms(later, state, busy=0.5) == second  # no new reading: the same measurement


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
