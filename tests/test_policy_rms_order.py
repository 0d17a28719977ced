"""The RMS's priority knob follows the order the pass walks, under every policy.

Why: the agent does not start pending jobs itself, the RMS does, in the order of the integer
priorities the agent writes on its knob (Slurm's site factor, PBS's priority). If those
priorities rank the queue differently from the order the pass (and the simulator) decided,
the RMS starts another job than the one the pass reserved for — under `vjob` Slurm started a
small batch job ahead of the large head job (tests/test_policy_live_order.py). Checked here
without a real RMS: the priorities the pass hands the agent, on random states of every
policy, against the order it walked (`Decision.order`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.act import priorities_to_send
from preemption.scheduling.tick import _rank_priorities
from tests.test_decision_differential import State, cluster_view, run_decision, states
from vjob.model import Job, JobState
from vjob.rms import PriorityKnob

SLURM_KNOB = PriorityKnob(0, 1_000_000, min_step=1000)
PBS_KNOB = PriorityKnob(-1024, 1023)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states(), st.sampled_from([SLURM_KNOB, PBS_KNOB]))
def test_the_knob_ranks_the_pending_jobs_in_the_passs_order(s: State, knob: PriorityKnob) -> None:
    view, _ = cluster_view(s)
    d = run_decision(s, knob)
    pending = [j for j in d.order if view.job(j).state is JobState.PENDING]
    rms = sorted(pending, key=lambda j: (-d.rms_priorities[j], view.job(j).submit_time, int(j)))
    assert rms == pending, (s.policy, [(j, d.rms_priorities[j]) for j in pending])


def _held_after_ticks(send_rule, seed: int, ticks: int = 40) -> list[tuple[list[str], dict[str, int], int]]:
    """A long queue changing tick by tick (jobs start from the front and from anywhere, new
    ones arrive, interactive ones go first), its order written onto Slurm's knob with
    `send_rule`; after each tick the order, the values the RMS then holds and how many
    commands were sent."""
    rng = np.random.default_rng(seed)
    queue = [str(i) for i in range(1500)]
    nxt = len(queue)
    held: dict[str, int] = {}
    out = []
    for _ in range(ticks):
        for _ in range(int(rng.integers(0, 4))):
            queue.pop(int(rng.integers(0, len(queue))) if rng.random() < 0.5 else 0)
        for _ in range(int(rng.integers(0, 4))):
            queue.insert(0 if rng.random() < 0.3 else len(queue), str(nxt))
            nxt += 1
        wanted = _rank_priorities([Job(id=j, user="u", rms="slurm") for j in queue], {}, SLURM_KNOB)
        held = {j: v for j, v in held.items() if j in wanted}
        send = send_rule(held, wanted, SLURM_KNOB)
        held.update(send)
        out.append((list(queue), dict(held), len(send)))
    return out


def _changed_by_a_step(sent: dict[str, int], wanted: dict[str, int], knob: PriorityKnob) -> dict[str, int]:
    """The agent's former rule: a value is sent only when it moved by `min_step` or more."""
    return {j: v for j, v in wanted.items() if j not in sent or abs(sent[j] - v) >= knob.min_step}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_the_agent_writes_keeps_the_order_of_a_long_changing_queue(seed: int) -> None:
    sent = 0
    for order, held, commands in _held_after_ticks(priorities_to_send, seed)[1:]:
        assert sorted(order, key=lambda j: -held[j]) == order
        assert len(set(held.values())) == len(order)
        assert all(SLURM_KNOB.low <= v <= SLURM_KNOB.high for v in held.values())
        sent += commands
    former = _held_after_ticks(_changed_by_a_step, seed)[1:]
    # the former rule (skip changes under a step) let neighbours' stale values cross ...
    assert any(sorted(order, key=lambda j: -held[j]) != order for order, held, _ in former)
    # ... and still sent hundreds of commands a tick: every rank behind a change moves
    assert sent * 10 < sum(commands for _, _, commands in former)


def test_jobs_already_in_order_are_not_resent() -> None:
    knob = PriorityKnob(0, 1000, min_step=10)
    assert priorities_to_send({"a": 900, "b": 500}, {"a": 950, "b": 420}, knob) == {}
    assert priorities_to_send({"a": 900, "b": 500}, {"a": 950, "c": 700, "b": 420}, knob) == {"c": 700}
    assert priorities_to_send({"a": 900, "b": 500}, {"a": 900, "b": 600, "c": 300}, knob) == {"c": 300}
    assert priorities_to_send({"a": 900, "b": 500}, {"a": 900, "b": 600, "c": 550}, knob) == {"c": 250}
    assert priorities_to_send({}, {"a": 900, "b": 600}, knob) == {"a": 900, "b": 600}  # a first tick
    # b now goes first: one of the two keeps its value, the other is placed around it
    moved = priorities_to_send({"a": 900, "b": 500}, {"b": 900, "a": 500}, knob)
    held = {"a": 900, "b": 500} | moved
    assert len(moved) == 1 and held["b"] > held["a"]
    # no integer left between 501 and 500 for c: b gives up its value, c and b go below a's
    assert priorities_to_send({"a": 501, "b": 500}, {"a": 900, "c": 700, "b": 500}, knob) == {"c": 334, "b": 166}
