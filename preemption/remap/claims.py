"""Remapping and the vjob policy pass in one agent tick: who may touch which VM (pure).

Why a rule at all: the pass checkpoints victims and hands their nodes (and free ones) to the
jobs it starts, interactive ones first; the remap step live-migrates VMs between nodes. Each
acting on a VM or a node the other is using would break the other: a VM migrated while its
pilot suspends it, a VM swapped onto a node an interactive job is about to get, a victim
checkpointed in the middle of a swap. The rule, both ways:

- the remap step leaves out every vjob the pass suspends this tick, and every vjob with a VM
  on, or an allocation including, a node the pass gives to a job it starts (`remappable`):
  such a job is in no swap. A move home (the RMS view of preemption.remap.live) goes unless
  its job is suspended or its destination is given away; leaving a node the pass gives away
  is exactly what it must do (`allowed_moves`, which drops a decision whole: never half a
  swap, never some VMs of a job);
- the pass never takes as a victim a vjob the remapping has moved: one with a VM off its own
  allocation, or whose own node another job's VM sits on (`remapped`). The agent's
  `checkpointable` (a running pilot on an allocated node) applies the first half; a swap
  always moves both jobs off their nodes, so it implies the second.

Every dropped candidate keeps its reason, for the log and `vjob status`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from preemption.remap.live import Move, Placement


class Preempting(Protocol):
    """A preemption of the pass (preemption.scheduling.tick.Preemption): its victims, its nodes."""

    @property
    def victims(self) -> Sequence[str]: ...

    @property
    def nodes(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class PassClaims:
    """What the policy pass acts on this tick."""

    suspending: frozenset[str] = frozenset()
    """vjobs it checkpoints (its preemptions' victims)."""
    given: frozenset[str] = frozenset()
    """Nodes it hands to jobs it starts (the preemptors' nodes and every start's placement)."""


def claims(preemptions: Iterable[Preempting], placements: Mapping[str, Sequence[str]]) -> PassClaims:
    """The claims of a pass's decision: its preemptions and the nodes of the jobs it starts."""
    suspending: set[str] = set()
    given: set[str] = set()
    for pre in preemptions:
        suspending.update(pre.victims)
        given.update(pre.nodes)
    for nodes in placements.values():
        given.update(nodes)
    return PassClaims(frozenset(suspending), frozenset(given))


def remappable(places: Iterable[Placement], c: PassClaims) -> tuple[list[Placement], dict[str, str]]:
    """The placements the remapping may decide on, and why each other one is left out."""
    keep: list[Placement] = []
    skipped: dict[str, str] = {}
    for p in places:
        nodes = sorted((set(p.hosts) | set(p.allocated)) & c.given)
        if p.job in c.suspending:
            skipped[p.job] = "the vjob policy suspends it this tick"
        elif nodes:
            skipped[p.job] = f"the vjob policy gives its node(s) {', '.join(nodes)} to another job this tick"
        else:
            keep.append(p)
    return keep, skipped


def allowed_moves(moves: Iterable[Move], c: PassClaims) -> tuple[list[Move], list[tuple[Move, str]]]:
    """The moves that respect the pass's claims, and the dropped ones with their reasons. A
    decision goes whole or not at all (`Move.key`: both jobs of a swap, every VM of a job going
    home): one move refused drops every other move of its decision, with that reason."""
    moves = list(moves)
    own: dict[Move, str] = {}
    for m in moves:
        if m.job in c.suspending:
            own[m] = "the vjob policy suspends it this tick"
        elif m.dst in c.given:
            own[m] = f"the vjob policy gives {m.dst} to another job this tick"
    first = {}
    for m, why in own.items():
        first.setdefault(m.key, (m, why))
    keep: list[Move] = []
    dropped: list[tuple[Move, str]] = []
    for m in moves:
        if m in own:
            dropped.append((m, own[m]))
        elif m.key in first:
            other, why = first[m.key]
            dropped.append((m, f"{m.key} goes whole or not at all, and {other.vm} of {other.job} may not move: {why}"))
        else:
            keep.append(m)
    return keep, dropped


def remapped(places: Iterable[Placement]) -> set[str]:
    """vjobs the pass must not take as victims: a VM off their allocation, or their own node
    hosting another job's VM (the two halves of a swap)."""
    places = list(places)
    occupied = {node: p.job for p in places for node in p.hosts}
    out: set[str] = set()
    for p in places:
        if not p.allocated:
            continue
        if any(h not in p.allocated for h in p.hosts):
            out.add(p.job)
        if any(occupied.get(n, p.job) != p.job for n in p.allocated):
            out.add(p.job)
    return out


__all__ = ["PassClaims", "Preempting", "allowed_moves", "claims", "remappable", "remapped"]
