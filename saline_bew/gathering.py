"""Ordering the copies of snapshots from many nodes into one repository (Saline 3.1.2).

Why an ordering at all: when OAR takes a best-effort job's nodes back, every node must push
its VM images to the site's repository, whose link is the bottleneck. Naive concurrent
copies share that link, so every node is freed only at the very end. The paper's rule frees
nodes one by one instead: the repository receives from the node holding the fewest images,
while the other nodes hand their images to peers that hold at least as many (over links the
repository does not use), so a node that gave its images away is free at once.

`next_copies` is the rule as a pure decision on the current state (who holds how many
images, who is busy); `simulate` runs it (or the naive way) on a bandwidth model for the
benchmark, and `Gathering` carries it out with real copies for the manager.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

REPOSITORY = "@repository"
"""The destination name of the repository in a schedule (not a valid node name)."""


@dataclass(frozen=True, slots=True)
class Copy:
    """Move `images` (names) from node `source` to `destination` (a node or REPOSITORY)."""

    source: str
    destination: str
    images: tuple[str, ...]


def next_copies(holdings: Mapping[str, tuple[str, ...]], busy: frozenset[str], repository_busy: bool) -> list[Copy]:
    """The copies to start now, given which images each node holds and who is copying.

    1. If the repository is idle, the idle node with the fewest images sends one to it.
    2. Every other idle node holding images sends them all to an idle peer that holds at
       least as many (so images flow towards the nodes that will be freed last), never to a
       busy node, a node with fewer images, or a node that already holds nothing.
    Ties break by node name so that the schedule is reproducible.
    """
    idle = sorted((n for n, imgs in holdings.items() if imgs and n not in busy), key=lambda n: (len(holdings[n]), n))
    copies: list[Copy] = []
    taken: set[str] = set()
    if not repository_busy and idle:
        first = idle[0]
        copies.append(Copy(first, REPOSITORY, (holdings[first][0],)))
        taken.add(first)
    for sender in idle:
        if sender in taken:
            continue
        count = len(holdings[sender])
        candidates = [d for d in idle if d != sender and d not in taken and len(holdings[d]) >= count]
        if not candidates:
            continue
        # The fullest peer: it is going to be the last to be freed anyway.
        dest = max(candidates, key=lambda d: (len(holdings[d]), d))
        copies.append(Copy(sender, dest, holdings[sender]))
        taken.update((sender, dest))
    return copies


@dataclass
class GatherResult:
    """When each node was freed and when the last image reached the repository."""

    freed_at: dict[str, float]
    total_s: float
    copies: list[tuple[float, float, Copy]] = field(default_factory=list)

    def time_to_free(self, fraction: float) -> float:
        """Time until `fraction` of the nodes were free (0.8 → the paper's 80 % mark)."""
        times = sorted(self.freed_at.values())
        if not times:
            return 0.0
        k = max(1, math.ceil(fraction * len(times) - 1e-9))
        return times[min(len(times), k) - 1]


def simulate(
    holdings: Mapping[str, tuple[str, ...]],
    sizes: Mapping[str, float],
    *,
    repository_bps: float,
    link_bps: float,
    naive: bool = False,
    contention: float = 0.0,
) -> GatherResult:
    """Play the gathering on a bandwidth model: every node has a `link_bps` link, the
    repository `repository_bps`. Saline's ordering sends one image at a time into the
    repository; the naive way starts every node's copies at once and shares the repository
    link equally, losing `contention` of it per extra concurrent stream (collisions,
    retransmissions; 0 = perfect sharing)."""
    if naive:
        return _simulate_naive(holdings, sizes, repository_bps=repository_bps, link_bps=link_bps, contention=contention)
    hold = {n: tuple(imgs) for n, imgs in holdings.items()}
    freed = {n: 0.0 for n, imgs in hold.items() if not imgs}
    t = 0.0
    running: list[tuple[float, int, Copy]] = []
    busy: set[str] = set()
    repo_busy = False
    log: list[tuple[float, float, Copy]] = []
    seq = 0
    while True:
        for c in next_copies(hold, frozenset(busy), repo_busy):
            nbytes = sum(sizes[i] for i in c.images)
            rate = min(link_bps, repository_bps) if c.destination == REPOSITORY else link_bps
            end = t + nbytes / rate
            heapq.heappush(running, (end, seq, c))
            seq += 1
            busy.add(c.source)
            if c.destination == REPOSITORY:
                repo_busy = True
            else:
                busy.add(c.destination)
            log.append((t, end, c))
        if not running:
            break
        t, _, done = heapq.heappop(running)
        remaining = tuple(i for i in hold[done.source] if i not in done.images)
        hold[done.source] = remaining
        busy.discard(done.source)
        if done.destination == REPOSITORY:
            repo_busy = False
        else:
            hold[done.destination] = hold[done.destination] + done.images
            busy.discard(done.destination)
        for n in (done.source, done.destination):
            if n != REPOSITORY and not hold[n] and n not in busy and n not in freed:
                freed[n] = t
    left = [n for n, imgs in hold.items() if imgs]
    if left:  # cannot happen: the repository always takes from someone
        raise RuntimeError(f"gathering stalled with images left on {left}")
    return GatherResult(freed, t, log)


def _simulate_naive(
    holdings: Mapping[str, tuple[str, ...]],
    sizes: Mapping[str, float],
    *,
    repository_bps: float,
    link_bps: float,
    contention: float,
) -> GatherResult:
    """Every node copies its images one after another, all nodes at once (processor sharing)."""
    left = {n: [sizes[i] for i in imgs] for n, imgs in holdings.items()}
    freed = {n: 0.0 for n, v in left.items() if not v}
    t = 0.0
    while True:
        active = [n for n, v in left.items() if v]
        if not active:
            break
        k = len(active)
        share = repository_bps / (k * (1.0 + contention * (k - 1)))
        rate = min(link_bps, share)
        step = min(left[n][0] for n in active) / rate
        t += step
        for n in active:
            left[n][0] -= step * rate
            if left[n][0] <= 1e-6:
                left[n].pop(0)
                if not left[n]:
                    freed[n] = t
    return GatherResult(freed, t)


CopyFn = Callable[[str, str, str], None]
"""copy(image, source_node, destination) with destination a node or REPOSITORY."""


class Gathering:
    """Carry out the ordering with real copies, as the copies finish (threads, one per copy)."""

    def __init__(self, copy: CopyFn, *, workers: int = 8) -> None:
        self.copy = copy
        self.workers = workers

    def run(
        self, holdings: Mapping[str, tuple[str, ...]], *, on_freed: Callable[[str], None] | None = None
    ) -> list[str]:
        """Gather every image into the repository; returns the nodes in the order they were freed."""
        hold = {n: tuple(imgs) for n, imgs in holdings.items()}
        order = [n for n, imgs in hold.items() if not imgs]
        busy: set[str] = set()
        repo_busy = False
        running: dict[Future[None], Copy] = {}
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while True:
                for c in next_copies(hold, frozenset(busy), repo_busy):
                    running[pool.submit(self._move, c)] = c
                    busy.add(c.source)
                    if c.destination == REPOSITORY:
                        repo_busy = True
                    else:
                        busy.add(c.destination)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    c = running.pop(fut)
                    fut.result()  # a failed copy stops the gathering: the snapshot is not safe
                    hold[c.source] = tuple(i for i in hold[c.source] if i not in c.images)
                    busy.discard(c.source)
                    if c.destination == REPOSITORY:
                        repo_busy = False
                    else:
                        hold[c.destination] = hold[c.destination] + c.images
                        busy.discard(c.destination)
                    for n in (c.source, c.destination):
                        if n != REPOSITORY and not hold[n] and n not in busy and n not in order:
                            order.append(n)
                            if on_freed is not None:
                                on_freed(n)
        return order

    def _move(self, c: Copy) -> None:
        for image in c.images:
            self.copy(image, c.source, c.destination)
