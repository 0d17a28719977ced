"""The simulator's node index and preemption tally give what a plain look at the nodes gives.

Why: `simulator/node_pool.py` keeps free-node counts per (image, block of 64 nodes) so that a
start at 10,000 nodes reads only the blocks holding a free node, and `victim_tally` counts a
preemption's candidates' nodes in one pass; both replaced NumPy scans over the whole machine.
A stale count or a block skipped wrongly would hand a job other nodes than the rule says
(free nodes on its image lowest index first, then other free nodes lowest index first, or its
previous nodes when all are free) and change every schedule after it. Random take / give
back / claim sequences (seeded) on machines that are not a multiple of 64 nodes, with one to
three images, check each choice against the rule written in NumPy and the index against one
rebuilt from scratch after every step.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.node_pool import FREE, claim, free_blocks, give_back, take_indexed, take_nodes, victim_tally


def rule(owner: np.ndarray, node_os: np.ndarray, image: int, count: int, previous: np.ndarray) -> np.ndarray:
    """The node choice as docs/simulator.md states it, with NumPy masks."""
    if previous.shape[0] == count and count > 0 and (owner[previous] == FREE).all():
        return previous
    free = owner == FREE
    on = np.flatnonzero(free & (node_os == image))
    off = np.flatnonzero(free & (node_os != image))
    return np.concatenate((on, off))[:count]


@pytest.mark.parametrize("seed", range(6))
def test_the_indexed_choice_is_the_rule_after_every_move(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    images = int(rng.integers(1, 4))
    node_os = rng.integers(0, images, size).astype(np.int64)
    owner = np.full(size, FREE, dtype=np.int64)
    free_by_os = np.bincount(node_os, minlength=images).astype(np.int64)
    blk = free_blocks(owner, node_os, images)
    running: dict[int, np.ndarray] = {}
    previous: dict[int, np.ndarray] = {}
    for step in range(400):
        free = int((owner == FREE).sum())
        move = rng.random()
        if move < 0.5 and free:
            job, image = step, int(rng.integers(0, images))
            count = int(rng.integers(1, free + 1))
            prev = previous.pop(int(rng.choice(list(previous))), None) if previous and rng.random() < 0.3 else None
            prev = np.empty(0, dtype=np.int64) if prev is None else prev
            count = prev.shape[0] if prev.shape[0] and rng.random() < 0.7 and prev.shape[0] <= free else count
            want = rule(owner, node_os, image, count, prev).tolist()
            nodes, local, _ = take_indexed(owner, node_os, free_by_os, blk, job, image, count, prev)
            assert nodes.tolist() == want
            assert local == (prev.shape[0] == count and want == prev.tolist())
            running[job] = nodes
        elif move < 0.8 and running:
            job = int(rng.choice(list(running)))
            nodes = running.pop(job)
            give_back(owner, node_os, free_by_os, blk, nodes)
            if rng.random() < 0.5:
                previous[job] = nodes
        elif running:  # a preemption: a victim's nodes and some free ones, claimed together
            victim = int(rng.choice(list(running)))
            nodes = running.pop(victim)
            owner[nodes] = -2  # checkpointing
            spare = np.flatnonzero(owner == FREE)[: int(rng.integers(0, 5))]
            given = np.concatenate((spare, nodes))
            claim(owner, node_os, free_by_os, blk, given, 10_000 + step, int(rng.integers(0, images)))
            running[10_000 + step] = given
        np.testing.assert_array_equal(blk, free_blocks(owner, node_os, images))
        np.testing.assert_array_equal(free_by_os, np.bincount(node_os[owner == FREE], minlength=images))


def test_an_index_not_built_is_left_alone_and_the_plain_scan_answers() -> None:
    """An index of no blocks (the engine builds it at its first start) is not updated, and
    `take_nodes` (no index) makes the same choice as the rule."""
    node_os = np.array([0, 1, 0, 1, 0, 1, 1], dtype=np.int64)
    owner = np.full(7, FREE, dtype=np.int64)
    free_by_os = np.bincount(node_os, minlength=2).astype(np.int64)
    none = np.zeros((2, 0), dtype=np.int64)
    nodes, _, _ = take_indexed(owner, node_os, free_by_os, none, 1, 0, 4, np.empty(0, dtype=np.int64))
    assert nodes.tolist() == [0, 2, 4, 1] and none.shape == (2, 0)
    give_back(owner, node_os, free_by_os, none, np.array([2], dtype=np.int64))
    assert owner.tolist() == [1, 1, FREE, FREE, 1, FREE, FREE] and free_by_os.tolist() == [1, 3]
    nodes, _, swaps = take_nodes(owner, node_os, free_by_os, 2, 1, 3, np.empty(0, dtype=np.int64))
    assert nodes.tolist() == [3, 5, 6] and swaps == 0


@pytest.mark.parametrize("seed", range(4))
def test_the_victim_tally_is_the_numpy_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size, images, jobs = 300, 3, 40
    node_os = rng.integers(0, images, size).astype(np.int64)
    owner = rng.integers(-2, jobs, size).astype(np.int64)  # FREE, checkpointing, or a job
    victims = rng.choice(jobs, 12, replace=False).astype(np.int64)
    mark = np.zeros(jobs, dtype=bool)
    rank = np.zeros(jobs, dtype=np.int64)
    image = int(rng.integers(0, images))
    on_image, by_os, free = victim_tally(owner, node_os, victims, image, images, mark, rank)
    held = np.isin(owner, victims)
    assert on_image.tolist() == [int(((owner == v) & (node_os == image)).sum()) for v in victims]
    assert by_os.tolist() == np.bincount(node_os[held], minlength=images).tolist()
    assert free.tolist() == np.flatnonzero(owner == FREE).tolist()
    assert not mark.any()
