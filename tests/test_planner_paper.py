"""The Entropy paper's planning examples (Figures 7, 8, 9) and the plan cost model (Table 1)."""

from __future__ import annotations

import pytest

from preemption.planner import (
    Instance,
    NodeSpec,
    Plan,
    PlanAction,
    PlanInvalidError,
    VMSpec,
    build_plan,
    make_plan,
    plan_cost,
    validate,
)
from vjob.model import Action, VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


def kinds(plan: Plan) -> list[list[tuple[str, str]]]:
    return [sorted((a.kind.value, a.vm) for a in pool) for pool in plan.pools]


def test_figure7_migration_waits_for_the_suspend_that_frees_its_destination() -> None:
    # N2 cannot hold VM1 while VM2 is there: migrate(VM1) must come after suspend(VM2).
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 2048), NodeSpec("N2", 2, 2048)),
        vms=(VMSpec("VM1", "a", 1, 1024, R, "N1"), VMSpec("VM2", "b", 1, 1536, R, "N2")),
        target={"b": S},
    )
    plan = build_plan(inst, {"VM1": "N2"})
    assert kinds(plan) == [[("suspend", "VM2")], [("migrate", "VM1")]]
    # suspend costs 1536; the migration pays the first pool (1536) plus its own 1024.
    assert plan.cost == 1536 + (1536 + 1024)
    validate(inst, plan)


def test_figure8_migration_cycle_is_broken_through_a_pivot_node() -> None:
    # VM1 and VM2 swap nodes, and neither node can hold both: N3 serves as the pivot.
    inst = Instance(
        nodes=(NodeSpec("N1", 1, 1024), NodeSpec("N2", 1, 1024), NodeSpec("N3", 1, 1024)),
        vms=(VMSpec("VM1", "a", 1, 1024, R, "N1"), VMSpec("VM2", "b", 1, 1024, R, "N2")),
    )
    plan = build_plan(inst, {"VM1": "N2", "VM2": "N1"})
    validate(inst, plan)
    assert len(plan.pools) == 3
    first = plan.pools[0]
    assert len(first) == 1 and first[0].kind is Action.MIGRATE and first[0].dst == "N3"
    bypassed = first[0].vm
    other = "VM2" if bypassed == "VM1" else "VM1"
    assert [(a.vm, a.src, a.dst) for a in plan.pools[1]] == [(other, inst.vm_by_id[other].host, first[0].src)]
    assert [(a.vm, a.src) for a in plan.pools[2]] == [(bypassed, "N3")]
    assert plan.cost == 1024 + (1024 + 1024) + (2048 + 1024)


def test_figure8_cycle_without_any_pivot_room_is_an_error() -> None:
    from preemption.planner import SequencingError

    inst = Instance(
        nodes=(NodeSpec("N1", 1, 1024), NodeSpec("N2", 1, 1024)),
        vms=(VMSpec("VM1", "a", 1, 1024, R, "N1"), VMSpec("VM2", "b", 1, 1024, R, "N2")),
    )
    with pytest.raises(SequencingError, match="no pivot node"):
        build_plan(inst, {"VM1": "N2", "VM2": "N1"})


def figure9() -> Instance:
    # suspend(VM3) frees N2 for run(VM6); migrate(VM1) frees N1 for the local resume(VM5).
    return Instance(
        nodes=(NodeSpec("N1", 2, 2048), NodeSpec("N2", 2, 2048), NodeSpec("N3", 2, 2048)),
        vms=(
            VMSpec("VM1", "j1", 1, 1536, R, "N1"),
            VMSpec("VM3", "j3", 1, 2048, R, "N2"),
            VMSpec("VM5", "j5", 1, 1024, S, "N1"),
            VMSpec("VM6", "j6", 1, 1024, W, None),
        ),
        target={"j3": S, "j5": R, "j6": R},
    )


def test_figure9_four_actions_in_two_pools() -> None:
    inst = figure9()
    plan = build_plan(inst, {"VM1": "N3", "VM5": "N1", "VM6": "N2"})
    assert kinds(plan) == [[("migrate", "VM1"), ("suspend", "VM3")], [("resume", "VM5"), ("run", "VM6")]]
    resume = next(a for a in plan.pools[1] if a.kind is Action.RESUME)
    assert resume.local
    # pool 1 costs 2048 (the suspend); resume is local (1024), run is free.
    assert plan.cost == 2048 + 1536 + (2048 + 1024) + (2048 + 0)
    validate(inst, plan)


def test_optimiser_never_does_worse_than_the_figure9_placement() -> None:
    inst = figure9()
    hand = build_plan(inst, {"VM1": "N3", "VM5": "N1", "VM6": "N2"})
    best = make_plan(inst, optimizer="cpsat", time_limit_s=5)
    validate(inst, best)
    assert best.cost <= hand.cost


def test_resumes_of_one_vjob_share_one_pool() -> None:
    # a1 could resume at once on N2, but a2 needs N1, freed only by the suspend of b.
    inst = Instance(
        nodes=(NodeSpec("N1", 1, 1024), NodeSpec("N2", 1, 1024)),
        vms=(
            VMSpec("b1", "b", 1, 1024, R, "N1"),
            VMSpec("a1", "a", 1, 1024, S, "N2"),
            VMSpec("a2", "a", 1, 1024, S, "N1"),
        ),
        target={"a": R, "b": S},
    )
    plan = build_plan(inst, {"a1": "N2", "a2": "N1"})
    assert kinds(plan) == [[("suspend", "b1")], [("resume", "a1"), ("resume", "a2")]]
    validate(inst, plan)


def test_overloaded_start_is_relieved_by_suspends_in_the_first_pool() -> None:
    # Three busy VMs on a 2-CPU node: the decision suspends vjob c; nothing may land on N1 meanwhile.
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 4096), NodeSpec("N2", 2, 4096)),
        vms=(
            VMSpec("a", "a", 1, 512, R, "N1"),
            VMSpec("b", "b", 1, 512, R, "N1"),
            VMSpec("c", "c", 1, 512, R, "N1"),
            VMSpec("d", "d", 1, 512, W, None),
        ),
        target={"c": S, "d": R},
    )
    plan = make_plan(inst, optimizer="cpsat", time_limit_s=5)
    validate(inst, plan)
    assert plan.placement["d"] == "N2"  # N1 is overloaded during pool 0, N2 takes d at once
    assert len(plan.pools) == 1


def test_cost_model_follows_table1() -> None:
    mem = {"m": 1000, "s": 500, "rl": 300, "rr": 200, "run": 700, "stop": 900}
    pools = [
        [PlanAction(Action.MIGRATE, "m", "x", "A", "B"), PlanAction(Action.SUSPEND, "s", "y", "A")],
        [
            PlanAction(Action.RESUME, "rl", "z", "A", "A"),
            PlanAction(Action.RESUME, "rr", "w", None, "B"),
            PlanAction(Action.RUN, "run", "v", None, "A"),
            PlanAction(Action.STOP, "stop", "u", "B"),
        ],
    ]
    # pool 0 costs 1000 (migrate); pool 1 actions: 300 local, 400 remote, 0, 0, each + 1000.
    assert plan_cost(pools, mem) == (1000 + 500) + (4 * 1000 + 300 + 400)


def test_validator_rejects_a_migration_started_with_the_suspend_that_frees_room() -> None:
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 2048), NodeSpec("N2", 2, 2048)),
        vms=(VMSpec("VM1", "a", 1, 1024, R, "N1"), VMSpec("VM2", "b", 1, 1536, R, "N2")),
        target={"b": S},
    )
    pool = (PlanAction(Action.SUSPEND, "VM2", "b", "N2"), PlanAction(Action.MIGRATE, "VM1", "a", "N1", "N2"))
    bad = Plan(pools=(pool,), placement={"VM1": "N2"}, cost=1536 + 1024)
    with pytest.raises(PlanInvalidError, match="node N2 receives VMs while holding"):
        validate(inst, bad)


def test_validator_rejects_split_resumes_wrong_source_and_wrong_cost() -> None:
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 4096), NodeSpec("N2", 2, 4096)),
        vms=(VMSpec("a1", "a", 1, 512, S, "N1"), VMSpec("a2", "a", 1, 512, S, "N2")),
        target={"a": R},
    )
    split = Plan(
        pools=(
            (PlanAction(Action.RESUME, "a1", "a", "N1", "N1"),),
            (PlanAction(Action.RESUME, "a2", "a", "N2", "N2"),),
        ),
        placement={"a1": "N1", "a2": "N2"},
        cost=512 + 512 + 512,
    )
    with pytest.raises(PlanInvalidError, match="resumes are split"):
        validate(inst, split)
    wrong_source = Plan(
        pools=((PlanAction(Action.RESUME, "a1", "a", "N2", "N1"), PlanAction(Action.RESUME, "a2", "a", "N2", "N2")),),
        placement={"a1": "N1", "a2": "N2"},
        cost=1024 + 512,
    )
    with pytest.raises(PlanInvalidError, match="resume a1: the VM is not sleeping with its state"):
        validate(inst, wrong_source)
    good_pool = (PlanAction(Action.RESUME, "a1", "a", "N1", "N1"), PlanAction(Action.RESUME, "a2", "a", "N2", "N2"))
    validate(inst, Plan(pools=(good_pool,), placement={"a1": "N1", "a2": "N2"}, cost=1024))
    with pytest.raises(PlanInvalidError, match="cost 1 announced, the cost model gives 1024"):
        validate(inst, Plan(pools=(good_pool,), placement={"a1": "N1", "a2": "N2"}, cost=1))


def test_validator_rejects_a_plan_that_misses_the_target() -> None:
    inst = Instance(
        nodes=(NodeSpec("N1", 2, 4096),),
        vms=(VMSpec("v", "j", 1, 512, R, "N1"),),
        target={"j": VJobState.TERMINATED},
    )
    with pytest.raises(PlanInvalidError, match="end: vm v of vjob j is running, target terminated"):
        validate(inst, Plan(pools=(), placement={}, cost=0))
    stop = Plan(pools=((PlanAction(Action.STOP, "v", "j", "N1"),),), placement={}, cost=0)
    validate(inst, stop)


def test_deferring_a_dear_resume_makes_the_plan_cheaper() -> None:
    # Four 1 GB suspends free B for two runs; a remote resume (4096) in the first pool would
    # make both runs wait for it. Held back, it comes after the runs (whose pool costs 0).
    vms = [VMSpec(f"m{i}", "M", 1, 1024, R, "B") for i in range(4)]
    vms += [VMSpec("w1", "W", 1, 1024, W), VMSpec("w2", "W", 1, 1024, W), VMSpec("r", "Z", 1, 2048, S, None)]
    inst = Instance(
        nodes=(NodeSpec("A", 4, 2048), NodeSpec("B", 4, 4096)),
        vms=tuple(vms),
        target={"M": S, "W": R, "Z": R},
    )
    placement = {"r": "A", "w1": "B", "w2": "B"}
    eager = build_plan(inst, placement)
    assert eager.cost == 4 * 1024 + 4096 + 2 * 4096
    deferred = build_plan(inst, placement, defer_above=1024)
    validate(inst, deferred)
    assert kinds(deferred) == [
        [("suspend", "m0"), ("suspend", "m1"), ("suspend", "m2"), ("suspend", "m3")],
        [("run", "w1"), ("run", "w2")],
        [("resume", "r")],
    ]
    assert deferred.cost == 4 * 1024 + 2 * 1024 + (1024 + 0 + 4096)
    assert make_plan(inst, time_limit_s=5).cost <= deferred.cost
