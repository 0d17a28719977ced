"""One plan per tick: how the agent's four deciders share a tick, by named rules (pure).

Why an arbiter: one tick hears four deciders — the scheduling pass (priorities, preemptions,
releases: preemption.scheduling.tick), the deadline duty (cancels, checkpoints, its hold on the
jobs it parked: agent.deadline), the control loop (a consolidation switch: agent.consolidate) and
live remapping (migrations: agent.remap_step). Each would break the others if it acted on their
VMs in the same tick, and their precedence used to be spelled as `if` chains in the loop. Here
it is state in, plan out (as a Nomad plan applier): `arbitrate` takes what each decider
proposes and what the tick knows, and returns the one TickPlan the loop carries out, each
rule a function of its own so that a test holds each:

- RULE_PRIORITIES: the pass's priorities go out every tick, the store up or not (sending one
  twice is harmless, and the RMS keeps scheduling by them if the agent dies);
- RULE_STORE_DOWN: with the store down nothing that needs the journal is done — no deadline
  action, preemption, release, consolidation or remapping (the deadline duty still evaluates
  and publishes X);
- RULE_CLAIMS: what the pass acts on this tick is its own: the deadline duty checkpoints no
  victim of the pass's preemptions (one save per VM; looked at again next tick), and the remap
  step moves none of what the pass suspends or the nodes it gives away (preemption.remap.claims);
- RULE_DEADLINE_GATES_RELEASES: a job the deadline duty checkpointed is released only where it
  would make its deadline (agent.deadline.DeadlineKeeper.releases);
- RULE_PREEMPTION_FIRST: the control loop does not consolidate in a tick that preempts (its
  measurements predate the switch);
- RULE_ONE_LIVE_SWITCH: the remap step runs only when the control loop carried out (or
  journalled) no switch this tick (`remap_follows`, decided once consolidation has answered).

The control loop and the remap step answer later in the tick than the pass (they measure the
VMs after its preemptions and releases, and the remap step waits for the control loop's
outcome), so their proposals reach the arbiter in a second stage, against the tick's plan:
`consolidation` takes the control loop's proposed switch or drops it (RULE_PREEMPTION_FIRST,
RULE_STORE_DOWN), `remap_moves` the remap step's moves (RULE_ONE_LIVE_SWITCH, and RULE_CLAIMS:
a move of a vjob the pass suspends, or onto a node it gives away, is refused with its reason).
A step is asked for its proposal only when the plan could take it: proposing measures the VMs.
The deadline duty answers first, before the pass acts: `deadline_checkpoints` refuses its
checkpoints of the pass's victims (RULE_CLAIMS), each with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from preemption.remap.claims import PassClaims, allowed_moves, claims
from preemption.remap.live import Move
from preemption.scheduling.tick import Decision, Preemption, Release

RULES = (
    "RULE_PRIORITIES",
    "RULE_STORE_DOWN",
    "RULE_CLAIMS",
    "RULE_DEADLINE_GATES_RELEASES",
    "RULE_PREEMPTION_FIRST",
    "RULE_ONE_LIVE_SWITCH",
)
"""The rules `arbitrate` applies, in the order of the module docstring."""


@dataclass(frozen=True)
class Proposals:
    """What the deciders propose this tick, and what the tick knows before acting."""

    decision: Decision
    """The scheduling pass: priorities, preemptions, releases and the placements of its starts."""
    store_ok: bool
    """Whether this tick's observation reached the store (the journal)."""
    deadline: bool = False
    """The deadline duty is on (`[deadline] admission` is not `none`)."""
    control: bool = False
    """The control loop is on (`planner.interval_s` > 0); whether its interval has passed is
    its own to say when the plan reaches it (a tick that acted first may have made it due)."""
    remap: bool = False
    """Live remapping is on (`[remap] farm_file`)."""


@dataclass(frozen=True)
class TickPlan:
    """What the tick does, in the order the loop does it."""

    priorities: Mapping[str, int] = field(default_factory=dict)
    journals: bool = True
    """Whether anything that needs the journal is done this tick (RULE_STORE_DOWN)."""
    deadline: bool = False
    """Run the deadline duty (evaluate, publish X; act when `journals`)."""
    deadline_refused: Mapping[str, str] = field(default_factory=dict)
    """job → why the deadline duty may not checkpoint it this tick (RULE_CLAIMS)."""
    preemptions: tuple[Preemption, ...] = ()
    releases: tuple[Release, ...] = ()
    gate_releases: bool = False
    """The deadline duty filters `releases` (RULE_DEADLINE_GATES_RELEASES)."""
    consolidate: bool = False
    """Let the control loop step if its interval has passed (RULE_PREEMPTION_FIRST)."""
    remap: bool = False
    """Run the remap step, unless the control loop switched (RULE_ONE_LIVE_SWITCH)."""
    remap_claims: PassClaims = field(default_factory=PassClaims)
    """What the remap step leaves alone (RULE_CLAIMS)."""


def priorities(p: Proposals) -> Mapping[str, int]:
    """RULE_PRIORITIES: the pass's integer priorities, every tick."""
    return p.decision.rms_priorities


def journals(p: Proposals) -> bool:
    """RULE_STORE_DOWN: only a tick that reached the store does what must be journalled."""
    return p.store_ok


def deadline_refused(p: Proposals) -> dict[str, str]:
    """RULE_CLAIMS, for the deadline duty: each victim of the pass's preemptions is theirs."""
    victims = [v for pre in p.decision.preemptions for v in pre.victims]
    return {v: f"job {v}: checkpointed by this tick's preemption instead" for v in victims}


def remap_claims(p: Proposals) -> PassClaims:
    """RULE_CLAIMS, for the remap step: what the pass suspends and the nodes it gives away."""
    return claims(p.decision.preemptions, p.decision.placements)


def gate_releases(p: Proposals) -> bool:
    """RULE_DEADLINE_GATES_RELEASES: the deadline duty, when on, has the last word on releases."""
    return p.deadline


def consolidates(p: Proposals) -> bool:
    """RULE_PREEMPTION_FIRST (and RULE_STORE_DOWN): the control loop may step (when it is due)
    if the store answers and the pass preempts nothing."""
    return journals(p) and p.control and not p.decision.preemptions


def arbitrate(p: Proposals) -> TickPlan:
    """The one plan of a tick, from its deciders' proposals."""
    ok = journals(p)
    return TickPlan(
        priorities=priorities(p),
        journals=ok,
        deadline=p.deadline,
        deadline_refused=deadline_refused(p),
        preemptions=p.decision.preemptions if ok else (),
        releases=p.decision.releases if ok else (),
        gate_releases=gate_releases(p),
        consolidate=consolidates(p),
        remap=ok and p.remap,
        remap_claims=remap_claims(p),
    )


def remap_follows(plan: TickPlan, consolidated: bool) -> bool:
    """RULE_ONE_LIVE_SWITCH: the remap step runs when the plan has it and the control loop
    carried out or journalled no switch this tick (`consolidated`)."""
    return plan.remap and not consolidated


Switch = TypeVar("Switch")
"""The control loop's proposed switch (agent.consolidate.Proposal): the arbiter only takes or drops it."""


class MovesProposal(Protocol):
    """The remap step's proposal (agent.remap_step.Proposal, a dataclass): its moves, and the
    moves refused so far with why."""

    @property
    def moves(self) -> Sequence[Move]: ...

    @property
    def refused(self) -> Sequence[tuple[Move, str]]: ...


Moves = TypeVar("Moves", bound=MovesProposal)


class CheckpointsProposal(Protocol):
    """The deadline duty's proposal (agent.deadline.DeadlineProposal, a dataclass): the jobs it
    would checkpoint, and the checkpoints refused so far with why."""

    @property
    def checkpoints(self) -> Sequence[str]: ...

    @property
    def refused(self) -> Mapping[str, str]: ...


Checkpoints = TypeVar("Checkpoints", bound=CheckpointsProposal)


def deadline_checkpoints(plan: TickPlan, proposal: Checkpoints) -> Checkpoints:
    """RULE_CLAIMS, on the deadline duty's proposal: its checkpoint of a victim of the pass's
    preemptions is refused, with why (the pass saves that VM; looked at again next tick)."""
    refused = {j: plan.deadline_refused[j] for j in proposal.checkpoints if j in plan.deadline_refused}
    if not refused:
        return proposal
    return replace(proposal, refused={**proposal.refused, **refused})


def consolidation(plan: TickPlan, proposal: Switch | None) -> Switch | None:
    """RULE_PREEMPTION_FIRST (and RULE_STORE_DOWN), on the control loop's proposal: its switch
    is carried out only in a tick whose plan lets the loop consolidate."""
    return proposal if plan.consolidate else None


def remap_moves(plan: TickPlan, consolidated: bool, proposal: Moves) -> Moves | None:
    """RULE_ONE_LIVE_SWITCH and RULE_CLAIMS, on the remap step's proposal: none after a switch
    of the control loop (`consolidated`); of its moves, those of a vjob the pass suspends or
    onto a node it gives away are refused, with their reasons (preemption.remap.claims)."""
    if not remap_follows(plan, consolidated):
        return None
    keep, dropped = allowed_moves(proposal.moves, plan.remap_claims)
    if not dropped:
        return proposal
    return replace(proposal, moves=tuple(keep), refused=(*proposal.refused, *dropped))


__all__ = [
    "RULES",
    "CheckpointsProposal",
    "MovesProposal",
    "Proposals",
    "TickPlan",
    "arbitrate",
    "consolidation",
    "deadline_checkpoints",
    "remap_follows",
    "remap_moves",
]
