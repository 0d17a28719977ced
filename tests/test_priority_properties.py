"""Properties of the UBIS priority that must hold for any cluster and any weights."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.priority_views import configs, views, with_job
from ubis_priority import TERMS, compute, interactive_allowed, reference
from vjob.model import ClusterView, Job, JobClass, JobState

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _pick(view: ClusterView, data: st.DataObject) -> Job:
    return data.draw(st.sampled_from(view.pending))


@SETTINGS
@given(views(), configs)
def test_kernel_agrees_with_the_per_job_loop_to_the_last_bit(view, cfg):
    assert compute(view, cfg).as_dict() == reference.priorities(view, cfg)


@SETTINGS
@given(views(), configs)
def test_priorities_lie_between_zero_and_the_sum_of_weights(view, cfg):
    terms = compute(view, cfg).terms
    assert ((terms.normalised >= 0) & (terms.normalised <= 1)).all()
    assert (terms.priority >= 0).all()
    assert (terms.priority <= terms.max_priority * (1 + 1e-12)).all()


@SETTINGS
@given(views(min_pending=1), configs, st.floats(1, 30 * 86400), st.data())
def test_more_queue_time_never_lowers_a_priority(view, cfg, extra, data):
    job = _pick(view, data)
    older = with_job(view, replace(job, submit_time=job.submit_time - extra))
    before, after = compute(view, cfg), compute(older, cfg)
    i = before.index(job.id)
    assert after.values[i] >= before.values[i]
    if view.now - job.submit_time + extra <= cfg.max_queue_time_s * 0.99:
        assert after.terms.normalised[1, i] > before.terms.normalised[1, i]


@SETTINGS
@given(views(min_pending=1), configs, st.integers(1, 5), st.floats(0, 86400), st.data())
def test_more_preemptions_or_preempted_time_never_lower_a_priority(view, cfg, more, seconds, data):
    job = _pick(view, data)
    preempted = with_job(
        view, replace(job, preempt_count=job.preempt_count + more, preempted_seconds=job.preempted_seconds + seconds)
    )
    assert compute(preempted, cfg).as_dict()[job.id] >= compute(view, cfg).as_dict()[job.id]


@SETTINGS
@given(views(min_pending=1), configs, st.data())
def test_an_interactive_job_under_the_cap_outranks_its_batch_twin(view, cfg, data):
    job = _pick(view, data)
    batch = replace(job, id="twin-batch", job_class=JobClass.BATCH)
    inter = replace(job, id="twin-inter", job_class=JobClass.INTERACTIVE)
    twins = replace(view, jobs=(*view.jobs, batch, inter))
    prio = compute(twins, cfg).as_dict()
    if interactive_allowed(twins, inter, cfg) and cfg.weights.interactive > 0:
        assert prio["twin-inter"] > prio["twin-batch"]
    else:
        assert prio["twin-inter"] == prio["twin-batch"]


@SETTINGS
@given(views(min_pending=1), configs, st.sampled_from(range(len(TERMS))))
def test_a_zero_weight_removes_its_term_exactly(view, cfg, k):
    cfg = cfg.model_copy(update={"weights": cfg.weights.model_copy(update={TERMS[k]: 0.0})})
    terms = compute(view, cfg).terms
    assert (terms.weighted[k] == 0).all()
    rest = [j for j in range(len(TERMS)) if j != k]
    expected = terms.weighted[rest[0]].copy()
    for j in rest[1:]:
        expected += terms.weighted[j]
    assert np.array_equal(terms.priority, expected)


@SETTINGS
@given(views(min_pending=1), configs, st.floats(1, 1e7), st.data())
def test_a_zero_queue_time_weight_makes_waiting_irrelevant(view, cfg, extra, data):
    cfg = cfg.model_copy(update={"weights": cfg.weights.model_copy(update={"queue_time": 0.0})})
    job = _pick(view, data)
    older = with_job(view, replace(job, submit_time=job.submit_time - extra))
    assert compute(older, cfg).as_dict()[job.id] == compute(view, cfg).as_dict()[job.id]


@SETTINGS
@given(views(), configs, st.randoms(use_true_random=False))
def test_results_are_deterministic_and_independent_of_job_order(view, cfg, rnd: random.Random):
    first = compute(view, cfg)
    shuffled = list(view.jobs)
    rnd.shuffle(shuffled)
    again = compute(replace(view, jobs=tuple(shuffled)), cfg)
    assert first.as_dict() == compute(view, cfg).as_dict() == again.as_dict()
    assert [first.jobs[i].id for i in first.ranked()] == [again.jobs[i].id for i in again.ranked()]


@SETTINGS
@given(views(min_pending=1), configs)
def test_the_cap_reached_takes_the_interactive_term_away(view, cfg):
    """A running interactive job holds more than the cap: no pending interactive job keeps I."""
    free = [n.name for n in view.free_nodes()]
    assume(free)
    total = sum(1 for n in view.nodes if n.state.usable)
    cfg = cfg.model_copy(update={"interactive_cap": (len(free) - 0.5) / total})
    hog = Job(
        "hog",
        "mallory",
        job_class=JobClass.INTERACTIVE,
        nodes=len(free),
        state=JobState.RUNNING,
        allocated_nodes=tuple(free),
        start_time=view.now,
    )
    everyone_interactive = tuple(
        replace(j, job_class=JobClass.INTERACTIVE) if j in view.pending else j for j in view.jobs
    )
    full = replace(view, jobs=(*everyone_interactive, hog))
    terms = compute(full, cfg).terms
    assert terms.capped.all()
    assert (terms.raw[6] == 1).all()
    assert (terms.normalised[6] == 0).all()
