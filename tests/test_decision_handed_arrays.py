"""The pass's values handed on in arrays give the very answers of the per-job look-ups.

Why: issue 37 (round 2) cut the decision's last dict look-ups at a site's size (100,000
queued jobs): `tick._order` hands `_site_priorities` the ordered queue's ids, tiers and rated
UBIS priorities (`QueueArrays`) instead of its looking each job up again in the tier and
priority dicts; the pass keeps by id only the running jobs and those it starts (not all
120,000); the victim pool drops a checkpointed member from its ranked lists at once instead
of stepping over it at every later preemption. Here each is held against the former rule:
the whole pass with a site reading on the differential test's random states under the three
tier orders, one run with the arrays and one through the dicts; the view the pass prices
`ubis` victims in against the former dict of every job; the ranked lists against ranking
the members afresh.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from preemption.scheduling import tick
from preemption.scheduling.pass_state import Costs, PassState
from preemption.scheduling.policies import policy_named
from preemption.scheduling.site_order import SiteOrder, band
from preemption.scheduling.victim_pool import VictimPool
from tests.test_decision_differential import State, cluster_view, states
from ubis_priority import job_columns
from vjob.config import Config
from vjob.model import Job, JobState
from vjob.rms import PriorityKnob

KNOB = PriorityKnob(0, 10**9, min_step=1000, share=0.5)
SPAN = 20_000


def _decide(s: State, tier_order: str, own_seed: int) -> tick.Decision:
    view, sleeping = cluster_view(s)
    rnd = random.Random(own_seed)
    own = {j.id: rnd.choice((0, 7, rnd.randrange(0, band(SPAN, KNOB.share)))) for j in view.jobs if rnd.random() < 0.8}
    scheduling = s.scheduling.model_copy(update={"policy": "vjob", "tier_order": tier_order})
    cfg = Config(priority=s.cfg, scheduling=scheduling)
    return tick.decide(
        view, cfg, knob=KNOB, checkpointable=None, sleeping=sleeping, policy="vjob", site=SiteOrder(own, SPAN)
    )


_HANDED = tick._site_priorities


def _by_dicts(*args: object, walk: object = None, pending_ids: object = None) -> object:
    """`_site_priorities` without the arrays `_order` hands it: its dict look-ups (and the
    pending jobs' ids read from the priorities' mapping)."""
    return _HANDED(*args)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(states())
def test_the_site_values_from_the_orders_arrays_are_those_of_the_dicts(s: State) -> None:
    for tier_order in ("ubis", "ubis-interactive", "submit"):
        handed = _decide(s, tier_order, len(s.queue))
        tick._site_priorities = _by_dicts  # type: ignore[assignment]
        try:
            plain = _decide(s, tier_order, len(s.queue))
        finally:
            tick._site_priorities = _HANDED
        assert handed == plain
        assert list(handed.rms_priorities.items()) == list(plain.rms_priorities.items())


@pytest.mark.parametrize("seed", range(40))
def test_the_victim_pools_ranked_lists_are_its_members_sorted_after_removals(seed: int) -> None:
    """The pool's ranked lists drop a checkpointed member at once (VictimPool.remove): they
    stay the members' entries sorted, as ranking them afresh gives."""
    rnd = random.Random(seed)
    names = [f"n{i}" for i in range(16)]
    node_os = {n: rnd.choice(("", "a", "b")) for n in names}
    pool = VictimPool(None, None, {}, node_os)
    free = list(names)
    rnd.shuffle(free)
    for k in range(rnd.randrange(1, 10)):
        mine = tuple(free.pop() for _ in range(min(len(free), rnd.randrange(1, 3))))
        job = Job(id=str(k), user="u", nodes=len(mine) or 1, state=JobState.RUNNING, allocated_nodes=mine)
        pool.add(job, mine)
    for image in ("", "a"):
        pool.cheapest(1, image)
    for job_id in rnd.sample(sorted(pool.members), len(pool.members) // 2):
        pool.remove(job_id)
        for image, ranked in pool._ranked.items():
            assert ranked == pool._rank(image) == sorted(pool._entry(m, image) for m in pool.members.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(states(crowded=True))
def test_the_passs_current_view_is_every_job_as_the_pass_left_it(s: State) -> None:
    """PassState keeps by id only the running jobs and those it starts; the view it prices
    `ubis` victims in (`_current_view`) is still every job of the view, in its order, as the
    pass changed it: what the former dict of every job gave."""
    view, sleeping = cluster_view(s)
    cfg = Config(priority=s.cfg, scheduling=s.scheduling)
    pol = policy_named(s.policy)
    state = PassState(view, cfg, Costs(), None, sleeping, True, pol)
    cols = job_columns.columns(view.jobs)
    rows = tick._queue_rows(cols, sleeping)
    queue = cols.pick(rows)
    rated = tick.compute(view, cfg.priority).values[np.searchsorted(tick._pending_rows(cols), rows)]
    ordered, _, _ = tick._order(pol, queue, rated, state, cols, rows)
    tick._walk(ordered, state, pol, False)
    assert set(state.jobs) <= {j.id for j in view.jobs}
    former = {j.id: j for j in view.jobs}
    former.update(state.jobs)
    busy = state.checkpointing
    expected = tuple(j if j.id not in busy else replace(j, allocated_nodes=busy[j.id]) for j in former.values())
    got = state._current_view().jobs
    assert [id(j) for j in got if j.id not in busy] == [id(j) for j in expected if j.id not in busy]
    assert got == expected
