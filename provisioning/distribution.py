"""Planning OS image transfers down a balanced binary tree (UBIS section III.C).

Why a tree with routing tables: all images start at the head node; sending every copy from
the head makes it the bottleneck. The nodes form a balanced binary tree rooted at the head,
every node that received an image (and every node on the way) remembers where it went, and
the next request for that image is served by the nearest holder instead of the head. Each
node sends one copy at a time, so copies go in rounds; a node that received the image in
one round serves others in the next, and the number of rounds grows like log2 of the
number of targets instead of linearly.

Pure functions of node names and holders: no I/O, usable by the simulator and tested alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from vjob.errors import InputError


@dataclass(frozen=True)
class Tree:
    """A balanced binary tree over the nodes in heap order: the head at index 0."""

    nodes: tuple[str, ...]

    @classmethod
    def build(cls, head: str, nodes: Iterable[str]) -> Tree:
        others = sorted(set(nodes) - {head}, key=_natural)
        return cls((head, *others))

    @property
    def head(self) -> str:
        return self.nodes[0]

    def index(self, node: str) -> int:
        try:
            return self.nodes.index(node)
        except ValueError:
            raise InputError(f"node {node!r} is not in the distribution tree ({', '.join(self.nodes)})") from None

    def parent(self, node: str) -> str | None:
        i = self.index(node)
        return None if i == 0 else self.nodes[(i - 1) // 2]

    def children(self, node: str) -> tuple[str, ...]:
        i = self.index(node)
        return tuple(self.nodes[c] for c in (2 * i + 1, 2 * i + 2) if c < len(self.nodes))

    def ancestors(self, node: str) -> list[str]:
        """From `node` up to the head, both included."""
        path = [node]
        while (up := self.parent(path[-1])) is not None:
            path.append(up)
        return path

    def path(self, src: str, dst: str) -> list[str]:
        """The tree path from `src` to `dst`, both included."""
        up_src, up_dst = self.ancestors(src), self.ancestors(dst)
        common = next(n for n in up_src if n in set(up_dst))
        down = up_dst[: up_dst.index(common)]
        return up_src[: up_src.index(common) + 1] + list(reversed(down))

    def distance(self, src: str, dst: str) -> int:
        return len(self.path(src, dst)) - 1


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting node2 before node10, as operators number their nodes."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|\D+", name))


@dataclass(frozen=True)
class Transfer:
    """One copy of the image in one round: `source` sends to `target` along `route`."""

    round: int
    source: str
    target: str
    route: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    image: str
    tree: Tree
    transfers: tuple[Transfer, ...]
    already: tuple[str, ...]
    """Targets that held the image before: nothing to send."""

    @property
    def rounds(self) -> int:
        return max((t.round for t in self.transfers), default=0)

    def by_round(self) -> dict[int, list[Transfer]]:
        out: dict[int, list[Transfer]] = {}
        for t in self.transfers:
            out.setdefault(t.round, []).append(t)
        return out


def plan(image: str, tree: Tree, holders: Iterable[str], targets: Iterable[str]) -> Plan:
    """Who sends the image to whom in which round, each node sending at most once a round.

    Targets nearest the holders are served first; every target is served by the nearest
    free holder (tree hops, ties broken by tree order), which is what following the
    routing tables gives.
    """
    have = {tree.head, *holders}
    wanted = sorted(set(targets), key=tree.index)
    for node in [*have, *wanted]:
        tree.index(node)
    already = tuple(n for n in wanted if n in have)
    todo = [n for n in wanted if n not in have]
    transfers: list[Transfer] = []
    rnd = 0
    while todo:
        rnd += 1
        busy: set[str] = set()
        received: list[str] = []
        # The target closest to any current holder goes first, so that it can relay soonest.
        todo.sort(key=lambda n: (min(tree.distance(h, n) for h in have), tree.index(n)))
        for target in list(todo):
            free = [h for h in have if h not in busy]
            if not free:
                break
            source = min(free, key=lambda h: (tree.distance(h, target), tree.index(h)))
            busy.add(source)
            transfers.append(Transfer(rnd, source, target, tuple(tree.path(source, target))))
            received.append(target)
            todo.remove(target)
        have.update(received)
    return Plan(image, tree, tuple(transfers), already)


def routing_tables(tree: Tree, received_from: Mapping[str, str | None]) -> dict[str, dict[str, str]]:
    """Per node: for one image, the next hop towards each holder it routed the image to.

    `received_from` maps every holder to the node it got the image from (None for the head).
    Every node on the tree path between the two keeps an entry `holder -> next hop`, so a
    later request reaching it is forwarded towards that holder.
    """
    tables: dict[str, dict[str, str]] = {}
    for holder, source in received_from.items():
        if source is None:
            continue
        route = tree.path(source, holder)
        for here, nxt in pairwise(route):
            tables.setdefault(here, {})[holder] = nxt
    return tables


def nearest_holder(tree: Tree, holders: Iterable[str], node: str) -> str:
    """The holder a request from `node` is served by (the head holds every image)."""
    candidates = {tree.head, *holders}
    return min(candidates, key=lambda h: (tree.distance(h, node), tree.index(h)))
