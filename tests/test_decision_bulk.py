"""The scheduling pass's bulk shortcuts give the very answers of the rules they stand for.

Why: issue 37 cut the agent's decision at a site's size by keeping per pass what the pass
used to rebuild per interactive job (the victim pool kept sorted, the guard's holds kept
sorted) and by computing per-job values in arrays (site values, the walk's order, id ranks).
Each shortcut is held here against the plain rule it replaces, on seeded random inputs with
many ties (small value ranges), which is where a different order or rounding would show.
The whole pass is held to the simulator by tests/test_decision_differential.py.
"""

from __future__ import annotations

import random

import pytest

from preemption.scheduling.easy import reservation
from preemption.scheduling.guard import (
    keeps_reservation,
    keeps_reservation_sorted,
    reserved_after,
    reserved_after_sorted,
    reserved_start,
)
from preemption.scheduling.site_order import band, site_value, site_values, walk_order
from preemption.scheduling.tick import id_ranks
from preemption.scheduling.victim_pool import VictimPool, vm_bytes
from preemption.scheduling.victims import MIB, Candidate, checkpoint_bytes, choose_victims
from vjob.model import VM, ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

SEEDS = range(40)


def _holds(rnd: random.Random, count: int) -> list[tuple[float, int]]:
    return [(float(rnd.randrange(0, 50)), rnd.randrange(1, 4)) for _ in range(count)]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_guard_on_sorted_holds_answers_as_on_the_plain_ones(seed: int) -> None:
    rnd = random.Random(seed)
    now = 10.0
    holds = _holds(rnd, rnd.randrange(0, 30))
    ordered = sorted(holds)
    free = rnd.randrange(0, 4)
    for need in range(1, 12):
        assert reserved_start(now, free, need, ordered) == reservation(now, free, need, holds)[0]
    victims = [(*h, float(rnd.randrange(0, 5))) for h in rnd.sample(holds, min(len(holds), rnd.randrange(0, 4)))]
    taken = rnd.randrange(0, free + 1)
    end = now + rnd.randrange(0, 40)
    for need in range(1, 12):
        plain = reserved_after(now, free, need, holds, victims, taken, end)
        assert reserved_after_sorted(now, free, need, ordered, victims, taken, end) == plain
        for anchor in (None, now + rnd.randrange(0, 30)):
            expected = keeps_reservation(now, free, need, holds, victims, taken, end, 5.0, anchor)
            assert keeps_reservation_sorted(now, free, need, ordered, victims, taken, end, 5.0, anchor) == expected


def _running(rnd: random.Random, count: int, nodes: list[str]) -> list[Job]:
    jobs = []
    for k in range(count):
        size = rnd.randrange(1, 3)
        jobs.append(
            Job(
                id=str(100 + k),
                user=f"u{k % 3}",
                job_class=JobClass.BATCH if rnd.random() < 0.85 else JobClass.INTERACTIVE,
                nodes=size,
                memory_mb=rnd.choice((512, 1024, 2048)),
                state=JobState.RUNNING,
                allocated_nodes=tuple(rnd.sample(nodes, size)),
                preempt_count=rnd.randrange(0, 3),
            )
        )
    return jobs


@pytest.mark.parametrize("seed", SEEDS)
def test_the_victim_pool_chooses_as_choose_victims_over_every_candidate(seed: int) -> None:
    rnd = random.Random(seed)
    names = [f"n{i}" for i in range(12)]
    node_os = {n: rnd.choice(("", "a", "b")) for n in names}
    jobs = _running(rnd, rnd.randrange(1, 14), names)
    vms = tuple(VM(name=f"vm-{j.id}", job_id=j.id, image="a", memory_mb=300) for j in jobs if rnd.random() < 0.3)
    view = ClusterView(now=0.0, jobs=tuple(jobs), nodes=tuple(Node(n, 4, 4096) for n in names), vms=vms)
    owner = {n: j.id for j in jobs for n in j.allocated_nodes}  # the last job on a node holds it
    pool = VictimPool(None, 2, vm_bytes(view), node_os)
    held = {}
    for j in jobs:
        mine = tuple(n for n in j.allocated_nodes if owner[n] == j.id)
        pool.add(j, mine)
        if mine and j.job_class is JobClass.BATCH and j.preempt_count < 2:
            held[j.id] = (j, mine)
    assert set(pool.members) == set(held) and pool.nodes == sum(len(m) for _, m in held.values())
    gone = set(rnd.sample(sorted(held), len(held) // 3))
    for image in ("", "a", "b"):
        pool.cheapest(1, image)  # sorted now: later changes must keep it so
    for job_id in gone:
        pool.remove(job_id)
    late = Job(id="99", user="u9", nodes=1, state=JobState.RUNNING, allocated_nodes=("n0",), memory_mb=4096)
    pool.add(late, ("n0",))
    held[late.id] = (late, ("n0",))
    for image in ("", "a", "b"):
        plain = [
            Candidate(
                j.id,
                float(j.preempt_count),
                len(m),
                sum(1 for n in m if node_os[n] == image),
                checkpoint_bytes(view, j),
            )
            for job_id, (j, m) in held.items()
            if job_id not in gone
        ]
        for want in range(1, 8):
            assert pool.cheapest(want, image) == choose_victims(want, plain)
        prio = {c.job_id: float(rnd.randrange(3)) for c in plain}
        assert sorted(pool.candidates(image, prio)) == sorted(c._replace(priority=prio[c.job_id]) for c in plain)


def test_a_vm_view_prices_a_victim_by_its_vms_and_others_by_their_memory() -> None:
    jobs = (
        Job(id="1", user="u", memory_mb=1000, state=JobState.RUNNING, allocated_nodes=("a", "b"), nodes=2),
        Job(id="2", user="u", memory_mb=1000, state=JobState.RUNNING, allocated_nodes=("c",)),
    )
    vms = (VM(name="v1", job_id="1", image="x", memory_mb=300), VM(name="v2", job_id="1", image="x", memory_mb=200))
    view = ClusterView(now=0.0, jobs=jobs, nodes=(Node("a", 1, 1), Node("b", 1, 1), Node("c", 1, 1)), vms=vms)
    pool = VictimPool(None, None, vm_bytes(view), {"a": "", "b": "", "c": ""})
    for j in jobs:
        pool.add(j, j.allocated_nodes)
    assert pool.members["1"].checkpoint_bytes == 500.0 * MIB == checkpoint_bytes(view, jobs[0])
    assert pool.members["2"].checkpoint_bytes == 1000.0 * MIB == checkpoint_bytes(view, jobs[1])


@pytest.mark.parametrize("seed", SEEDS)
def test_site_values_and_the_walk_in_arrays_are_the_per_job_rule(seed: int) -> None:
    rnd = random.Random(seed)
    span, share = rnd.choice(((12_000, 0.5), (10, 0.3), (1_000, 0.9))), rnd.random() * 0.95
    span = span[0]
    knob = PriorityKnob(0, 10**9, min_step=rnd.choice((1, 7, 1000)), share=share)
    queue = [Job(id=str(k), user="u") for k in range(rnd.randrange(0, 60))]
    tiers = {j.id: rnd.randrange(4) for j in queue}
    fractions = {j.id: rnd.choice((0.0, 1.0, 1.5, -0.2, rnd.random())) for j in queue if rnd.random() < 0.7}
    sent = site_values(queue, tiers, fractions, knob, span)
    assert sent == {
        j.id: site_value(tiers[j.id], fractions.get(j.id, 0.0), share, span, knob.low, knob.min_step) for j in queue
    }
    own = {j.id: rnd.randrange(0, band(span, share)) for j in queue if rnd.random() < 0.8}
    place = {j.id: k for k, j in enumerate(queue)}
    assert walk_order(queue, sent, own) == sorted(queue, key=lambda j: (-(sent[j.id] + own.get(j.id, 0)), place[j.id]))


def test_site_values_refuse_a_tier_outside_the_bands() -> None:
    with pytest.raises(ValueError, match="tier 4"):
        site_values([Job(id="1", user="u")], {"1": 4}, {}, PriorityKnob(0, 10**9, share=0.5), 100)


def test_id_ranks_in_arrays_sort_shortest_first_then_as_text() -> None:
    rnd = random.Random(3)
    ids = {"9", "10", "100", "7_2", "7_10", "9.server", "10.server", "a", "b\x00", "b"}
    ids |= {str(rnd.randrange(10**6)) + rnd.choice(("", "_1", "_12", ".s")) for _ in range(300)}
    jobs = [Job(id=i, user="u") for i in ids]
    by_id = sorted(range(len(jobs)), key=lambda k: (len(jobs[k].id), jobs[k].id))
    expected = [0] * len(jobs)
    for place, k in enumerate(by_id):
        expected[k] = place
    assert id_ranks(jobs).tolist() == expected
    assert id_ranks([]).tolist() == []
