"""The vjob policy's guard: may an interactive job preempt without delaying the queue's head?

Why a guard: the UBIS reproduction (docs/ubis-reproduction.md) found that preempting freely
lets interactive jobs push the large batch job at the head of the queue back again and again
(706 h instead of 31.7 h of wait for 256+-node jobs). Under `vjob` an interactive job may
checkpoint victims only when the EASY reservation of the first batch job in the queue (the
*guard*) does not move later than `slack` seconds; otherwise it waits for nodes like under
`mms`. Both the shared pass (`tick.decide`) and the simulator's pass call `keeps_reservation`
with the same numbers, so they decide alike (tests/test_decision_differential.py).

The model of "after", deliberately pessimistic: each victim holds its nodes again from the
end of the interactive job's estimate, for what its estimate had left plus a remote resume
(2 × its checkpoint time); the free nodes the interactive job takes are held until its
estimated end. Victims resume before the guard (`policies.vjob_order`), so this is what the
guard really waits for. The victims of earlier preemptions of the same pass are counted
with their return (`returning`) in `holds`, before and after, so that several preemptions in
one pass cannot each see the others' victims vanish.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Sequence

from preemption.scheduling.easy import reservation


def returning(now: float, victims: Sequence[tuple[float, int, float]], preemptor_end: float) -> list[tuple[float, int]]:
    """The pessimistic return of `victims` ((their hold's end, nodes, checkpoint seconds)):
    each holds its nodes again until its estimated end, delayed by the preemptor's estimate
    and a remote resume (2 × its checkpoint). A victim already past its estimated end has
    nothing left by its estimate, but it is not back before the preemptor ends: its end
    counts as `now` (as EASY counts it), not earlier (the oracle in
    tests/test_decision_oracle.py found a victim 'returning' before its preemptor ended)."""
    delay = preemptor_end - now
    return [(max(end, now) + delay + 2.0 * ckpt_s, nodes) for end, nodes, ckpt_s in victims]


HARMFUL = 1e6
"""Added to a harmful victim's cost (a preempt count, at most 1000): after every harmless one."""


def harmful(now: float, guard_start: float, victims: Sequence[tuple[float, float]], preemptor_s: float) -> list[bool]:
    """Which candidate victims ((their hold's end, checkpoint seconds)) would, preempted
    alone, move their nodes' return from before the guard's reserved start `guard_start` to
    after it, by `returning`'s model (the preemptor runs `preemptor_s` from the end of that
    victim's checkpoint). Why: a victim ending after the reserved start, or so early that it
    is back and done before it, costs the guard nothing; only the ones in between do. With
    `[scheduling] victims = "guard"` the vjob pass takes the harmless ones first: the guard
    refuses fewer preemptions, interactive jobs wait 2-11 % less, but the extra preemptions
    cost batch work (docs/policy.md, ablation), so it is not the default."""
    out = []
    for end, ckpt_s in victims:
        back = returning(now, [(end, 0, ckpt_s)], now + ckpt_s + preemptor_s)[0][0]
        out.append(end <= guard_start < back)
    return out


def keeps_reservation(
    now: float,
    free: int,
    need: int,
    holds: Iterable[tuple[float, int]],
    victims: Sequence[tuple[float, int, float]],
    taken_free: int,
    preemptor_end: float,
    slack: float,
    anchor: float | None = None,
) -> tuple[bool, float]:
    """Whether the guard (a job of `need` nodes) still gets its reserved start within `slack`
    seconds of its `anchor` (the reserved start it had when first guarded; None: the one it has
    now), if the preemption happens; and the reserved start it has now (the caller keeps the
    first one as the anchor, so that many preemptions cannot push it back slack by slack).

    `holds`: (estimated end, nodes) of what holds nodes now, the victims' runs included;
    `victims`: (their hold's end, nodes, checkpoint seconds); `taken_free`: how many of the
    free nodes the interactive job takes; `preemptor_end`: when it is estimated to end.
    A guard that can never start (larger than the machine) is not delayed by anyone.
    """
    held = list(holds)
    before, _ = reservation(now, free, need, held)
    if math.isinf(before):
        return True, before
    after = reserved_after(now, free, need, held, victims, taken_free, preemptor_end)
    return after <= (before if anchor is None else anchor) + slack, before


def reserved_after(
    now: float,
    free: int,
    need: int,
    holds: Iterable[tuple[float, int]],
    victims: Sequence[tuple[float, int, float]],
    taken_free: int,
    preemptor_end: float,
) -> float:
    """The guard's reserved start if the preemption happens (`keeps_reservation`'s "after",
    with the same arguments); what a refused preemption would cost it is this minus its
    anchor (the reason a waiting user reads, preemption.scheduling.waiting)."""
    held = list(holds)
    for end, nodes, _ in victims:
        held.remove((end, nodes))
    held += returning(now, victims, preemptor_end)
    if taken_free:
        held.append((preemptor_end, taken_free))
    after, _ = reservation(now, free - taken_free, need, held)
    return after


def reserved_start(now: float, free: int, need: int, ordered: Iterable[tuple[float, int]]) -> float:
    """`easy.reservation`'s shadow time over holds given already sorted, read only as far as
    the reservation needs: the pass keeps its holds sorted between changes, so that the
    guard's check costs a few holds, not a sort of every running job (issue 37)."""
    if need <= free:
        return now
    avail = free
    for end, nodes in ordered:
        avail += nodes
        if avail >= need:
            return max(end, now)
    return math.inf


def reserved_after_sorted(
    now: float,
    free: int,
    need: int,
    ordered: Sequence[tuple[float, int]],
    victims: Sequence[tuple[float, int, float]],
    taken_free: int,
    preemptor_end: float,
) -> float:
    """`reserved_after` with `holds` given sorted (`ordered`): the same multiset of holds —
    the victims' runs taken out, their returns and the preemptor's free nodes put in — walked
    in the same sorted order, merged lazily instead of copied and sorted again."""
    gone: dict[tuple[float, int], int] = {}
    for end, nodes, _ in victims:
        gone[(end, nodes)] = gone.get((end, nodes), 0) + 1
    added = returning(now, victims, preemptor_end)
    if taken_free:
        added.append((preemptor_end, taken_free))
    added.sort()

    def kept() -> Iterator[tuple[float, int]]:
        for hold in ordered:
            if gone.get(hold):
                gone[hold] -= 1
                continue
            yield hold

    return reserved_start(now, free - taken_free, need, heapq.merge(kept(), added))


def keeps_reservation_sorted(
    now: float,
    free: int,
    need: int,
    ordered: Sequence[tuple[float, int]],
    victims: Sequence[tuple[float, int, float]],
    taken_free: int,
    preemptor_end: float,
    slack: float,
    anchor: float | None = None,
) -> tuple[bool, float]:
    """`keeps_reservation` with `holds` given sorted (`ordered`); the same answer."""
    before = reserved_start(now, free, need, ordered)
    if math.isinf(before):
        return True, before
    after = reserved_after_sorted(now, free, need, ordered, victims, taken_free, preemptor_end)
    return after <= (before if anchor is None else anchor) + slack, before
