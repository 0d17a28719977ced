"""`agent.act.priorities_to_send` with equal wanted values finds the moved ones in C first.

With more queued jobs than the knob has values, or vjob's tier bands (many jobs a value), the
former rule applies: a job is sent its value when the RMS holds none from vjob or one at least
`min_step` away. The jobs are filtered first by "moved at all" (the look-ups and compares made
in C, most jobs did not move); held here against the rule written plainly, entry by entry and
in order, on seeded random queues.
"""

from __future__ import annotations

import random

import pytest

from agent.act import priorities_to_send
from vjob.rms import PriorityKnob


@pytest.mark.parametrize("seed", range(30))
def test_the_moved_jobs_are_those_of_the_plain_rule(seed: int) -> None:
    rnd = random.Random(seed)
    knob = PriorityKnob(0, 10**6, min_step=rnd.choice((1, 7, 1000)), share=0.5)
    wanted = {str(i): rnd.randrange(0, 6) * 1000 + rnd.randrange(0, 3) for i in range(rnd.randrange(30, 400))}
    sent = {}
    for job, value in wanted.items():
        roll = rnd.random()
        if roll < 0.6:
            sent[job] = value
        elif roll < 0.9:
            sent[job] = value + rnd.choice((-1, 1, -knob.min_step, knob.min_step, 3 * knob.min_step, 999))
    sent["gone"] = 5
    had, step = sent.get, knob.min_step
    plain = {j: v for j, v in wanted.items() if had(j) is None or abs(had(j) - v) >= step}
    got = priorities_to_send(sent, wanted, knob)
    assert len(set(wanted.values())) < len(wanted)  # the rule for equal values
    assert list(got.items()) == list(plain.items())
