"""Pinned VMs (a multi-node vjob's): never moved by any placement, refused by the validator, and
the control loop's relief then moves another vjob or suspends the pinned one whole.

Pure: small instances written by hand, random ones (hypothesis), and the control loop's own
observation of a multi-node pilot with a sampler of fixed readings.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.consolidate import ControlState, observed_vms
from agent.observe import Observation
from agent.pilot_coalesce import coalesce
from preemption.decisions import fcfs_selection
from preemption.planner import (
    Instance,
    NodeSpec,
    NoViablePlacementError,
    Plan,
    PlanAction,
    PlanInvalidError,
    VMSpec,
    control,
    make_plan,
    validate,
)
from preemption.planner.cpsat import cpsat_placement
from preemption.planner.improve import pull_forward
from preemption.planner.placement import keep_in_place, sticky_pack
from preemption.planner.plan import plan_cost
from preemption.planner.sequencing import SequencingError, build_plan
from provisioning.profiling import DomainSample
from tests.test_planner_properties import instances, viable_placement_exists
from vjob.errors import InputError
from vjob.model import Action, ClusterView, VJobState
from vjob.pilot_files import PilotState, PilotStatus

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


def _crowded() -> Instance:
    """n1 holds 1100 MB of 1024: a big VM (j6) and a small pinned one (j7's first VM, whose
    second is on n2); n3 is empty. Unpinned, the cheapest relief migrates the small one."""
    nodes = (NodeSpec("n1", 2, 1024), NodeSpec("n2", 2, 1024), NodeSpec("n3", 2, 1024))
    vms = (
        VMSpec("v6", "6", 1, 1000, R, "n1"),
        VMSpec("v7-0", "7", 1, 100, R, "n1", pinned=True),
        VMSpec("v7-1", "7", 1, 100, R, "n2", pinned=True),
    )
    return Instance(nodes, vms, {"6": R, "7": R})


def _unpinned(inst: Instance) -> Instance:
    return Instance(inst.nodes, tuple(dataclasses.replace(v, pinned=False) for v in inst.vms), dict(inst.target))


def _moved(inst: Instance, plan: Plan) -> list[str]:
    """Pinned VMs the plan sends anywhere but their own node."""
    vms = inst.vm_by_id
    return [a.vm for a in plan.actions if vms[a.vm].pinned and a.dst is not None and a.dst != vms[a.vm].host]


@pytest.mark.parametrize("optimizer", ["cpsat", "ffd"])
def test_the_relief_moves_the_other_vjob_not_the_pinned_vm(optimizer: str) -> None:
    inst = _crowded()
    free = make_plan(_unpinned(inst), optimizer=optimizer, time_limit_s=2)  # type: ignore[arg-type]
    assert "v7-0" in {a.vm for a in free.actions if a.kind is Action.MIGRATE}  # what pinning prevents
    plan = make_plan(inst, optimizer=optimizer, time_limit_s=2)  # type: ignore[arg-type]
    validate(inst, plan)
    assert [(a.kind, a.vm, a.src) for a in plan.actions] == [(Action.MIGRATE, "v6", "n1")]
    assert plan.placement["v7-0"] == "n1" and plan.placement["v7-1"] == "n2"


def test_every_placement_heuristic_and_cpsat_keep_pinned_vms_home() -> None:
    inst = _crowded()
    for placed, left in (keep_in_place(inst), sticky_pack(inst)):
        assert not left and placed["v7-0"] == "n1" and placed["v6"] != "n1"
    # CP-SAT without a hint (every VM a variable, every node offered): still home.
    res = cpsat_placement(inst, deadline=time.perf_counter() + 2, reduce=False)
    assert res.placement is not None and res.placement["v7-0"] == "n1" and res.placement["v7-1"] == "n2"


def test_the_validator_refuses_a_plan_that_moves_a_pinned_vm() -> None:
    inst = _crowded()
    plan = build_plan(_unpinned(inst), {"v6": "n1", "v7-0": "n3", "v7-1": "n2"})
    validate(_unpinned(inst), plan)  # sound for an unpinned instance...
    with pytest.raises(PlanInvalidError, match="pool 0: migrate v7-0: the VM is pinned to n1, the plan moves it to n3"):
        validate(inst, plan)  # ...not when v7-0 may not move
    # A resume away from the node holding the state is a move too.
    asleep = Instance(inst.nodes, (VMSpec("a", "j", 1, 100, S, "n1", pinned=True),), {"j": R})
    remote = Plan(pools=((PlanAction(Action.RESUME, "a", "j", "n1", "n2"),),), placement={"a": "n2"}, cost=200)
    with pytest.raises(PlanInvalidError, match="pinned to n1, the plan moves it to n2"):
        validate(asleep, remote)
    local = Plan(pools=((PlanAction(Action.RESUME, "a", "j", "n1", "n1"),),), placement={"a": "n1"}, cost=100)
    validate(asleep, local)


def test_the_improvement_phase_never_pulls_a_pinned_resume_to_another_node() -> None:
    # j0 runs on a and is suspended; pinned j1 sleeps on a: its resume must wait for the suspend
    # (pool 1), although b has room at once.
    nodes = (NodeSpec("a", 1, 1024), NodeSpec("b", 1, 1024))
    vms = (VMSpec("x", "j0", 1, 1024, R, "a"), VMSpec("y", "j1", 1, 512, S, "a", pinned=True))
    inst = Instance(nodes, vms, {"j0": S, "j1": R})
    late = build_plan(inst, {"y": "a"})
    assert [[a.kind for a in p] for p in late.pools] == [[Action.SUSPEND], [Action.RESUME]]
    assert pull_forward(inst, late) is late
    free = pull_forward(_unpinned(inst), build_plan(_unpinned(inst), {"y": "a"}))
    assert free.placement == {"y": "b"}  # what it does to the same VM unpinned
    plan = make_plan(inst, time_limit_s=2)
    validate(inst, plan)
    assert plan.placement == {"y": "a"}


def test_a_pinned_vm_needs_a_node_and_the_json_carries_the_flag() -> None:
    with pytest.raises(InputError, match="vm w: pinned = true: a waiting VM has no node"):
        Instance((NodeSpec("a", 1, 1024),), (VMSpec("w", "j", 1, 100, W, None, pinned=True),))
    inst = _crowded()
    data = inst.to_dict()
    assert [v.get("pinned", False) for v in data["vms"]] == [False, True, True]
    assert Instance.from_dict(data) == inst


def test_no_room_at_home_means_no_placement_not_a_move() -> None:
    # The pinned VM's node holds a pinned VM of the same size that must stay running too: no
    # viable placement, though b is empty (unpinned, one of them would go there).
    nodes = (NodeSpec("a", 1, 1024), NodeSpec("b", 1, 1024))
    vms = (VMSpec("x", "j0", 1, 1024, R, "a", pinned=True), VMSpec("y", "j1", 1, 1024, S, "a", pinned=True))
    with pytest.raises(NoViablePlacementError):
        make_plan(Instance(nodes, vms, {"j0": R, "j1": R}), time_limit_s=2)
    # The decision module does not select it (it sleeps on), so the planner is never asked to.
    sel = fcfs_selection(Instance(nodes, vms), ["j0", "j1"])
    assert sel.target == {"j0": R, "j1": S}
    # Unpinned, the same vjob would be resumed remotely on b.
    assert fcfs_selection(_unpinned(Instance(nodes, vms)), ["j0", "j1"]).target["j1"] is R


@st.composite
def pinned_instances(draw: st.DrawFn) -> Instance:
    inst = draw(instances())
    pins = {j for j in inst.vjobs() if draw(st.booleans())}
    vms = tuple(dataclasses.replace(v, pinned=v.vjob in pins and v.host is not None) for v in inst.vms)
    return Instance(inst.nodes, vms, dict(inst.target))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_instances())
def test_random_plans_never_move_a_pinned_vm(inst: Instance) -> None:
    for optimizer in ("cpsat", "ffd"):
        try:
            plan = make_plan(inst, optimizer=optimizer, time_limit_s=2)  # type: ignore[arg-type]
        except NoViablePlacementError:
            if optimizer == "cpsat":
                assert not viable_placement_exists(inst)
            continue
        except SequencingError:  # a migration cycle with no pivot: allowed, as for any instance
            continue
        validate(inst, plan)
        assert _moved(inst, plan) == []
        assert plan.cost == plan_cost(plan.pools, {v.id: v.mem for v in inst.vms})


def _status(job_id: str, vm: str, **kw: object) -> PilotStatus:
    base = {
        "job_id": job_id,
        "vm": vm,
        "node": "n1",
        "uri": "test:///default",
        "since": 1.0,
        "memory_mb": 1,
        "vcpus": 1,
    }
    return PilotStatus(state=PilotState.RUNNING, **(base | kw))  # type: ignore[arg-type]


def test_the_control_loop_pins_a_multi_node_vjob_and_its_plan_coalesces() -> None:
    # The agent's own path (agent.consolidate.propose up to the executor): n1 holds vjob 6
    # (1000 MiB) and 7's first VM (100 MiB) > 1024. The relief migrates v6, and the plan passes
    # the coalescing (nothing of 7 moves) instead of being refused.
    def sample(name: str, mib: int) -> DomainSample:
        return DomainSample(name, 0.0, 0, 1, memory_kib=mib * 1024)

    readings = {"n1": {"v6": sample("v6", 1000), "v7-0": sample("v7-0", 100)}, "n2": {"v7-1": sample("v7-1", 100)}}
    pilots = {"6": _status("6", "v6"), "7": _status("7", "v7-0", member_nodes=["n1", "n2"], vcpus=2)}
    state = ControlState(sampler=lambda node: readings.get(node, {}))
    obs = Observation(ClusterView(now=0, nodes=(), jobs=()), pilots, {}, True)
    vms = observed_vms(obs, state, busy=0.5)
    assert [(o.vm, o.pinned) for o in vms] == [("v6", False), ("v7-0", True), ("v7-1", True)]
    nodes = [NodeSpec(n, 2, 1024) for n in ("n1", "n2", "n3")]
    for optimizer in ("cpsat", "ffd"):
        plan = control.plan_for(control.decide(nodes, vms, ["6", "7"]), optimizer=optimizer)  # type: ignore[arg-type]
        assert plan is not None and [(a.kind, a.vm) for a in plan.actions] == [(Action.MIGRATE, "v6")]
        assert coalesce(plan, state.members).actions == plan.actions
    # Without n3, v6 has nowhere to go: the relief suspends vjob 7 whole, one request to its pilot.
    plan = control.plan_for(control.decide(nodes[:2], vms, ["6", "7"]))
    assert plan is not None and sorted((a.kind, a.vm) for a in plan.actions) == [
        (Action.SUSPEND, "v7-0"),
        (Action.SUSPEND, "v7-1"),
    ]
    assert coalesce(plan, state.members).actions == [PlanAction(Action.SUSPEND, "v7-0", "7", "n1")]
