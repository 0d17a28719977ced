"""The tick's arbiter (agent.arbiter): one test per rule, on plain values, nothing run.

Why here and not only through the agent's tests: the rules used to be `if` chains in the loop,
held only by what a whole tick happened to do; each rule is now a function whose answer a test
states, so a change of precedence is a change of this file.
"""

from __future__ import annotations

from agent.arbiter import RULES, Proposals, TickPlan, arbitrate, remap_follows
from preemption.remap.claims import PassClaims
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


def test_the_plan_is_a_value_state_in_plan_out() -> None:
    p = Proposals(_decision(preempt=True), store_ok=True, deadline=True, control=True, remap=True)
    assert arbitrate(p) == arbitrate(p)
    assert isinstance(arbitrate(p), TickPlan)
