"""The improvement phase (`pull_forward`): never dearer than its input, always valid, and it does pull.

Why small instances: the property must hold on every plan; large-scale figures are measured by
bench/planner.py, not asserted here.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemption.decisions import fcfs_selection
from preemption.planner import Instance, NodeSpec, NoViablePlacementError, VMSpec, make_plan, validate
from preemption.planner.improve import pull_forward
from preemption.planner.placement import keep_in_place
from preemption.planner.sequencing import SequencingError, build_plan
from preemption.planner.workload import generate
from tests.test_planner_properties import instances
from vjob.model import Action, VJobState

R, S, W = VJobState.RUNNING, VJobState.SLEEPING, VJobState.WAITING


def test_a_run_waiting_for_a_suspend_moves_to_a_free_node_in_the_first_pool() -> None:
    nodes = (NodeSpec("a", 1, 1024), NodeSpec("b", 1, 1024))
    vms = (VMSpec("x", "jx", 1, 512, R, "a"), VMSpec("y", "jy", 1, 512, W, None))
    inst = Instance(nodes, vms, {"jx": S, "jy": R})
    late = build_plan(inst, {"y": "a"})
    assert [[a.kind for a in p] for p in late.pools] == [[Action.SUSPEND], [Action.RUN]]
    better = pull_forward(inst, late)
    validate(inst, better)
    assert len(better.pools) == 1 and better.placement == {"y": "b"}
    assert better.cost == 512 < late.cost == 1024


def test_a_resume_group_is_pulled_forward_whole_and_local_where_the_state_is() -> None:
    # j1 is resumed remotely onto a, which the suspend of j0 frees only after pool 0; the node
    # holding j1's states (b) has room at once: the resumes move to pool 0, local.
    nodes = (NodeSpec("a", 2, 2048), NodeSpec("b", 2, 2048))
    vms = (
        VMSpec("s0", "j0", 1, 1024, R, "a"),
        VMSpec("s1", "j0", 1, 1024, R, "a"),
        VMSpec("r0", "j1", 1, 512, S, "b"),
        VMSpec("r1", "j1", 1, 512, S, "b"),
    )
    inst = Instance(nodes, vms, {"j0": S, "j1": R})
    late = build_plan(inst, {"r0": "a", "r1": "a"})
    assert len(late.pools) == 2
    better = pull_forward(inst, late)
    validate(inst, better)
    resumes = [a for p in better.pools for a in p if a.kind is Action.RESUME]
    assert len(better.pools) == 1 and all(a.local for a in resumes) and len(resumes) == 2
    assert better.cost < late.cost


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from((None, 0, 256)))
def test_pull_forward_is_never_dearer_and_always_valid(inst: Instance, defer: int | None) -> None:
    placed, left = keep_in_place(inst)
    if left:
        return
    try:
        plan = build_plan(inst, placed, defer_above=defer)
    except SequencingError:
        return
    better = pull_forward(inst, plan)
    validate(inst, better)
    assert better.cost <= plan.cost


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from((None, 0)))
def test_on_crowded_generated_clusters_the_phase_keeps_plans_valid(seed: int, defer: int | None) -> None:
    raw = generate(60, n_nodes=12, seed=seed)
    queue = sorted(raw.vjobs())
    random.Random(seed).shuffle(queue)
    inst = raw.with_target(fcfs_selection(raw, queue).target)
    try:
        plan = make_plan(inst, optimizer="ffd")
    except (NoViablePlacementError, SequencingError):
        return
    starts = [plan]
    try:
        starts.append(build_plan(inst, plan.placement, defer_above=defer))
    except SequencingError:
        pass  # deferring can leave a migration cycle with no pivot: only the FFD plan then
    for start in starts:
        better = pull_forward(inst, start)
        validate(inst, better)
        assert better.cost <= start.cost
