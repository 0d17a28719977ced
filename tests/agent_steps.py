"""The agent's deadline duty, control loop and remap step as one call each, for the tests that
drive a step alone.

Why: in the agent each step proposes (DeadlineKeeper.propose, agent.consolidate.propose,
agent.remap_step.propose), the arbiter takes or trims the proposal against the tick's plan
(agent.arbiter) and the step carries it out (agent.loop). A test of one step alone stands for a
tick whose plan lets it act (no preemption, no switch before the remap step), the pass's
`claims` given to the remap step.
"""

from __future__ import annotations

from agent import consolidate, deadline_actions, remap_step
from agent.arbiter import TickPlan, consolidation, deadline_checkpoints, remap_moves
from agent.deadline import DeadlineKeeper, JobDeadline
from agent.observe import Observation
from agent.ports import Ports
from preemption.executor import ExecutionReport
from preemption.remap.claims import PassClaims
from vjob.model import ClusterView
from vjob.rms import RMSAdapter
from vjob.store.db import Store


def control_step(ports: Ports, obs: Observation, state: consolidate.ControlState) -> ExecutionReport | None:
    """One control step: propose, the arbiter takes it, carry it out (None: nothing done)."""
    switch = consolidation(TickPlan(consolidate=True), consolidate.propose(ports, obs, state))
    return None if switch is None else consolidate.carry_out(ports, obs, state, switch)


def remap_look(
    ports: Ports, obs: Observation, state: remap_step.RemapState, claims: PassClaims | None = None
) -> ExecutionReport | None:
    """One remapping look: propose the moves, the arbiter checks them against `claims`, carry
    them out (None: no move this look)."""
    plan = TickPlan(remap=True, remap_claims=claims or PassClaims())
    taken = remap_moves(plan, False, remap_step.propose(ports, obs, state, plan.remap_claims))
    return None if taken is None else remap_step.carry_out(ports, obs, state, taken)


def deadline_duty(
    keeper: DeadlineKeeper, view: ClusterView, adapter: RMSAdapter, *, act: bool, store: Store | None = None
) -> list[JobDeadline]:
    """One tick of the deadline duty: propose, the arbiter (nothing preempted: nothing refused),
    carry out with no VM to save (a job over X is cancelled or requeued through the RMS)."""
    proposal = deadline_checkpoints(TickPlan(deadline=True), keeper.propose(view, adapter, act=act, store=store))
    return deadline_actions.carry_out(keeper, proposal, adapter)
