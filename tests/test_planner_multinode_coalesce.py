"""A plan over a multi-node vjob's VMs turned into its pilot's one request, or refused whole.

Pure: plans written by hand (and one from the planner), the control loop's observation of a
multi-node pilot with a sampler of fixed readings, and the refusal journalled in a SQLite store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from agent import consolidate
from agent.consolidate import ControlState, members_of, observed_vms
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.pilot_coalesce import NOT_STARTED, MembersMoved, coalesce, journal_refusal
from preemption.decisions import fcfs_selection
from preemption.planner import Plan, PlanAction, control
from preemption.planner.instance import Instance, NodeSpec
from provisioning.profiling import DomainSample
from tests.agent_steps import control_step
from vjob.config import parse
from vjob.model import Action, ClusterView, Node, VJobState
from vjob.pilot_files import PilotState, PilotStatus
from vjob.store import journal
from vjob.store.db import Store

M = {"7": (("v7-0", "n1"), ("v7-1", "n2"), ("v7-2", "n3"))}
S, R, MG, ST = Action.SUSPEND, Action.RESUME, Action.MIGRATE, Action.STOP


def _plan(*pools: tuple[PlanAction, ...]) -> Plan:
    return Plan(pools=tuple(pools), placement={}, cost=0)


def _members(kind: Action, moves: Mapping[str, tuple[str | None, str | None]] | None = None) -> tuple[PlanAction, ...]:
    moves = moves or {}
    return tuple(PlanAction(kind, vm, "7", *moves.get(vm, (node, node if kind is R else None))) for vm, node in M["7"])


@pytest.mark.parametrize("kind", [S, R, ST])
def test_all_members_in_one_pool_become_one_action_on_the_pilots_first_vm(kind: Action):
    other = PlanAction(S, "v8", "8", "n1")
    out = coalesce(_plan((other, *_members(kind))), M)
    want = PlanAction(kind, "v7-0", "7", "n1", "n1" if kind is R else None)
    assert out.pools == ((other, want),)


def test_vjobs_of_one_vm_per_pilot_keep_their_actions():
    plan = _plan((PlanAction(S, "a", "1", "n1"), PlanAction(S, "b", "1", "n2")), (PlanAction(R, "c", "2", "n1", "n2"),))
    assert coalesce(plan, M).pools == plan.pools


@pytest.mark.parametrize(
    ("pools", "says"),
    [
        (((PlanAction(MG, "v7-1", "7", "n2", "n1"),),), "migrates its VMs (v7-1 n2→n1)"),
        (((*_members(S)[:2], PlanAction(MG, "v7-2", "7", "n3", "n1")),), "migrates its VMs (v7-2 n3→n1)"),
        ((_members(R, {"v7-2": ("n3", "n1")}),), "resumes its VMs away from the nodes they slept on (v7-2 n3→n1)"),
        ((_members(R, {"v7-0": ("n2", "n1")}),), "(v7-0 n2→n1)"),  # a member's state copied from another node
        ((_members(S)[:2],), "not one action for all its 3 VMs"),
        ((_members(S)[:2], _members(S)[2:]), "in pools 0, 1"),
        (((*_members(S)[:2], PlanAction(ST, "v7-2", "7", "n3")),), "suspend v7-0, suspend v7-1, stop v7-2"),
    ],
)
def test_a_plan_that_moves_or_splits_a_multi_node_vjob_is_refused_naming_it(pools, says):
    with pytest.raises(MembersMoved, match="vjob 7") as err:
        coalesce(_plan(*pools), M)
    assert says in str(err.value)
    assert err.value.actions and all(a.vjob == "7" for a in err.value.actions)


def _status(state: PilotState, **kw) -> PilotStatus:
    base = {
        "job_id": "7",
        "vm": "v7-0",
        "node": "n1",
        "uri": "test:///default",
        "since": 1.0,
        "memory_mb": 1,
        "vcpus": 3,
    }
    return PilotStatus(state=state, **(base | kw))


def test_a_multi_node_pilot_is_each_of_its_vms_measured_on_its_node():
    st = _status(PilotState.RUNNING, member_nodes=["n1", "n2", "n3"])
    assert members_of(st) == list(M["7"])
    assert members_of(_status(PilotState.RUNNING)) == [("v7-0", "n1")]  # one VM: the pilot's own
    assert members_of(_status(PilotState.RUNNING, vm="v7", member_nodes=["n1", "n2"])) == [("v7", "n1")]

    def sample(name: str, cpu_s: float, t: float) -> DomainSample:
        return DomainSample(name, t, int(cpu_s * 1e9), 1, memory_kib=300 * 1024)

    readings = {
        "n1": [{"v7-0": sample("v7-0", 0, 0)}, {"v7-0": sample("v7-0", 9.5, 10)}],
        "n2": [{"v7-1": sample("v7-1", 0, 0)}, {"v7-1": sample("v7-1", 0.1, 10)}],
        "n3": [{}, {}],
    }
    calls = {n: 0 for n in readings}

    def sampler(node: str) -> dict[str, DomainSample]:
        calls[node] += 1
        return readings[node][calls[node] - 1]

    obs = Observation(ClusterView(now=0, nodes=(), jobs=()), {"7": st}, {}, True)
    state = ControlState(sampler=sampler)
    observed_vms(obs, state, busy=0.5)
    vms = observed_vms(obs, state, busy=0.5)
    assert [(o.vm, o.vjob, o.host, o.demand, o.mem) for o in vms] == [
        ("v7-0", "7", "n1", 1, 300),  # computing: one CPU wanted
        ("v7-1", "7", "n2", 0, 300),  # idle: the planner sees the vjob's real size
        ("v7-2", "7", "n3", 1, 1),  # not found on n3: its requested size, named
    ]
    assert state.unmeasured == ("v7-2",) and state.members == {"7": M["7"]}

    asleep = _status(PilotState.SAVED, member_nodes=["n1", "n2", "n3"], saved_node="n1", memory_path=__file__)
    slept = observed_vms(Observation(obs.view, {"7": asleep}, {}, True), state, busy=0.5)
    assert [(o.vm, o.state, o.host, o.mem) for o in slept] == [
        ("v7-0", VJobState.SLEEPING, "n1", 300),
        ("v7-1", VJobState.SLEEPING, "n2", 300),
        ("v7-2", VJobState.SLEEPING, "n3", 1),
    ]


def test_the_planners_suspend_of_a_multi_node_vjob_is_one_request():
    # Two nodes of 1 CPU; vjob 6 (one VM) and the multi-node vjob 7 both compute on n1 and n2:
    # FCFS keeps 6, the plan suspends 7's VMs, coalesced into one suspend of its pilot.
    members = {"7": (("v7-0", "n1"), ("v7-1", "n2"))}
    nodes = [NodeSpec("n1", 1, 1024), NodeSpec("n2", 1, 1024)]
    vms = [control.ObservedVM("v6", "6", VJobState.RUNNING, "n1", 100, 1, 1)] + [
        control.ObservedVM(vm, "7", VJobState.RUNNING, node, 100, 1, 1) for vm, node in members["7"]
    ]
    plan = control.plan_for(control.decide(nodes, vms, ["6", "7"]), optimizer="ffd")
    assert plan is not None and sorted(a.vm for a in plan.actions) == ["v7-0", "v7-1"]
    assert coalesce(plan, members).actions == [PlanAction(S, "v7-0", "7", "n1")]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refused_plan_is_journalled_failed_with_the_reason_and_nothing_done(store: Store):
    plan = _plan((PlanAction(S, "v8", "8", "n1"),), (PlanAction(MG, "v7-1", "7", "n2", "n1"),))
    with pytest.raises(MembersMoved) as err:
        coalesce(plan, M)
    report = journal_refusal(
        store,
        plan,
        err.value,
        reason=f"consolidation refused: {err.value}",
        tag="t",
        job_key=lambda a: f"slurm:{a.vjob}",
    )
    assert report.state == "failed" and report.pools_done == 0 and not report.done
    assert [a.vm for a in report.not_started] == ["v8"] and [a.vm for a, _ in report.failed] == ["v7-1"]
    sw = journal.load(store, report.switch_id)
    assert sw.state == "failed" and sw.reason.startswith("consolidation refused: vjob 7")
    assert sw.plan["executor"] == "t"
    errors = journal.action_times(store, report.switch_id)
    rows = {x.vm_name: (x.state, errors[x.id][2]) for x in sw.actions}
    assert rows["v8"] == ("failed", NOT_STARTED)
    assert rows["v7-1"][0] == "failed" and "not moved VM by VM" in rows["v7-1"][1]
    assert journal.open_switches(store) == []  # nothing for the recovery to carry on


class _NoRMS:
    name = "slurm"

    def __getattr__(self, name: str):
        raise AssertionError(f"the control step called the adapter's {name}")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_control_step_refuses_a_plan_that_migrates_a_member_before_asking_any_pilot(
    store: Store, tmp_path, monkeypatch: pytest.MonkeyPatch
):
    # n1 holds vjob 6 (1000 MiB) and 7's first VM (100 MiB): 1100 > 1024. The loop pins 7's VMs,
    # so its relief migrates v6 (the request to 6's pilot fails here: no pilot runs), never 7.
    def sample(name: str, mib: int) -> DomainSample:
        return DomainSample(name, 0.0, 0, 1, memory_kib=mib * 1024)

    readings = {"n1": {"v6": sample("v6", 1000), "v7-0": sample("v7-0", 100)}, "n2": {"v7-1": sample("v7-1", 100)}}
    cfg = parse({"data_dir": str(tmp_path / "data"), "planner": {"interval_s": 30, "optimizer": "ffd"}})
    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    pilots = {
        "6": _status(PilotState.RUNNING, job_id="6", vm="v6", vcpus=1),
        "7": _status(PilotState.RUNNING, member_nodes=["n1", "n2"], vcpus=2),
    }
    view = ClusterView(now=0, nodes=tuple(Node(n, 2, 1024) for n in ("n1", "n2", "n3")), jobs=())
    state = ControlState(sampler=lambda node: readings.get(node, {}))
    moved = control_step(agent.ports, Observation(view, pilots, {}, True), state)
    assert state.plan is not None and [(a.kind, a.vm) for a in state.plan.actions] == [(MG, "v6")]
    assert moved is not None and [a.vm for a, _ in moved.failed] == ["v6"] and not state.refused

    # The safety net: a planner blind to the pins (the same instance unpinned) migrates v7-0,
    # the cheapest relief; the step refuses the plan whole and journals why; no pilot is asked.
    def unpinned(decision: control.ControlDecision, **kw) -> Plan | None:
        inst = decision.instance
        vms = tuple(dataclasses.replace(v, pinned=False) for v in inst.vms)
        free = dataclasses.replace(decision, instance=Instance(inst.nodes, vms, dict(inst.target)))
        return control.plan_for(dataclasses.replace(free, selection=fcfs_selection(free.instance, ["6", "7"])), **kw)

    monkeypatch.setattr(consolidate, "plan_for", unpinned)
    state = ControlState(sampler=lambda node: readings.get(node, {}))
    report = control_step(agent.ports, Observation(view, pilots, {}, True), state)
    assert state.plan is not None and [(a.kind, a.vm) for a in state.plan.actions] == [(MG, "v7-0")]
    assert report is not None and report.state == "failed" and not report.done
    assert "vjob 7: the plan migrates its VMs (v7-0 n1→" in report.failed[0][1]
    sw = journal.load(store, report.switch_id)
    assert sw.state == "failed" and "not moved VM by VM" in sw.reason
    assert [(a.action, a.vm_name, a.state) for a in sw.actions] == [("migrate", "v7-0", "failed")]
    assert not (tmp_path / "data" / "pilots").exists()  # no request written anywhere
    # the next step, same state: the same refusal is logged, not journalled again
    assert control_step(agent.ports, Observation(view, pilots, {}, True), state) is None
    assert [sw.id for sw in journal.recent(store)] == [report.switch_id, moved.switch_id]
