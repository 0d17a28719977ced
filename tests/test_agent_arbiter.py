"""The tick's arbiter (agent.arbiter): one test per rule, on plain values, nothing run.

Why here and not only through the agent's tests: the rules used to be `if` chains in the loop,
held only by what a whole tick happened to do; each rule is now a function whose answer a test
states, so a change of precedence is a change of this file.
"""

from __future__ import annotations

from agent import remap_step
from agent.arbiter import (
    RULES,
    Proposals,
    TickPlan,
    arbitrate,
    consolidation,
    deadline_checkpoints,
    remap_follows,
    remap_moves,
)
from agent.deadline import DeadlineAction, DeadlineProposal, JobDeadline, Step
from preemption.remap.claims import PassClaims
from preemption.remap.live import Move
from preemption.scheduling.tick import Decision, Preemption, Release

PRE = Preemption(job_id="i1", victims=("v1", "v2"), nodes=("n1",), checkpoint_bytes=0.0)
REL = (Release("h1", ("n2",)), Release("h2"))


def _decision(*, preempt: bool = False) -> Decision:
    return Decision(
        rms_priorities={"p1": 900, "p2": 800},
        preemptions=(PRE,) if preempt else (),
        releases=REL,
        placements={"i1": ("n1",), "s1": ("n3",)},
    )


def test_every_rule_is_named() -> None:
    assert RULES == (
        "RULE_PRIORITIES",
        "RULE_STORE_DOWN",
        "RULE_CLAIMS",
        "RULE_DEADLINE_GATES_RELEASES",
        "RULE_PREEMPTION_FIRST",
        "RULE_ONE_LIVE_SWITCH",
    )


def test_rule_priorities_go_out_whatever_the_store() -> None:
    for ok in (True, False):
        assert arbitrate(Proposals(_decision(), store_ok=ok)).priorities == {"p1": 900, "p2": 800}


def test_rule_store_down_does_nothing_that_needs_the_journal() -> None:
    plan = arbitrate(Proposals(_decision(preempt=True), store_ok=False, deadline=True, control=True, remap=True))
    assert not plan.journals
    assert plan.preemptions == () and plan.releases == ()
    assert not plan.consolidate and not plan.remap
    assert plan.deadline, "the deadline duty still evaluates and publishes X"
    up = arbitrate(Proposals(_decision(preempt=True), store_ok=True))
    assert up.journals and up.preemptions == (PRE,) and up.releases == REL


def test_rule_claims_the_deadline_duty_leaves_the_pass_its_victims() -> None:
    plan = arbitrate(Proposals(_decision(preempt=True), store_ok=True, deadline=True))
    assert plan.deadline_refused == {
        "v1": "job v1: checkpointed by this tick's preemption instead",
        "v2": "job v2: checkpointed by this tick's preemption instead",
    }
    assert arbitrate(Proposals(_decision(), store_ok=True, deadline=True)).deadline_refused == {}


def test_rule_claims_the_remap_step_leaves_the_pass_its_vjobs_and_nodes() -> None:
    plan = arbitrate(Proposals(_decision(preempt=True), store_ok=True, remap=True))
    assert plan.remap_claims == PassClaims(suspending=frozenset({"v1", "v2"}), given=frozenset({"n1", "n3"}))
    quiet = arbitrate(Proposals(_decision(), store_ok=True, remap=True))
    assert quiet.remap_claims == PassClaims(given=frozenset({"n1", "n3"}))


def test_rule_claims_refuses_the_deadline_dutys_checkpoints_of_the_pass_victims() -> None:
    def action(job: str, step: Step) -> DeadlineAction:
        return DeadlineAction(job, step, JobDeadline(job, 100.0, 2.0, 150.0, step.value))

    actions = (action("v1", Step.CHECKPOINT), action("v2", Step.CANCEL), action("d3", Step.CHECKPOINT))
    proposal = DeadlineProposal(rows=tuple(a.row for a in actions), actions=actions, now=0.0)
    assert proposal.checkpoints == ("v1", "d3")
    taken = deadline_checkpoints(arbitrate(Proposals(_decision(preempt=True), store_ok=True, deadline=True)), proposal)
    assert taken.refused == {"v1": "job v1: checkpointed by this tick's preemption instead"}
    assert taken.actions == actions and taken.rows == proposal.rows, "refused, not dropped: the failure is logged"
    quiet = arbitrate(Proposals(_decision(), store_ok=True, deadline=True))
    assert deadline_checkpoints(quiet, proposal) is proposal


def test_rule_deadline_gates_releases_only_when_the_duty_is_on() -> None:
    assert arbitrate(Proposals(_decision(), store_ok=True, deadline=True)).gate_releases
    assert not arbitrate(Proposals(_decision(), store_ok=True, deadline=False)).gate_releases


def test_rule_preemption_first_no_consolidation_in_a_preempting_tick() -> None:
    assert arbitrate(Proposals(_decision(), store_ok=True, control=True)).consolidate
    assert not arbitrate(Proposals(_decision(preempt=True), store_ok=True, control=True)).consolidate
    assert not arbitrate(Proposals(_decision(), store_ok=True, control=False)).consolidate


def test_rule_one_live_switch_remap_only_when_the_control_loop_switched_nothing() -> None:
    plan = arbitrate(Proposals(_decision(), store_ok=True, control=True, remap=True))
    assert plan.remap
    assert remap_follows(plan, consolidated=False)
    assert not remap_follows(plan, consolidated=True)
    assert not remap_follows(arbitrate(Proposals(_decision(), store_ok=True, remap=False)), consolidated=False)


def test_rule_preemption_first_drops_the_control_loops_switch_in_a_preempting_tick() -> None:
    switch = object()  # the control loop's proposal: the arbiter takes it whole or drops it
    assert consolidation(arbitrate(Proposals(_decision(), store_ok=True, control=True)), switch) is switch
    assert consolidation(arbitrate(Proposals(_decision(preempt=True), store_ok=True, control=True)), switch) is None
    assert consolidation(arbitrate(Proposals(_decision(), store_ok=False, control=True)), switch) is None
    assert consolidation(arbitrate(Proposals(_decision(), store_ok=True, control=True)), None) is None


def _moves(*moves: Move) -> remap_step.Proposal:
    return remap_step.Proposal(moves=moves, every=(), moved_to={})


def test_rule_one_live_switch_drops_the_remap_proposal_after_a_switch() -> None:
    plan = arbitrate(Proposals(_decision(), store_ok=True, control=True, remap=True))
    home = _moves(Move("h9", "vm-h9", "n8", "n9", "home"))
    assert remap_moves(plan, False, home) is home
    assert remap_moves(plan, True, home) is None
    assert remap_moves(arbitrate(Proposals(_decision(), store_ok=True, remap=False)), False, home) is None


def test_rule_claims_refuses_the_remap_moves_on_what_the_pass_acts_on() -> None:
    plan = arbitrate(Proposals(_decision(preempt=True), store_ok=True, remap=True))
    suspended = Move("v1", "vm-v1", "n5", "n6", "home")
    onto_given = Move("h8", "vm-h8", "n5", "n3", "home")
    free = Move("h9", "vm-h9", "n8", "n9", "swap")
    taken = remap_moves(plan, False, _moves(suspended, onto_given, free))
    assert taken is not None and taken.moves == (free,)
    assert taken.refused == (
        (suspended, "the vjob policy suspends it this tick"),
        (onto_given, "the vjob policy gives n3 to another job this tick"),
    )
    assert taken.every == () and taken.moved_to == {}, "the rest of the proposal is carried as it was"


def test_the_plan_is_a_value_state_in_plan_out() -> None:
    p = Proposals(_decision(preempt=True), store_ok=True, deadline=True, control=True, remap=True)
    assert arbitrate(p) == arbitrate(p)
    assert isinstance(arbitrate(p), TickPlan)
