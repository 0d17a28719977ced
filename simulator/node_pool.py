"""Which free nodes a starting job gets, compiled: the simulator starts ~135,000 jobs in a
100,000-job replay, and finding free nodes with NumPy masks over the whole machine cost more
than the rest of a start.

Rule (the engine's cluster model): a resumed job gets its previous nodes back when all of
them are free (a local resume reads its checkpoint at full speed); otherwise the free nodes
already running its OS image, lowest index first, then other free nodes, lowest index first
(each of those will switch image).

Why an index beside `owner`: at 10,000 nodes, 85 % busy, finding the free nodes by scanning
the whole machine at every start was a third of a million-job replay (bench/simulate_million.py).
`free_blk[image, b]` counts the free nodes of each image in block b (nodes b*64 .. b*64+63),
so a start reads only the blocks that hold a free node of the kind it looks for, in node
order: the same nodes as the plain scan. Every change of a node's owner between FREE and
taken goes through this module (take_indexed, give_back, claim), which keeps the index
right. An index of no blocks is "not built yet": the updates skip it and the engine builds
it from `owner` at its first start (`free_blocks`), so a state set up by hand (the
differential test writes `owner` directly) is indexed as it stands then.
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

FREE = -1
"""`owner` of a free node; a job's index otherwise (negative values other than FREE: held
by something that is not a job, e.g. a checkpoint being written)."""
BLOCK_SHIFT = 6
"""Nodes per block of the index: 1 << BLOCK_SHIFT (64)."""


@numba.njit(cache=True, nogil=True)
def free_blocks(
    owner: NDArray[np.int64], node_os: NDArray[np.int64], images: int
) -> NDArray[np.int64]:  # pragma: no cover
    """The index of `owner`: free nodes per (image, block of 64 nodes)."""
    blk = np.zeros((images, (owner.shape[0] + (1 << BLOCK_SHIFT) - 1) >> BLOCK_SHIFT), dtype=np.int64)
    for node in range(owner.shape[0]):
        if owner[node] == FREE:
            blk[node_os[node], node >> BLOCK_SHIFT] += 1
    return blk


@numba.njit(cache=True, nogil=True)
def take_nodes(
    owner: NDArray[np.int64],
    node_os: NDArray[np.int64],
    free_by_os: NDArray[np.int64],
    job: int,
    image: int,
    count: int,
    previous: NDArray[np.int64],
) -> tuple[NDArray[np.int64], bool, int]:  # pragma: no cover - compiled; tests call it through numba
    """`take_indexed` with an index built for this one call (a state without one)."""
    blk = free_blocks(owner, node_os, free_by_os.shape[0])
    return take_indexed(owner, node_os, free_by_os, blk, job, image, count, previous)


@numba.njit(cache=True, nogil=True)
def take_indexed(
    owner: NDArray[np.int64],
    node_os: NDArray[np.int64],
    free_by_os: NDArray[np.int64],
    free_blk: NDArray[np.int64],
    job: int,
    image: int,
    count: int,
    previous: NDArray[np.int64],
) -> tuple[NDArray[np.int64], bool, int]:  # pragma: no cover - compiled; tests call it through numba
    """Give `count` free nodes to `job`: marked in `owner`, taken off `free_by_os` and the
    index `free_blk` (when built), and switched to `image` in `node_os`.

    `previous` are the job's nodes before it was checkpointed (empty for a first start).
    Returns (nodes, resumed locally, nodes that switched image). The caller knows `count`
    free nodes exist.
    """
    local = previous.shape[0] == count and count > 0
    for node in previous:
        if owner[node] != FREE:
            local = False
            break
    indexed = free_blk.shape[1] > 0
    if local:
        nodes = previous.copy()
    elif indexed:
        nodes = _scan_blocks(owner, node_os, free_blk, image, count)
    else:
        nodes = np.empty(count, dtype=np.int64)
        k = 0
        for node in range(owner.shape[0]):
            if k == count:
                break
            if owner[node] == FREE and node_os[node] == image:
                nodes[k] = node
                k += 1
        for node in range(owner.shape[0]):
            if k == count:
                break
            if owner[node] == FREE and node_os[node] != image:
                nodes[k] = node
                k += 1
    swaps = 0
    for node in nodes:
        owner[node] = job
        free_by_os[node_os[node]] -= 1
        if indexed:
            free_blk[node_os[node], node >> BLOCK_SHIFT] -= 1
        if node_os[node] != image:
            node_os[node] = image
            swaps += 1
    return nodes, local, swaps


@numba.njit(cache=True, nogil=True)
def _scan_blocks(
    owner: NDArray[np.int64], node_os: NDArray[np.int64], free_blk: NDArray[np.int64], image: int, count: int
) -> NDArray[np.int64]:  # pragma: no cover - compiled
    """The plain scan's choice read through the index: free nodes on `image` lowest index
    first, then free nodes on other images lowest index first; only blocks that hold one."""
    nodes = np.empty(count, dtype=np.int64)
    blocks, images, size = free_blk.shape[1], free_blk.shape[0], owner.shape[0]
    k = 0
    for b in range(blocks):
        if k == count:
            break
        if free_blk[image, b] == 0:
            continue
        for node in range(b << BLOCK_SHIFT, min((b + 1) << BLOCK_SHIFT, size)):
            if owner[node] == FREE and node_os[node] == image:
                nodes[k] = node
                k += 1
                if k == count:
                    break
    for b in range(blocks):
        if k == count:
            break
        others = 0
        for i in range(images):
            if i != image:
                others += free_blk[i, b]
        if others == 0:
            continue
        for node in range(b << BLOCK_SHIFT, min((b + 1) << BLOCK_SHIFT, size)):
            if owner[node] == FREE and node_os[node] != image:
                nodes[k] = node
                k += 1
                if k == count:
                    break
    return nodes


@numba.njit(cache=True, nogil=True)
def give_back(
    owner: NDArray[np.int64],
    node_os: NDArray[np.int64],
    free_by_os: NDArray[np.int64],
    free_blk: NDArray[np.int64],
    nodes: NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """`nodes` are free again (a run ended, a checkpoint was written): `owner`, the free
    count of each image and the index (when built)."""
    indexed = free_blk.shape[1] > 0
    for node in nodes:
        owner[node] = FREE
        free_by_os[node_os[node]] += 1
        if indexed:
            free_blk[node_os[node], node >> BLOCK_SHIFT] += 1


@numba.njit(cache=True, nogil=True)
def claim(
    owner: NDArray[np.int64],
    node_os: NDArray[np.int64],
    free_by_os: NDArray[np.int64],
    free_blk: NDArray[np.int64],
    nodes: NDArray[np.int64],
    job: int,
    image: int,
) -> int:  # pragma: no cover - compiled
    """`job` takes `nodes` it was given (a preemption: free nodes and its victims'), on
    `image`: the free ones leave the free counts and the index; returns how many switch
    image."""
    indexed = free_blk.shape[1] > 0
    swaps = 0
    for node in nodes:
        if owner[node] == FREE:
            free_by_os[node_os[node]] -= 1
            if indexed:
                free_blk[node_os[node], node >> BLOCK_SHIFT] -= 1
        owner[node] = job
        if node_os[node] != image:
            node_os[node] = image
            swaps += 1
    return swaps


@numba.njit(cache=True, nogil=True)
def victim_tally(
    owner: NDArray[np.int64],
    node_os: NDArray[np.int64],
    victims: NDArray[np.int64],
    image: int,
    images: int,
    mark: NDArray[np.bool_],
    rank: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:  # pragma: no cover - compiled
    """One pass over the nodes for a preemption: how many nodes of each candidate victim
    (`victims`, job indices) run `image`, how many of all their nodes run each image, and
    the free nodes in index order. `mark` (all False, left so) and `rank` are scratch, one
    entry per job. Replaces five NumPy passes over the whole machine per preemption tried."""
    on_image = np.zeros(victims.shape[0], dtype=np.int64)
    by_os = np.zeros(images, dtype=np.int64)
    free = np.empty(owner.shape[0], dtype=np.int64)
    for k in range(victims.shape[0]):
        mark[victims[k]] = True
        rank[victims[k]] = k
    nfree = 0
    for node in range(owner.shape[0]):
        o = owner[node]
        if o == FREE:
            free[nfree] = node
            nfree += 1
        elif o >= 0 and mark[o]:
            by_os[node_os[node]] += 1
            if node_os[node] == image:
                on_image[rank[o]] += 1
    for k in range(victims.shape[0]):
        mark[victims[k]] = False
    return on_image, by_os, free[:nfree]
