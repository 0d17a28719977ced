"""Generated instances: every plan passes the validator, CP-SAT is never dearer than FFD, and a
plan exists exactly when a viable placement exists (checked by brute force on small instances).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.planner import Instance, NodeSpec, NoViablePlacementError, VMSpec, make_plan, validate
from preemption.planner.sequencing import SequencingError
from preemption.planner.workload import generate
from vjob.model import VJobState

R, S, W, T = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING, VJobState.TERMINATED
NEXT = {W: (W, R), R: (R, S, T), S: (S, R)}


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    n_nodes = draw(st.integers(2, 4))
    nodes = tuple(
        NodeSpec(f"n{i}", draw(st.integers(1, 3)), draw(st.sampled_from((1024, 2048, 3072)))) for i in range(n_nodes)
    )
    n_jobs = draw(st.integers(1, 4))
    vms: list[VMSpec] = []
    target: dict[str, VJobState] = {}
    for j in range(n_jobs):
        state = draw(st.sampled_from((W, R, S)))
        target[f"j{j}"] = draw(st.sampled_from(NEXT[state]))
        for k in range(draw(st.integers(1, 3))):
            cpu = draw(st.integers(0, 1))
            mem = draw(st.sampled_from((256, 512, 1024)))
            host = None
            if state is R or (state is S and draw(st.booleans())):
                host = draw(st.sampled_from(nodes)).id
            vms.append(VMSpec(f"j{j}v{k}", f"j{j}", cpu, mem, state, host))
    return Instance(nodes, tuple(vms), target)


def viable_placement_exists(inst: Instance) -> bool:
    to_run = inst.to_run()
    for combo in itertools.product(inst.nodes, repeat=len(to_run)):
        if any(vm.pinned and node.id != vm.host for vm, node in zip(to_run, combo, strict=True)):
            continue  # a pinned VM runs at home or not at all
        cpu = dict.fromkeys((n.id for n in inst.nodes), 0)
        mem = dict.fromkeys((n.id for n in inst.nodes), 0)
        for vm, node in zip(to_run, combo, strict=True):
            cpu[node.id] += vm.cpu
            mem[node.id] += vm.mem
        if all(cpu[n.id] <= n.cpu and mem[n.id] <= n.mem for n in inst.nodes):
            return True
    return False


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_generated_plans_are_valid_and_cpsat_never_dearer_than_ffd(inst: Instance) -> None:
    feasible = viable_placement_exists(inst)
    try:
        cp = make_plan(inst, optimizer="cpsat", time_limit_s=5, workers=1)
    except NoViablePlacementError as exc:
        assert not feasible, f"CP-SAT gave up on a feasible instance: {exc}"
        assert "short" in str(exc)
        return
    assert feasible
    validate(inst, cp)
    try:
        ffd = make_plan(inst, optimizer="ffd")
    except (NoViablePlacementError, SequencingError):
        return  # FFD may fail to pack, or to order, what CP-SAT plans; nothing to compare
    validate(inst, ffd)
    assert cp.cost <= ffd.cost


@pytest.mark.slow
def test_paper_sized_instances_validate_and_beat_ffd() -> None:
    from preemption.decisions import fcfs_selection

    for seed in range(2):
        raw = generate(150, n_nodes=60, seed=seed)
        sel = fcfs_selection(raw, sorted(raw.vjobs()))
        inst = raw.with_target(sel.target)
        cp = make_plan(inst, optimizer="cpsat", time_limit_s=5, hint=sel.placement)
        validate(inst, cp)
        ffd = make_plan(inst, optimizer="ffd", hint=sel.placement)
        assert cp.cost <= ffd.cost


def test_hint_is_used_when_ffd_cannot_pack_and_ignored_when_not_viable() -> None:
    # 5+3+2 and 4+4+2 fill two bins of 10; FFD puts 5+4 together and then cannot place the last 2.
    nodes = (NodeSpec("a", 1, 2560), NodeSpec("b", 1, 2560))
    sizes = {"v5": 1280, "v4a": 1024, "v4b": 1024, "v3": 768, "v2a": 512, "v2b": 512}
    inst = Instance(nodes, tuple(VMSpec(v, "j", 0, m, W) for v, m in sizes.items()), {"j": R})
    hint = {"v5": "a", "v3": "a", "v2a": "a", "v4a": "b", "v4b": "b", "v2b": "b"}
    plan = make_plan(inst, optimizer="ffd", hint=hint)
    validate(inst, plan)
    assert plan.optimizer == "hint" and "first-fit decreasing cannot pack" in plan.warnings[0]
    with pytest.raises(NoViablePlacementError, match="does not pack"):
        make_plan(inst, optimizer="ffd")
    # CP-SAT finds a packing by itself; a hint that overloads a node is reported and ignored.
    bad = {**hint, "v2b": "a"}
    plan = make_plan(inst, optimizer="cpsat", time_limit_s=5, hint=bad)
    validate(inst, plan)
    assert plan.stats["cpsat_status"] == "OPTIMAL"
    assert any("hint ignored: it overloads node a" in w for w in plan.warnings)


def test_cpsat_out_of_time_falls_back_with_a_warning_and_a_valid_plan() -> None:
    from preemption.decisions import fcfs_selection

    raw = generate(2500, n_nodes=500, seed=3)
    sel = fcfs_selection(raw, sorted(raw.vjobs()))
    inst = raw.with_target(sel.target)
    plan = make_plan(inst, optimizer="cpsat", time_limit_s=0.05, hint=sel.placement)
    validate(inst, plan)
    if plan.stats["cpsat_status"] in ("OPTIMAL", "FEASIBLE"):
        assert not any("falling back" in w for w in plan.warnings)
    else:  # the usual case: no solution in 50 ms
        assert plan.optimizer != "cpsat"
        assert any("CP-SAT found no placement within the 0.05 s budget" in w for w in plan.warnings)
