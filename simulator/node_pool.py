"""Which free nodes a starting job gets, compiled: the simulator starts ~135,000 jobs in a
100,000-job replay, and finding free nodes with NumPy masks over the whole machine cost more
than the rest of a start.

Rule (the engine's cluster model): a resumed job gets its previous nodes back when all of
them are free (a local resume reads its checkpoint at full speed); otherwise the free nodes
already running its OS image, lowest index first, then other free nodes, lowest index first
(each of those will switch image).
"""

from __future__ import annotations

import numba
import numpy as np
from numpy.typing import NDArray

FREE = -1
"""`owner` of a free node; a job's index otherwise (negative values other than FREE: held
by something that is not a job, e.g. a checkpoint being written)."""


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
    """Give `count` free nodes to `job`: marked in `owner`, taken off `free_by_os`, and
    switched to `image` in `node_os`.

    `previous` are the job's nodes before it was checkpointed (empty for a first start).
    Returns (nodes, resumed locally, nodes that switched image). The caller knows `count`
    free nodes exist.
    """
    local = previous.shape[0] == count and count > 0
    for node in previous:
        if owner[node] != FREE:
            local = False
            break
    if local:
        nodes = previous.copy()
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
        if node_os[node] != image:
            node_os[node] = image
            swaps += 1
    return nodes, local, swaps
