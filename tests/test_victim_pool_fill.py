"""`VictimPool.fill`, the pass's first members in one loop, gives the pool `add` gives job by job.

Why: `fill` writes `admits`' rule and `add`'s checkpoint size out inline (issue 37: 20,000
calls of each were a tenth of the pass at a site's size); a rule changed in one place and not
the other would change which jobs may be victims without any other test noticing at once.
"""

from __future__ import annotations

import random

import pytest

from preemption.scheduling.victim_pool import VictimPool, vm_bytes
from vjob.model import VM, ClusterView, Job, JobClass, JobState, Node


@pytest.mark.parametrize("seed", range(30))
def test_fill_gives_the_members_add_gives(seed: int) -> None:
    rnd = random.Random(seed)
    names = [f"n{i}" for i in range(10)]
    jobs = []
    for k in range(rnd.randrange(0, 25)):
        size = rnd.randrange(1, 4)
        jobs.append(
            Job(
                id=str(k),
                user="u",
                job_class=JobClass.BATCH if rnd.random() < 0.8 else JobClass.INTERACTIVE,
                nodes=size,
                memory_mb=rnd.choice((0, 512, 2048)),
                state=JobState.RUNNING,
                allocated_nodes=tuple(rnd.sample([*names, "gone"], size)),  # "gone": not usable
                preempt_count=rnd.randrange(0, 4),
            )
        )
    vms = tuple(VM(f"vm{j.id}", j.id, "a", memory_mb=rnd.choice((256, 700))) for j in jobs if rnd.random() < 0.4)
    view = ClusterView(now=0.0, jobs=tuple(jobs), nodes=tuple(Node(n, 4, 4096) for n in names), vms=vms)
    owner: dict[str, str | None] = dict.fromkeys(names)
    for j in rnd.sample(jobs, len(jobs)):
        for n in j.allocated_nodes:
            if n in owner:
                owner[n] = j.id  # the last one met holds a node two jobs name
    allowed = None if rnd.random() < 0.3 else {j.id for j in jobs if rnd.random() < 0.7}
    most = None if rnd.random() < 0.3 else rnd.randrange(1, 4)
    node_os = {n: rnd.choice(("", "a")) for n in names}
    one_by_one = VictimPool(allowed, most, vm_bytes(view), node_os)
    for j in jobs:
        one_by_one.add(j, tuple(n for n in j.allocated_nodes if owner.get(n) == j.id))
    filled = VictimPool(allowed, most, vm_bytes(view), node_os)
    filled.fill(jobs, owner)
    assert list(filled.members.items()) == list(one_by_one.members.items())
    assert filled.nodes == one_by_one.nodes
    for want in range(1, 6):
        assert filled.cheapest(want, "a") == one_by_one.cheapest(want, "a")
    ranked = VictimPool(allowed, most, vm_bytes(view), node_os)
    ranked.cheapest(1, "a")  # ranked before it is filled: `fill` goes through `add`
    ranked.fill(jobs, owner)
    assert list(ranked.members.items()) == list(one_by_one.members.items())
    assert ranked.cheapest(3, "a") == one_by_one.cheapest(3, "a")
