"""The site order in arrays (tick._site_priorities over site_order's array helpers) gives the
very answers of the per-job rule it replaced.

Why: issue 37 moved the pass's site values and walk from per-job dicts and sums to arrays
gathered once over the queue (a third of a second a tick at 100,000 queued jobs). The former
`_site_priorities` is kept here as the plain rule (UBIS fractions in a dict, `site_values`,
`walk_order`), and both run on seeded random queues with many ties (few tiers, few priority
values, equal own priorities), under the three ways vjob rates tiers ("all", interactive only,
none), with max_priority 0, with jobs the site has no own priority for, and with own
priorities beyond 2**52 (there the exact Python sums are used). Compared: the walk (the same
Job objects in the same order), the values sent (and their keys' order), the guard.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from preemption.scheduling.site_order import (
    SiteOrder,
    band,
    site_values,
    ubis_fractions,
    walk_order,
    walk_positions,
)
from preemption.scheduling.tick import _site_priorities
from vjob.model import Job, JobClass
from vjob.rms import PriorityKnob

SEEDS = range(60)


def _former(
    ordered: list[Job],
    tiers: dict[str, int],
    pending: dict[str, float],
    max_priority: float,
    knob: PriorityKnob,
    site: SiteOrder,
    state: Any,
) -> tuple[list[Job], dict[str, int]]:
    """tick._site_priorities before the arrays (the plain rule)."""
    if state.ubis_tiers or state.ubis_interactive:
        rated = [j for j in ordered if state.ubis_tiers or tiers[j.id] == 0]
    else:
        rated = []
    fractions = {j.id: pending[j.id] / max_priority for j in rated} if max_priority > 0 else {}
    sent = site_values(ordered, tiers, fractions, knob, site.span)
    walked = walk_order(ordered, sent, site.own)
    state.guard = next((j for j in walked if not j.interactive), None)
    out = dict.fromkeys(pending, knob.low)
    out.update(sent)
    return walked, out


def _case(seed: int) -> tuple[list[Job], dict[str, int], dict[str, float], float, PriorityKnob, SiteOrder, str]:
    rnd = random.Random(seed)
    count = rnd.randrange(0, 80)
    jobs = [
        Job(id=str(100 + k), user=f"u{k % 3}", job_class=JobClass.INTERACTIVE if rnd.random() < 0.3 else JobClass.BATCH)
        for k in range(count)
    ]
    ordered = rnd.sample(jobs, count)
    tiers = {j.id: rnd.randrange(4) for j in jobs}
    pending = {j.id: rnd.choice((0.0, 0.5, 1.0, rnd.random(), rnd.random() * 3)) for j in jobs}
    pending.update({f"held{k}": 0.2 for k in range(rnd.randrange(0, 3))})  # pending, outside the queue
    span, share = rnd.choice((12_000, 10, 1_000)), rnd.random() * 0.95
    knob = PriorityKnob(0, 10**9, min_step=rnd.choice((1, 7, 1000)), share=share)
    big = rnd.random() < 0.15
    own = {
        j.id: rnd.choice((0, 5, rnd.randrange(0, band(span, share)), 2**60 if big else 7))
        for j in jobs
        if rnd.random() < 0.85
    }
    max_priority = rnd.choice((0.0, 1.0, 2.5))
    return (
        ordered,
        tiers,
        pending,
        max_priority,
        knob,
        SiteOrder(own=own, span=span),
        rnd.choice(("all", "interactive", "none")),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_site_priorities_in_arrays_are_the_former_per_job_rule(seed: int) -> None:
    ordered, tiers, pending, max_priority, knob, site, rated = _case(seed)
    states = [
        SimpleNamespace(ubis_tiers=rated == "all", ubis_interactive=rated == "interactive", guard=None)
        for _ in range(2)
    ]
    walked, out = _site_priorities(ordered, tiers, pending, max_priority, knob, site, states[0])  # type: ignore[arg-type]
    plain_walked, plain_out = _former(ordered, tiers, pending, max_priority, knob, site, states[1])
    assert [id(j) for j in walked] == [id(j) for j in plain_walked]
    assert list(out.items()) == list(plain_out.items())
    assert states[0].guard is states[1].guard


@pytest.mark.parametrize("seed", SEEDS)
def test_the_array_helpers_are_their_per_job_rules(seed: int) -> None:
    ordered, tiers, pending, max_priority, knob, site, rated = _case(seed)
    ids = [j.id for j in ordered]
    tier = np.array([tiers[i] for i in ids], dtype=np.int64)
    frac = ubis_fractions(ids, tier, pending, max_priority, rated)
    expected = [
        pending[i] / max_priority
        if max_priority > 0 and (rated == "all" or (rated == "interactive" and tiers[i] == 0))
        else 0.0
        for i in ids
    ]
    assert frac.tolist() == expected
    sent = site_values(ordered, tiers, dict(zip(ids, expected, strict=True)), knob, site.span)
    values = np.array([sent[i] for i in ids], dtype=np.int64)
    positions = walk_positions(values, ids, site.own)
    if any(abs(site.own.get(i, 0)) >= 2**52 for i in ids):
        assert positions is None
        return
    assert positions is not None
    assert [ordered[k] for k in positions.tolist()] == walk_order(ordered, sent, site.own)


def test_beyond_2_to_the_52_the_walk_is_left_to_the_exact_python_sums() -> None:
    ids = ["1", "2"]
    assert walk_positions(np.array([2**52, 0], dtype=np.int64), ids, {}) is None
    assert walk_positions(np.array([0, 0], dtype=np.int64), ids, {"2": -(2**52)}) is None
    assert walk_positions(np.array([0, 0], dtype=np.int64), ids, {"2": 2**70}) is None  # not even int64
    assert walk_positions(np.array([5, 0], dtype=np.int64), ids, {"2": 2**52 - 1}).tolist() == [1, 0]
