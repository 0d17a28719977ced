"""Edge cases of the UBIS priority, the integer mappings, shares, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from ubis_priority import (
    ClusterArrays,
    JobArrays,
    arrays_from_view,
    compute,
    compute_arrays,
    interactive_allowed,
    pbs_priority,
    reference,
    slurm_site_factor,
    target_shares,
    usage_shares,
)
from vjob import config as vconfig
from vjob.config import PriorityConfig
from vjob.errors import ConfigError, InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node, NodeState

CFG = PriorityConfig()
NOW = 1_000_000.0


def _nodes(n: int, image: str = "debian", state: NodeState = NodeState.IDLE) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", 8, 16384, os_image=image, state=state) for i in range(n))


def _job(job_id: str, **kw: object) -> Job:
    kw.setdefault("user", "alice")
    kw.setdefault("submit_time", NOW - 3600)
    return Job(job_id, **kw)  # type: ignore[arg-type]


def _terms(view: ClusterView, job_id: str, cfg: PriorityConfig = CFG) -> dict[str, tuple[float, float]]:
    e = compute(view, cfg).explain(job_id)
    return {t.term: (t.raw, t.normalised) for t in e.terms}


def test_empty_queue_gives_no_priorities():
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=(_job("r", state=JobState.RUNNING, allocated_nodes=("n0",)),))
    prios = compute(view, CFG)
    assert len(prios) == 0
    assert prios.values.shape == (0,)
    assert prios.terms.raw.shape == (7, 0)
    assert prios.ranked() == []


def test_no_free_node_puts_the_node_terms_below_the_middle():
    nodes = _nodes(4)
    running = _job("r", state=JobState.RUNNING, nodes=4, allocated_nodes=tuple(n.name for n in nodes))
    view = ClusterView(now=NOW, nodes=nodes, jobs=(running, _job("p", nodes=2, os_image="debian")))
    terms = _terms(view, "p")
    assert terms["os_available"] == (-2.0, pytest.approx(0.25))  # 0 free debian nodes - 2 asked, of 4
    assert terms["free_nodes"] == (-2.0, pytest.approx(0.25))  # 0 free - 2 swaps


def test_a_job_asking_for_more_nodes_than_exist_bottoms_out_at_zero():
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=(_job("big", nodes=100, os_image="debian"),))
    terms = _terms(view, "big")
    assert terms["os_available"] == (4.0 - 100.0, 0.0)
    assert terms["free_nodes"] == (4.0 - 96.0, 0.0)
    assert compute(view, CFG).values[0] >= 0


def test_an_os_image_no_node_runs_counts_every_node_as_a_swap():
    view = ClusterView(now=NOW, nodes=_nodes(10), jobs=(_job("p", nodes=2, os_image="plan9"),))
    terms = _terms(view, "p")
    assert terms["os_available"] == (-2.0, pytest.approx(0.4))
    assert terms["free_nodes"] == (8.0, pytest.approx(0.9))
    same = ClusterView(now=NOW, nodes=_nodes(10), jobs=(_job("p", nodes=2, os_image="debian"),))
    assert compute(same, CFG).values[0] > compute(view, CFG).values[0]


def test_a_job_without_an_image_sees_every_free_node_as_its_own():
    view = ClusterView(now=NOW, nodes=_nodes(10, image="centos"), jobs=(_job("p", nodes=2),))
    terms = _terms(view, "p")
    assert terms["os_available"][0] == 8.0
    assert terms["free_nodes"][0] == 10.0
    assert "every free node" in compute(view, CFG).explain("p").terms[2].note


def test_a_cluster_with_no_usable_node_still_gives_bounded_priorities():
    view = ClusterView(
        now=NOW, nodes=_nodes(3, state=NodeState.DOWN), jobs=(_job("p", job_class=JobClass.INTERACTIVE),)
    )
    prios = compute(view, CFG)
    assert 0 <= prios.values[0] <= prios.terms.max_priority
    assert prios.terms.capped[0]  # 15 % of no node is no node


def test_a_user_without_a_target_shares_what_the_targets_leave():
    cfg = PriorityConfig(targets={"alice": 0.6})
    jobs = (_job("a", user="alice"), _job("b", user="bob"), _job("c", user="carol"))
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=jobs)
    targets = {e.job_id: e.terms[0].raw for e in (compute(view, cfg).explain(j.id) for j in jobs)}
    assert targets == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})


def test_when_targets_take_everything_a_user_without_one_gets_zero():
    cfg = PriorityConfig(targets={"alice": 1.0})
    view = ClusterView(now=NOW, nodes=_nodes(4), jobs=(_job("b", user="bob"),), usage={"bob": 50.0})
    assert _terms(view, "b", cfg)["usage"] == (-1.0, 0.0)  # target 0, all the usage


def test_account_targets_are_split_between_the_account_users():
    cfg = PriorityConfig(account_targets={"phys": 0.5})
    jobs = (
        _job("a", user="alice", account="phys"),
        _job("b", user="bob", account="phys"),
        _job("c", user="carol", account="chem"),
    )
    shares = target_shares({(j.user, j.account) for j in jobs}, {}, cfg)
    assert shares == {("alice", "phys"): 0.25, ("bob", "phys"): 0.25, ("carol", "chem"): 0.5}


def test_configured_targets_override_the_store_copy():
    shares = target_shares({("alice", "")}, {"alice": 0.1}, PriorityConfig(targets={"alice": 0.3}))
    assert shares == {("alice", ""): 0.3}


def test_usage_shares_add_up_to_one_or_are_all_zero():
    assert usage_shares({"a": 30.0, "b": 10.0}) == {"a": 0.75, "b": 0.25}
    assert usage_shares({"a": 0.0}) == {"a": 0.0}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_usage_is_refused_naming_the_user(bad):
    with pytest.raises(InputError, match=r"usage\.mallory"):
        usage_shares({"mallory": bad})


def test_a_target_above_one_in_the_view_is_refused():
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=(_job("p"),), targets={"alice": 3.0})
    with pytest.raises(InputError, match=r"targets\.alice = 3\.0"):
        compute(view, CFG)


def test_the_interactive_cap_counts_running_interactive_jobs_and_the_job_itself():
    nodes = _nodes(20)  # cap 15 % = 3 nodes
    running = _job("r", job_class=JobClass.INTERACTIVE, state=JobState.RUNNING, nodes=2, allocated_nodes=("n0", "n1"))
    small = _job("s", job_class=JobClass.INTERACTIVE, nodes=1)
    large = _job("l", job_class=JobClass.INTERACTIVE, nodes=2)
    view = ClusterView(now=NOW, nodes=nodes, jobs=(running, small, large))
    assert interactive_allowed(view, small, CFG)
    assert not interactive_allowed(view, large, CFG)
    prios = compute(view, CFG)
    assert prios.explain("s").terms[6].normalised == 1.0
    capped = prios.explain("l").terms[6]
    assert (capped.raw, capped.normalised) == (1.0, 0.0)
    assert "cap" in capped.note


def test_the_per_user_cap_stops_one_user_before_the_global_cap():
    cfg = PriorityConfig(interactive_cap=0.5, interactive_user_cap=0.1)  # of 20 nodes: 10 and 2
    running = _job("r", job_class=JobClass.INTERACTIVE, state=JobState.RUNNING, nodes=2, allocated_nodes=("n0", "n1"))
    mine = _job("m", job_class=JobClass.INTERACTIVE)
    theirs = _job("t", user="bob", job_class=JobClass.INTERACTIVE)
    view = ClusterView(now=NOW, nodes=_nodes(20), jobs=(running, mine, theirs))
    assert not interactive_allowed(view, mine, cfg)
    assert interactive_allowed(view, theirs, cfg)
    assert compute(view, cfg).as_dict() == reference.priorities(view, cfg)


def test_an_open_preemption_counts_in_the_preempted_time():
    job = _job("p", preempt_count=1, preempted_seconds=100.0, preempted_since=NOW - 50)
    view = ClusterView(now=NOW, nodes=_nodes(2), jobs=(job,))
    assert _terms(view, "p")["preempt_time"][0] == 150.0


def test_terms_saturate_at_their_configured_maxima():
    job = _job("p", submit_time=NOW - 10 * 86400, preempt_count=50, preempted_seconds=1e9)
    terms = _terms(ClusterView(now=NOW, nodes=_nodes(2), jobs=(job,)), "p")
    assert terms["queue_time"][1] == terms["preempt_count"][1] == terms["preempt_time"][1] == 1.0


def test_integer_mappings_span_the_rms_ranges_and_keep_the_order():
    prio = np.array([0.0, 0.25, 0.5, 1.0])
    assert slurm_site_factor(prio, 1.0, 1_000_000).tolist() == [0, 250_000, 500_000, 1_000_000]
    assert pbs_priority(prio, 1.0).tolist() == [-1024, -512, 0, 1023]
    assert pbs_priority(np.array([0.3]), 0.0).tolist() == [-1024]  # every weight off


def test_integer_mappings_of_a_real_view_are_in_range_and_monotone():
    jobs = tuple(_job(f"p{i}", nodes=1 + i, submit_time=NOW - 600 * i) for i in range(8))
    prios = compute(ClusterView(now=NOW, nodes=_nodes(6), jobs=jobs), CFG)
    order = np.argsort(prios.values, kind="stable")
    site = slurm_site_factor(prios.values, prios.terms.max_priority, 1000)
    pbs = pbs_priority(prios.values, prios.terms.max_priority)
    assert ((site >= 0) & (site <= 1000)).all() and ((pbs >= -1024) & (pbs <= 1023)).all()
    assert (np.diff(site[order]) >= 0).all() and (np.diff(pbs[order]) >= 0).all()


def _arrays(n: int) -> tuple[JobArrays, ClusterArrays]:
    jobs = JobArrays(
        submit_time=np.zeros(n),
        nodes=np.ones(n, dtype=np.int64),
        os_index=np.zeros(n, dtype=np.int64),
        preempt_count=np.zeros(n, dtype=np.int64),
        preempted_s=np.zeros(n),
        interactive=np.zeros(n, dtype=np.bool_),
        share_index=np.zeros(n, dtype=np.int64),
        user_index=np.zeros(n, dtype=np.int64),
    )
    cluster = ClusterArrays(
        now=100.0,
        total_nodes=4,
        free_nodes=4,
        free_by_os=np.array([4], dtype=np.int64),
        target=np.array([1.0]),
        usage=np.array([0.0]),
        interactive_held=0,
        user_interactive_held=np.zeros(1, dtype=np.int64),
    )
    return jobs, cluster


def test_the_kernel_refuses_columns_of_different_lengths():
    jobs, cluster = _arrays(3)
    bad = JobArrays(**{**jobs.__dict__, "submit_time": np.zeros(2)})
    with pytest.raises(InputError, match=r"jobs\.submit_time has 2 entries, jobs\.nodes has 3"):
        compute_arrays(bad, cluster, CFG)


def test_the_kernel_refuses_an_index_out_of_range():
    jobs, cluster = _arrays(3)
    bad = JobArrays(**{**jobs.__dict__, "os_index": np.array([0, 5, 0], dtype=np.int64)})
    with pytest.raises(InputError, match=r"jobs\.os_index\[1\] = 5: must be in -1\.\.0"):
        compute_arrays(bad, cluster, CFG)


def test_the_kernel_refuses_more_free_nodes_than_nodes():
    jobs, cluster = _arrays(1)
    bad = ClusterArrays(**{**cluster.__dict__, "free_nodes": 9})
    with pytest.raises(InputError, match="free_nodes = 9"):
        compute_arrays(jobs, bad, CFG)


def test_negative_weight_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"priority\.weights\.interactive = -1"):
        vconfig.parse({"priority": {"weights": {"interactive": -1}}})


def test_misspelt_weight_is_a_config_error():
    with pytest.raises(ConfigError, match=r"unknown key 'priority\.weights\.queue'"):
        vconfig.parse({"priority": {"weights": {"queue": 0.5}}})


def test_the_kernel_refuses_a_nan_submit_time_and_a_share_above_one():
    jobs, cluster = _arrays(2)
    bad = JobArrays(**{**jobs.__dict__, "submit_time": np.array([0.0, np.nan])})
    with pytest.raises(InputError, match=r"jobs\.submit_time\[1\] = nan"):
        compute_arrays(bad, cluster, CFG)
    over = ClusterArrays(**{**cluster.__dict__, "usage": np.array([1.5])})
    with pytest.raises(InputError, match=r"cluster\.usage\[0\] = 1\.5: must be a share in 0\.\.1"):
        compute_arrays(jobs, over, CFG)


def test_a_user_with_usage_under_a_targeted_account_does_not_also_take_a_leftover_part():
    """alice's jobs run under `physics` (target 0.5) and she has recorded usage; bob has no
    target. bob gets all that is left (0.5): alice is not also counted among the users who
    split the rest (the ("alice", "") entity her usage record used to add took half of it)."""
    view = ClusterView(
        now=1000.0,
        nodes=(Node("n1", cpus=1, memory_mb=1024),),
        jobs=(
            Job("1", "alice", account="physics", submit_time=0.0),
            Job("2", "bob", submit_time=0.0),
        ),
        usage={"alice": 10.0, "bob": 10.0},
    )
    _, jobs, cluster = arrays_from_view(view, PriorityConfig(account_targets={"physics": 0.5}))
    assert cluster.target[jobs.share_index].tolist() == [0.5, 0.5]
    ref = reference.priorities(view, PriorityConfig(account_targets={"physics": 0.5}))
    assert ref == compute(view, PriorityConfig(account_targets={"physics": 0.5})).as_dict()
