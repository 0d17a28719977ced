"""Remapping moves a vjob whole: one decision for all its VMs, carried out by one cut, or not at all.

Pure: hand-made placements where moving part of a vjob would look best (one VM of a 2-VM job
on the fast kind beside a 1-VM job; a swap whose other half the pass refuses; a job half of
whose VMs could go home), and seeded random farms where every decision's moves are checked to
be whole and every switch plan to pass the planner's validator with the vjobs marked whole.
"""

from __future__ import annotations

import random

import pytest

from preemption.planner import Instance, NodeSpec, VMSpec, validate
from preemption.remap.claims import PassClaims, allowed_moves
from preemption.remap.live import Move, Placement, decide_swaps, homeward, moves_for, running_jobs, switch_plan
from preemption.remap.models import Profile, SubCluster
from preemption.remap.online import CYCLES
from preemption.remap.policy import RemapParams
from vjob.model import Action, VJobState

FARM = {
    "slow": SubCluster("slow", 6, 1, 4096, 1.0, cycles={CYCLES: 1.0}),
    "fast": SubCluster("fast", 6, 1, 4096, 3.0, cycles={CYCLES: 1.0}),
}
PARAMS = RemapParams(beta=20, tau_s=50, threshold_s=10, max_migrations=2)
NODES = [f"s{i}" for i in range(1, 7)] + [f"f{i}" for i in range(1, 7)]
NODE_SC = {n: ("slow" if n.startswith("s") else "fast") for n in NODES}


def _job(job: str, hosts: list[str], allocated: list[str] | None = None, mem: int = 512) -> Placement:
    vms = tuple((f"vm-{job}-{i}", h) for i, h in enumerate(hosts))
    return Placement(job, vms, tuple(allocated if allocated is not None else hosts), mem)


def _busy(ghz: float) -> Profile:
    return Profile(50, counters={CYCLES: 50 * ghz * 1e9})


def _instance(places: list[Placement], moves: list[Move]) -> Instance:
    """The planner's view of the switch: each job's VMs running where they are, every node with
    room for two (a live swap holds both VMs on each node during its pool), jobs of several VMs
    moving only whole; the jobs the moves leave alone are not in the switch."""
    nodes = tuple(NodeSpec(n, 2, 4096) for n in NODES)
    places = [p for p in places if p.job in {m.job for m in moves}]
    vms = tuple(VMSpec(vm, p.job, 1, p.memory_mb, VJobState.RUNNING, node) for p in places for vm, node in p.vms)
    return Instance(nodes, vms, {}, frozenset(p.job for p in places if len(p.vms) > 1))


def test_a_two_vm_job_is_never_swapped_with_one_vm_of_it() -> None:
    """j (2 VMs, busy) on the slow kind would gain on the fast one, where k (1 VM, idle) runs:
    swapping one of j's VMs with k looks best VM by VM. The policy weighs j as one job of 2
    slots: no swap with k fits; with a 2-VM partner on the fast kind the swap moves both."""
    places = [_job("j", ["s1", "s2"]), _job("k", ["f1"])]
    profiles = {"j": _busy(1.0), "k": Profile(50, counters={CYCLES: 1e6})}
    jobs = running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0)
    assert decide_swaps(jobs, FARM, PARAMS) == []
    places.append(_job("m", ["f2", "f3"]))
    profiles["m"] = Profile(50, counters={CYCLES: 1e6})
    (d,) = decide_swaps(running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS)
    assert set(d.jobs) == {"j", "m"}
    moves = moves_for([d], places)
    assert sorted(m.vm for m in moves) == ["vm-j-0", "vm-j-1", "vm-m-0", "vm-m-1"]
    assert {m.key for m in moves} == {f"swap {d.jobs[0]}+{d.jobs[1]}"}  # one decision
    plan = switch_plan(moves, places)
    assert [a.kind for a in plan.pools[0]] == [Action.SUSPEND] * 4  # one cut of each job
    assert {(a.vm, a.dst) for a in plan.pools[1]} == {(m.vm, m.dst) for m in moves}
    validate(_instance(places, moves), plan)


def test_half_a_swap_is_never_carried_out() -> None:
    """The pass gives k's destination away: the whole swap is dropped, j's move too."""
    places = [_job("j", ["s1"]), _job("k", ["f1"])]
    moves = [Move("j", "vm-j-0", "s1", "f1", "swap", "swap j+k"), Move("k", "vm-k-0", "f1", "s1", "swap", "swap j+k")]
    keep, dropped = allowed_moves(moves, PassClaims(given=frozenset({"s1"})))
    assert keep == []
    why = dict((m.job, w) for m, w in dropped)
    assert why["k"] == "the vjob policy gives s1 to another job this tick"
    assert why["j"].startswith("swap j+k goes whole or not at all, and vm-k-0 of k may not move")
    keep, dropped = allowed_moves(moves, PassClaims(given=frozenset({"s9"})))
    assert keep == moves and dropped == []
    assert len(switch_plan(moves, places).pools) == 1  # one-VM jobs: two live migrations, one pool


def test_a_job_goes_home_whole_or_waits() -> None:
    """After a swap j's two VMs sit on f1 (k's node) and f2 (nobody's), k's VM on s1 (j's).
    VM by VM, j's VM on f2 could go home now — to s1, where k's VM still is: a part of j moved
    alone. j waits whole until the node under each of its VMs is no longer lent (k ended)."""
    j = _job("j", ["f1", "f2"], ["s1", "s2"])
    k = _job("k", ["s1"], ["f1"])
    assert homeward([j, k]) == []
    moves = homeward([j])  # k ended: nothing lent any more
    assert sorted((m.vm, m.dst) for m in moves) == [("vm-j-0", "s1"), ("vm-j-1", "s2")]
    assert {m.key for m in moves} == {"home j"}
    plan = switch_plan(moves, [j])
    assert [(a.kind, a.vm) for a in plan.pools[0]] == [(Action.SUSPEND, "vm-j-0"), (Action.SUSPEND, "vm-j-1")]


def test_a_job_moved_in_part_or_twice_is_refused() -> None:
    j = _job("j", ["s1", "s2"])
    one = [Move("j", "vm-j-0", "s1", "f1", "swap", "swap j+k"), Move("j", "vm-j-1", "s2", "f2", "home", "home j")]
    with pytest.raises(ValueError, match=r"job j: moved by 2 decisions .* a job moves whole, once"):
        switch_plan(one, [j])
    with pytest.raises(ValueError, match=r"move of vm-j-0 s3->f1: not one of its VMs where it runs"):
        switch_plan([Move("j", "vm-j-0", "s3", "f1", "swap", "swap j+k")], [j])
    # one VM going home while its sibling is home already: still one cut of both
    plan = switch_plan([Move("j", "vm-j-0", "s1", "f1", "home", "home j")], [j])
    assert [a.kind for a in plan.actions] == [Action.SUSPEND, Action.SUSPEND, Action.RESUME, Action.RESUME]
    assert {(a.vm, a.src, a.dst) for a in plan.pools[1]} == {("vm-j-0", "s1", "f1"), ("vm-j-1", "s2", "s2")}


def _random_farm(rng: random.Random) -> tuple[list[Placement], dict[str, Profile | None]]:
    """Jobs of 1–3 VMs on distinct nodes, each inside one kind, busy or idle at random."""
    free = {"slow": [n for n in NODES if n.startswith("s")], "fast": [n for n in NODES if n.startswith("f")]}
    for nodes in free.values():
        rng.shuffle(nodes)
    places: list[Placement] = []
    profiles: dict[str, Profile | None] = {}
    for j in range(rng.randint(2, 6)):
        kind = rng.choice(("slow", "fast"))
        size = rng.randint(1, 3)
        if len(free[kind]) < size:
            continue
        hosts = [free[kind].pop() for _ in range(size)]
        places.append(_job(f"j{j}", hosts))
        profiles[f"j{j}"] = _busy(rng.choice((0.001, 0.5, 1.0, 2.0)))
    return places, profiles


def test_seeded_random_farms_move_every_job_whole() -> None:
    """200 seeded farms: every swap moves each of its jobs' VMs once, under one decision key;
    the switch plan passes the planner's validator with the multi-VM jobs marked whole; and
    the pass refusing one move drops its whole decision."""
    swaps = several = 0
    for seed in range(200):
        rng = random.Random(seed)
        places, profiles = _random_farm(rng)
        decisions = decide_swaps(running_jobs(places, profiles, NODE_SC, FARM, PARAMS, 110.0), FARM, PARAMS)
        moves = moves_for(decisions, places)
        by_job = {p.job: p for p in places}
        for d in decisions:
            swaps += 1
            for job in d.jobs:
                mine = [m for m in moves if m.job == job]
                assert sorted(m.vm for m in mine) == sorted(vm for vm, _ in by_job[job].vms), (seed, d)
                assert {m.key for m in mine} == {f"swap {d.jobs[0]}+{d.jobs[1]}"}
                several += len(mine) > 1
        if moves:
            validate(_instance(places, moves), switch_plan(moves, places))
            victim = rng.choice(moves)
            keep, _ = allowed_moves(moves, PassClaims(given=frozenset({victim.dst})))
            assert not any(m.key == victim.key for m in keep), seed
    assert swaps >= 20 and several >= 5, (swaps, several)
