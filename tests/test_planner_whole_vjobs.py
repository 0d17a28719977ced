"""vjobs that move whole (`Instance.whole`): one cut of all their VMs, or no move at all.

A multi-node vjob's VMs are one job checkpointed as one consistent cut; moving one of them
live while the others run splits it. Hand-made states where the cheapest plan moves one VM of
such a vjob (the planner without the rule picks it) show the planner moving it by one cut or
moving another vjob, and the validator refusing the partial plans; seeded random instances
check the same on every plan CP-SAT and FFD make.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from preemption.planner import Instance, NodeSpec, Plan, PlanAction, PlanInvalidError, VMSpec, make_plan, validate
from preemption.planner.diagnose import NoViablePlacementError
from preemption.planner.plan import plan_cost
from preemption.planner.sequencing import SequencingError
from vjob.errors import InputError
from vjob.model import Action, VJobState

R, S, W, T = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING, VJobState.TERMINATED


def overloaded(whole: frozenset[str] = frozenset()) -> Instance:
    """n1 holds 3 busy VMs on 2 CPUs: w0 (of the 2-VM vjob w, 256 MB) and two big one-VM vjobs;
    n3 is empty. Cheapest relief: migrate w0 alone (256 MB) — a partial move of w."""
    nodes = (NodeSpec("n1", 2, 8192), NodeSpec("n2", 2, 8192), NodeSpec("n3", 2, 8192))
    vms = (
        VMSpec("w0", "w", 1, 256, R, "n1"),
        VMSpec("w1", "w", 1, 256, R, "n2"),
        VMSpec("a0", "a", 1, 3072, R, "n1"),
        VMSpec("b0", "b", 1, 3072, R, "n1"),
    )
    return Instance(nodes, vms, {}, whole)


def moved_apart(inst: Instance, plan: Plan) -> list[str]:
    """This test's own reading of a plan (not the validator's): the whole vjobs it moves in
    part — a migration of one of their VMs, or a cut that is not all their VMs suspended in one
    pool and all resumed in one later pool."""
    problems: list[str] = []
    suspends: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    resumes: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    vjob_of = {v.id: v.vjob for v in inst.vms}
    for i, pool in enumerate(plan.pools):
        for a in pool:
            j = vjob_of[a.vm]
            if j not in inst.whole:
                continue
            if a.kind is Action.MIGRATE:
                problems.append(f"{j}: migrates {a.vm}")
            elif a.kind is Action.SUSPEND:
                suspends[j][i].add(a.vm)
            elif a.kind is Action.RESUME:
                resumes[j][i].add(a.vm)
    for j in inst.whole:
        vms = {v.id for v in inst.vms if v.vjob == j}
        start = {v.id: v.host for v in inst.vms if v.vjob == j}
        was_running = all(v.state is R for v in inst.vms if v.vjob == j)
        ends_running = inst.target[j] is R
        moved = was_running and ends_running and any(plan.placement.get(v) != start[v] for v in vms)
        if len(suspends[j]) > 1 or len(resumes[j]) > 1:
            problems.append(f"{j}: more than one cut ({dict(suspends[j])}, {dict(resumes[j])})")
        for pools in (suspends[j], resumes[j]):
            for vs in pools.values():
                if vs != vms:
                    problems.append(f"{j}: a cut of {sorted(vs)} only, of {sorted(vms)}")
        if moved and not (suspends[j] and resumes[j] and min(resumes[j]) > max(suspends[j])):
            problems.append(f"{j}: moved without one cut (suspends {dict(suspends[j])}, resumes {dict(resumes[j])})")
    return problems


@pytest.mark.parametrize("optimizer", ["ffd", "cpsat"])
def test_without_the_rule_the_cheapest_relief_moves_one_vm_of_the_vjob(optimizer: str) -> None:
    inst = overloaded()
    plan = make_plan(inst, optimizer=optimizer, time_limit_s=3, workers=1)  # type: ignore[arg-type]
    migrated = [a.vm for a in plan.actions if a.kind is Action.MIGRATE]
    assert migrated == ["w0"], plan.to_text()  # the partial move this file is about


@pytest.mark.parametrize("optimizer", ["ffd", "cpsat"])
def test_a_vjob_that_moves_whole_is_moved_by_one_cut_or_left_alone(optimizer: str) -> None:
    inst = overloaded(frozenset({"w"}))
    plan = make_plan(inst, optimizer=optimizer, time_limit_s=3, workers=1)  # type: ignore[arg-type]
    validate(inst, plan)
    assert moved_apart(inst, plan) == [], plan.to_text()
    w_actions = [a for a in plan.actions if a.vjob == "w"]
    assert not any(a.kind is Action.MIGRATE for a in plan.actions if a.vjob == "w")
    if w_actions:  # moved: all of w in one cut, then all resumed, w0 elsewhere
        assert [a.kind for a in plan.pools[0] if a.vjob == "w"] == [Action.SUSPEND, Action.SUSPEND]
        assert plan.placement["w0"] != "n1" or plan.placement["w1"] != "n2"
    else:  # or another vjob moved off n1
        assert {a.vm for a in plan.actions if a.kind is Action.MIGRATE} & {"a0", "b0"}


def test_the_cut_is_chosen_when_it_is_the_cheapest_whole_move() -> None:
    """Here the two other VMs are dear (3072 MB each to migrate): a cut of w (suspend 2 × 256,
    then one remote and one local resume: 1792 in the cost model) costs less, and both
    optimizers take it."""
    inst = overloaded(frozenset({"w"}))
    for optimizer in ("ffd", "cpsat"):
        plan = make_plan(inst, optimizer=optimizer, time_limit_s=3, workers=1)  # type: ignore[arg-type]
        kinds = {(a.kind, a.vm) for a in plan.actions}
        assert {(Action.SUSPEND, "w0"), (Action.SUSPEND, "w1"), (Action.RESUME, "w0"), (Action.RESUME, "w1")} <= kinds
        resumes = [i for i, pool in enumerate(plan.pools) for a in pool if a.kind is Action.RESUME]
        assert len(set(resumes)) == 1 and resumes[0] > 0, plan.to_text()


def _plan(inst: Instance, pools: list[list[PlanAction]], placement: dict[str, str]) -> Plan:
    frozen = tuple(tuple(p) for p in pools)
    return Plan(frozen, placement, plan_cost(frozen, {v.id: v.mem for v in inst.vms}))


def test_the_validator_refuses_partial_moves() -> None:
    inst = overloaded(frozenset({"w"}))
    home = {"w1": "n2", "a0": "n1", "b0": "n1"}
    partial = _plan(inst, [[PlanAction(Action.MIGRATE, "w0", "w", "n1", "n3")]], {**home, "w0": "n3"})
    with pytest.raises(PlanInvalidError, match=r"migrate w0: vjob w moves only whole .*a partial move"):
        validate(inst, partial)
    validate(overloaded(), partial)  # the same plan is fine for a vjob not marked whole (Entropy's)
    half_cut = _plan(
        inst,
        [[PlanAction(Action.SUSPEND, "w0", "w", "n1")], [PlanAction(Action.RESUME, "w0", "w", "n1", "n3")]],
        {**home, "w0": "n3"},
    )
    for marked in (inst, overloaded()):  # one VM saved while the other runs: never a cut
        with pytest.raises(PlanInvalidError, match=r"pool 0: vjob w is suspended with w1 left running: a partial cut"):
            validate(marked, half_cut)
    whole_cut = _plan(
        inst,
        [
            [PlanAction(Action.SUSPEND, "w0", "w", "n1"), PlanAction(Action.SUSPEND, "w1", "w", "n2")],
            [PlanAction(Action.RESUME, "w0", "w", "n1", "n3"), PlanAction(Action.RESUME, "w1", "w", "n2", "n2")],
        ],
        {**home, "w0": "n3", "w1": "n2"},
    )
    validate(inst, whole_cut)
    two_cuts = _plan(
        inst,
        [
            *whole_cut.pools,
            [PlanAction(Action.SUSPEND, "w0", "w", "n3"), PlanAction(Action.SUSPEND, "w1", "w", "n2")],
            [PlanAction(Action.RESUME, "w0", "w", "n3", "n3"), PlanAction(Action.RESUME, "w1", "w", "n2", "n2")],
        ],
        whole_cut.placement,
    )
    with pytest.raises(PlanInvalidError, match=r"vjob w: its suspends are split over pools \[0, 2\]"):
        validate(inst, two_cuts)


def test_whole_in_the_instance_json() -> None:
    inst = overloaded(frozenset({"w"}))
    data = inst.to_dict()
    assert data["whole"] == ["w"]
    assert Instance.from_dict(data).whole == {"w"}
    assert "whole" not in overloaded().to_dict()
    assert inst.with_target({"a": S}).whole == {"w"}
    with pytest.raises(InputError, match=r"whole: 'ghost': unknown vjob"):
        Instance.from_dict(data | {"whole": ["ghost"]})


def random_instance(rng: random.Random) -> Instance:
    """Nodes of 2–3 CPUs; vjobs of 1–3 VMs, running (often overbooking a node), sleeping or
    waiting, with a random target; about half the multi-VM vjobs move only whole."""
    nodes = tuple(
        NodeSpec(f"n{i}", rng.choice((2, 3)), rng.choice((2048, 3072, 4096))) for i in range(rng.randint(3, 5))
    )
    vms: list[VMSpec] = []
    target: dict[str, VJobState] = {}
    whole: set[str] = set()
    nxt = {W: (W, R), R: (R, R, S, T), S: (S, R)}
    for j in range(rng.randint(2, 5)):
        state = rng.choice((R, R, S, W))
        size = rng.randint(1, 3)
        target[f"j{j}"] = rng.choice(nxt[state])
        if size > 1 and rng.random() < 0.6:
            whole.add(f"j{j}")
        for k in range(size):
            host = rng.choice(nodes).id if state is not W else None
            vms.append(VMSpec(f"j{j}v{k}", f"j{j}", rng.choice((0, 1, 1)), rng.choice((256, 512, 1024)), state, host))
    mem: dict[str, int] = defaultdict(int)
    for v in vms:
        if v.state is R and v.host is not None:
            mem[v.host] += v.mem
    fixed = []
    for v in vms:  # a running configuration fits in memory (CPUs may be overbooked, as in the paper)
        if v.state is R and v.host is not None and mem[v.host] > next(n.mem for n in nodes if n.id == v.host):
            mem[v.host] -= v.mem
            v = VMSpec(v.id, v.vjob, v.cpu, v.mem, S, v.host)
        fixed.append(v)
    states = {v.vjob: v.state for v in fixed}
    for v in fixed:  # a vjob's VMs share one state: demoted VMs make their vjob sleep
        if states[v.vjob] is not v.state:
            states[v.vjob] = S
    vms = [VMSpec(v.id, v.vjob, v.cpu, v.mem, states[v.vjob], v.host) for v in fixed]
    ok = {W: (W, R), R: (R, S, T), S: (S, R)}
    target = {j: (t if t in ok[states[j]] else states[j]) for j, t in target.items()}
    return Instance(nodes, tuple(vms), target, frozenset(whole))


def test_seeded_random_instances_never_move_a_whole_vjob_in_part() -> None:
    """120 seeded instances, CP-SAT and FFD: every plan valid, no whole vjob moved in part (this
    test's own check), a cut made in some of them, and a plan found whenever the same
    instance without the rule has one (a cut frees its nodes first: it never blocks a plan)."""
    cuts = plans = 0
    for seed in range(120):
        inst = random_instance(random.Random(seed))
        free = Instance(inst.nodes, inst.vms, inst.target)
        for optimizer in ("cpsat", "ffd"):
            try:
                reference = make_plan(free, optimizer=optimizer, time_limit_s=2, workers=1)  # type: ignore[arg-type]
            except (NoViablePlacementError, SequencingError):
                reference = None
            try:
                plan = make_plan(inst, optimizer=optimizer, time_limit_s=2, workers=1)  # type: ignore[arg-type]
            except (NoViablePlacementError, SequencingError) as exc:
                assert reference is None or optimizer == "ffd", f"seed {seed}: no plan with whole vjobs: {exc}"
                continue
            plans += 1
            validate(inst, plan)
            assert moved_apart(inst, plan) == [], f"seed {seed} {optimizer}:\n{plan.to_text()}"
            whole_cut = {a.vjob for a in plan.actions if a.kind is Action.RESUME and inst.target[a.vjob] is R}
            cuts += any(j in inst.whole and all(v.state is R for v in inst.vjobs()[j]) for j in whole_cut)
    assert plans > 150 and cuts >= 5, (plans, cuts)
