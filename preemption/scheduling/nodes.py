"""Which nodes a starting job gets: the node choice of the scheduling pass.

Why a rule at all, when live the RMS picks the nodes: the pass (`tick.decide`) must know which
nodes each job it starts takes, so that the next job of the same pass sees the right free
nodes per OS image (the UBIS N_availableOS term, victim choice) and so that a checkpointed job
is released onto the nodes holding its saved state. The simulator applies the same rule with
compiled code (`simulator/node_pool.take_nodes`, its numba twin;
tests/test_decision_differential.py holds the two equal).

The rule: a resumed job gets its previous nodes back when all of them are free (a local resume
reads its checkpoint at full speed); otherwise the free nodes already running its OS image,
first in node order, then other free nodes in node order (each of those switches image). A job
that asks for no image ("") takes free nodes in node order and switches none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def pick_nodes(
    free: Sequence[str], node_os: Mapping[str, str], image: str, count: int, previous: Sequence[str] = ()
) -> tuple[tuple[str, ...], bool]:
    """`count` of the `free` nodes (given in node order) for a job asking for `image`.

    Returns (nodes, resumed locally). The caller knows `count` nodes are free.
    """
    if previous and len(previous) == count and set(previous) <= set(free):
        return tuple(previous), True
    if not image:
        return tuple(free[:count]), False
    on_image = [n for n in free if node_os[n] == image]
    others = [n for n in free if node_os[n] != image]
    return tuple((on_image + others)[:count]), False


def preemptor_nodes(
    free: Sequence[str], victims_nodes: Sequence[Sequence[str]], node_os: Mapping[str, str], image: str, count: int
) -> tuple[str, ...]:
    """The nodes an interactive job takes once its victims are checkpointed: from the free
    nodes (node order) followed by each victim's nodes (victims lowest priority first, each
    victim's nodes in its allocation order), those already on `image` first, the others after,
    each group in that order."""
    pool = [*free, *(n for nodes in victims_nodes for n in nodes)]
    if not image:
        return tuple(pool[:count])
    return tuple(([n for n in pool if node_os[n] == image] + [n for n in pool if node_os[n] != image])[:count])


def swaps(nodes: Sequence[str], node_os: Mapping[str, str], image: str) -> int:
    """How many of `nodes` must switch OS image to run `image` (none when it asks for none)."""
    return 0 if not image else sum(1 for n in nodes if node_os[n] != image)
