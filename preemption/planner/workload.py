"""Random configurations like those of the Entropy evaluation (section 5.1), for benchmarks and tests.

Why a generator in the package: the benchmark, the tests and anyone comparing optimisers need
the same family of instances. As in the paper: homogeneous nodes (2 CPUs, 4 GB by default);
vjobs of 9 or 18 VMs; each VM needs 256, 512, 1024 or 2048 MB and a whole CPU when it
computes (none when idle); every vjob starts waiting, running or sleeping at random, and the
running VMs are spread so that memory fits on every node while CPUs may be overbooked (the
paper's overloaded cluster). A sleeping vjob's state lies on the node that suspended it.
"""

from __future__ import annotations

import random

from preemption.planner.instance import Instance, NodeSpec, VMSpec
from vjob.model import VJobState

MEMORY_SIZES = (256, 512, 1024, 2048)


def generate(
    n_vms: int,
    *,
    n_nodes: int = 200,
    node_cpu: int = 2,
    node_mem: int = 4096,
    seed: int = 0,
    busy_share: float = 0.5,
) -> Instance:
    """A configuration of exactly `n_vms` VMs (the last vjob is cut short if needed); targets = current states."""
    rng = random.Random(seed)
    nodes = tuple(NodeSpec(f"n{i:04d}", node_cpu, node_mem) for i in range(n_nodes))
    free_mem = {n.id: n.mem for n in nodes}
    vms: list[VMSpec] = []
    j = 0
    while len(vms) < n_vms:
        size = min(rng.choice((9, 18)), n_vms - len(vms))
        state = rng.choice((VJobState.WAITING, VJobState.RUNNING, VJobState.SLEEPING))
        demands = [(1 if rng.random() < busy_share else 0, rng.choice(MEMORY_SIZES)) for _ in range(size)]
        hosts: list[str | None] = [None] * size
        if state is VJobState.RUNNING:
            chosen = _spread([m for _, m in demands], free_mem, rng)
            if chosen is None:
                state = VJobState.SLEEPING  # no room left to have run: it was suspended earlier
            else:
                hosts = list(chosen)
        if state is VJobState.SLEEPING:
            hosts = [rng.choice(nodes).id for _ in range(size)]
        for k, (cpu, mem) in enumerate(demands):
            vms.append(VMSpec(f"j{j:04d}-vm{k:02d}", f"j{j:04d}", cpu, mem, state, hosts[k]))
        j += 1
    return Instance(nodes, tuple(vms))


def _spread(mems: list[int], free_mem: dict[str, int], rng: random.Random) -> list[str] | None:
    """Random nodes with room for each memory demand, taken from `free_mem`; None when one does not fit."""
    names = list(free_mem)
    taken: list[str] = []
    for mem in mems:
        fits = [n for n in rng.sample(names, k=min(len(names), 32)) if free_mem[n] >= mem]
        if not fits:
            fits = [n for n in names if free_mem[n] >= mem]
        if not fits:
            for n, m in zip(taken, mems, strict=False):
                free_mem[n] += m
            return None
        n = fits[0]
        free_mem[n] -= mem
        taken.append(n)
    return taken
