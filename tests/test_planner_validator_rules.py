"""The plan validator's rules one at a time, each on a plan that breaks only it (validator.py).

Why: the validator is what stands between a planner bug and an overloaded node, and mutation
testing (devkit/mutation.py, docs/development.md) found rules no test broke alone: a pinned VM
moved, a migration or a stop from the wrong node, room freed by a VM that left, the message's
"(and N more)". A rule that nothing breaks can be turned around unnoticed.
"""

from __future__ import annotations

import pytest

from preemption.planner import Instance, NodeSpec, Plan, PlanAction, VMSpec, validate
from preemption.planner.plan import plan_cost
from preemption.planner.validator import PlanInvalidError
from vjob.model import Action, VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


def _plan(inst: Instance, *pools: tuple[PlanAction, ...], placement: dict[str, str]) -> Plan:
    return Plan(pools=pools, placement=placement, cost=plan_cost(pools, {v.id: v.mem for v in inst.vms}))


def _problems(inst: Instance, plan: Plan) -> list[str]:
    with pytest.raises(PlanInvalidError) as err:
        validate(inst, plan)
    return err.value.problems


TWO = (NodeSpec("N1", 2, 2048), NodeSpec("N2", 2, 2048))


def test_a_pinned_vm_may_change_state_on_its_node_but_never_move() -> None:
    pinned = Instance(TWO, (VMSpec("v", "a", 1, 512, R, "N1", pinned=True),), {"a": R})
    move = PlanAction(Action.MIGRATE, "v", "a", "N1", "N2")
    assert _problems(pinned, _plan(pinned, (move,), placement={"v": "N2"})) == [
        "pool 0: migrate v: the VM is pinned to N1, the plan moves it to N2"
    ]
    asleep = Instance(TWO, (VMSpec("v", "a", 1, 512, S, "N1", pinned=True),), {"a": R})
    home = PlanAction(Action.RESUME, "v", "a", "N1", "N1")
    validate(asleep, _plan(asleep, (home,), placement={"v": "N1"}))  # resumed where it is pinned
    suspend = Instance(TWO, (VMSpec("v", "a", 1, 512, R, "N1", pinned=True),), {"a": S})
    validate(suspend, _plan(suspend, (PlanAction(Action.SUSPEND, "v", "a", "N1"),), placement={}))


@pytest.mark.parametrize(
    ("action", "why"),
    [
        (PlanAction(Action.MIGRATE, "v", "a", "N2", "N1"), "the VM is not running at 'N2'"),  # it runs on N1
        (PlanAction(Action.MIGRATE, "v", "a", "N1", "N1"), "the VM is not running at 'N1'"),  # to itself
        (PlanAction(Action.STOP, "v", "a", "N2"), "the VM is not running at 'N2'"),
        (PlanAction(Action.SUSPEND, "v", "a", "N2"), "the VM is not running at 'N2'"),
    ],
)
def test_an_action_from_the_wrong_node_is_refused(action: PlanAction, why: str) -> None:
    target = {Action.MIGRATE: R, Action.STOP: VJobState.TERMINATED, Action.SUSPEND: S}[action.kind]
    inst = Instance(TWO, (VMSpec("v", "a", 1, 512, R, "N1"),), {"a": target})
    placement = {"v": action.dst} if action.dst else {}
    problems = _problems(inst, _plan(inst, (action,), placement=placement))
    assert any(why in p for p in problems), problems


def test_room_a_vm_leaves_is_free_for_the_next_pool() -> None:
    """v1 fills N1 and migrates away in pool 0; v2 starts on N1 in pool 1: sound."""
    inst = Instance(
        (NodeSpec("N1", 1, 1024), NodeSpec("N2", 1, 1024)),
        (VMSpec("v1", "a", 1, 1024, R, "N1"), VMSpec("v2", "b", 1, 1024, W)),
        {"a": R, "b": R},
    )
    plan = _plan(
        inst,
        (PlanAction(Action.MIGRATE, "v1", "a", "N1", "N2"),),
        (PlanAction(Action.RUN, "v2", "b", None, "N1"),),
        placement={"v1": "N2", "v2": "N1"},
    )
    validate(inst, plan)
    crowded = _plan(inst, (PlanAction(Action.RUN, "v2", "b", None, "N1"),), placement={"v1": "N1", "v2": "N1"})
    assert any("node N1 receives VMs while holding cpu 2/1" in p for p in _problems(inst, crowded))


def test_the_message_shows_five_problems_and_counts_the_rest() -> None:
    inst = Instance(TWO, (), {})
    for n, tail in ((5, ""), (6, " (and 1 more)"), (7, " (and 2 more)")):
        plan = Plan(
            pools=(tuple(PlanAction(Action.RUN, f"x{k}", "a", None, "N1") for k in range(n)),), placement={}, cost=0
        )
        with pytest.raises(PlanInvalidError) as err:
            validate(inst, plan)
        shown = "; ".join(f"pool 0: run x{k}: unknown vm" for k in range(5))
        assert str(err.value) == f"invalid plan: {shown}{tail}"
        assert len(err.value.problems) == n


@pytest.mark.parametrize(
    ("node", "vm", "held"),
    [
        ((1, 1024), (1, 512), "cpu 2/1, mem 1024/1024"),  # the CPU is taken
        ((4, 1024), (1, 768), "cpu 2/4, mem 1536/1024"),  # the memory is taken
    ],
)
def test_a_node_filled_in_one_pool_receives_nothing_more_in_the_next(
    node: tuple[int, int], vm: tuple[int, int], held: str
) -> None:
    inst = Instance(
        (NodeSpec("N1", *node), NodeSpec("N2", *node)),
        (VMSpec("v1", "a", *vm, W), VMSpec("v2", "b", *vm, W)),
        {"a": R, "b": R},
    )
    plan = _plan(
        inst,
        (PlanAction(Action.RUN, "v1", "a", None, "N1"),),
        (PlanAction(Action.RUN, "v2", "b", None, "N1"),),
        placement={"v1": "N1", "v2": "N1"},
    )
    assert any(f"pool 1: node N1 receives VMs while holding {held}" in p for p in _problems(inst, plan))


def test_a_node_left_over_its_memory_alone_is_not_viable_at_the_end() -> None:
    """Enough CPUs, too little memory, and nothing arriving: only the end check can see it."""
    inst = Instance(
        (NodeSpec("N1", 4, 1024),),
        (VMSpec("v1", "a", 1, 768, R, "N1"), VMSpec("v2", "b", 1, 768, R, "N1")),
        {"a": R, "b": R},
    )
    problems = _problems(inst, Plan(pools=(), placement={"v1": "N1", "v2": "N1"}, cost=0))
    assert problems == ["end: node N1 is not viable (cpu 2/4, mem 1536/1024)"]
