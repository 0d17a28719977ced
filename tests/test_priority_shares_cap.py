"""Shares and the interactive cap on hand-worked numbers (ubis_priority/shares.py, interactive.py).

Why: mutation testing (devkit/mutation.py, docs/development.md) found these rules checked only
through whole priorities, where a share split wrongly, a usage total between 0 and 1 read as
"nobody used anything", or a pending interactive job counted against the cap moved a number
no test looked at.
"""

from __future__ import annotations

import pytest

from ubis_priority import allowed, interactive_allowed, target_shares, usage_shares
from ubis_priority.interactive import held_by_interactive
from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node

INTERACTIVE, BATCH = JobClass.INTERACTIVE, JobClass.BATCH


def test_usage_shares_are_parts_of_the_total_even_when_it_is_below_one() -> None:
    assert usage_shares({"a": 0.25, "b": 0.75}) == {"a": 0.25, "b": 0.75}
    assert usage_shares({"a": 3.0, "b": 1.0}) == {"a": 0.75, "b": 0.25}
    assert usage_shares({"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}  # nobody used anything


def test_what_explicit_targets_leave_is_split_equally_among_the_others() -> None:
    cfg = PriorityConfig(targets={"a": 0.5})
    got = target_shares([("a", ""), ("b", ""), ("c", "")], {}, cfg)
    assert got == {("a", ""): 0.5, ("b", ""): 0.25, ("c", ""): 0.25}
    over = target_shares([("a", ""), ("b", "")], {}, PriorityConfig(targets={"a": 1.0}))
    assert over == {("a", ""): 1.0, ("b", ""): 0.0}  # nothing left, not a negative share


def test_a_target_of_exactly_one_is_accepted_and_above_is_refused() -> None:
    assert target_shares([("a", "")], {"a": 1.0}, PriorityConfig()) == {("a", ""): 1.0}
    with pytest.raises(InputError, match=r"targets\.a = 1\.01: must be a finite number in 0\.\.1"):
        target_shares([("a", "")], {"a": 1.01}, PriorityConfig())


def _job(job_id: str, job_class: JobClass, state: JobState, user: str = "u", **kw: object) -> Job:
    return Job(job_id, user, job_class=job_class, state=state, **kw)  # type: ignore[arg-type]


def test_only_running_interactive_jobs_count_against_the_cap_by_their_allocated_nodes() -> None:
    jobs = [
        _job("1", INTERACTIVE, JobState.RUNNING, "ann", nodes=3, allocated_nodes=("n0", "n1")),  # 2 usable
        _job("2", INTERACTIVE, JobState.RUNNING, "bob", nodes=2),  # no allocation known: its request
        _job("3", BATCH, JobState.RUNNING, "ann", nodes=4, allocated_nodes=("n2", "n3", "n4", "n5")),
        _job("4", INTERACTIVE, JobState.PENDING, "cid", nodes=5),
    ]
    assert held_by_interactive(jobs) == (4, {"ann": 2, "bob": 2})


def test_allowed_is_a_strict_boolean_at_the_cap() -> None:
    cfg = PriorityConfig(interactive_cap=0.5, interactive_user_cap=0.25)
    assert allowed(cfg, 8, 0, 0, 2) is True  # 2 <= 4 and 2 <= 2
    assert allowed(cfg, 8, 3, 0, 2) is False  # 5 > 4
    assert allowed(cfg, 8, 0, 1, 2) is False  # the user's 3 > 2


def test_a_user_holding_nothing_may_take_exactly_the_user_cap() -> None:
    """interactive_allowed reads the user's own hold: 0 here, so 2 of 8 nodes fit a 25 % cap."""
    nodes = tuple(Node(f"n{i}", 1, 1024) for i in range(8))
    other = _job("1", INTERACTIVE, JobState.RUNNING, "bob", nodes=1, allocated_nodes=("n0",))
    mine = _job("2", INTERACTIVE, JobState.PENDING, "ann", nodes=2)
    cfg = PriorityConfig(interactive_cap=1.0, interactive_user_cap=0.25)
    assert interactive_allowed(ClusterView(now=0.0, nodes=nodes, jobs=(other, mine)), mine, cfg) is True
    bigger = _job("3", INTERACTIVE, JobState.PENDING, "ann", nodes=3)
    assert interactive_allowed(ClusterView(now=0.0, nodes=nodes, jobs=(other, bigger)), bigger, cfg) is False
