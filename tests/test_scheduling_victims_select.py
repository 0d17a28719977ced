"""Victim choice on a ClusterView (`select_victims`) and its release step, on hand-worked cases.

Why: mutation testing (devkit/mutation.py, docs/development.md) found `select_victims`'s
filters (who may be a victim at all), its use of free nodes, its cap count and its priority
readers exercised by no test: the pass (`tick.decide`) builds its own candidates, and the
oracle (tests/test_decision_oracle.py) checks the pass. Each case here fails if one of those
rules is turned around.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from preemption.scheduling.victims import Candidate, choose_victims, running_priorities, select_victims
from vjob.config import PriorityConfig
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node

B, INT, BE = JobClass.BATCH, JobClass.INTERACTIVE, JobClass.BESTEFFORT
R = JobState.RUNNING


def test_a_victim_released_raises_what_the_others_must_cover_no_further() -> None:
    """Greedy takes a (2), b (1), c (3): 6 for 4. Releasing, highest priority first: c is
    needed (6 - 3 < 4), b is not (5 left), then a is needed again (5 - 2 < 4)."""
    cands = [Candidate("a", 0.0, 2, 0, 1.0), Candidate("b", 1.0, 1, 0, 1.0), Candidate("c", 2.0, 3, 0, 1.0)]
    assert [v.job_id for v in choose_victims(4, cands) or []] == ["a", "c"]


def _view(*jobs: Job, n: int = 4, os_of: tuple[str, ...] = ()) -> ClusterView:
    images = os_of or ("deb",) * n
    return ClusterView(now=1000.0, nodes=tuple(Node(f"n{i}", 1, 1024, os_image=images[i]) for i in range(n)), jobs=jobs)


def _run(job_id: str, nodes: tuple[int, ...], cls: JobClass = B, **kw: object) -> Job:
    return Job(
        job_id,
        "u",
        job_class=cls,
        state=R,
        nodes=len(nodes),
        allocated_nodes=tuple(f"n{i}" for i in nodes),
        os_image="deb",
        **kw,
    )  # type: ignore[arg-type]


def test_free_nodes_are_used_before_anyone_is_preempted() -> None:
    # n3 is free: a 2-node interactive job needs one victim of one node, not two.
    want = Job("i", "v", job_class=INT, nodes=2, os_image="deb")
    view = _view(_run("a", (0,)), _run("b", (1,)), _run("c", (2,)), want)
    got = select_victims(view, view.job("i"), {"a": 0.1, "b": 0.2, "c": 0.3})
    assert got is not None and got.victims == ("a",) and sorted(got.nodes) == ["n0", "n3"]


def test_only_running_preemptible_jobs_not_excluded_are_victims() -> None:
    """An interactive job, an excluded one and one the view shows on no node are no victims."""
    view = _view(
        _run("inter", (0,), INT),
        _run("excl", (1,)),
        Job("ghost", "u", job_class=B, state=R, nodes=1),  # running, but on no node the view knows
        _run("ok", (2, 3)),
        Job("i", "v", job_class=INT, nodes=2, os_image="deb"),
    )
    prios = {"inter": 0.0, "excl": 0.0, "ghost": 0.0, "ok": 0.9}
    got = select_victims(view, view.job("i"), prios, exclude=("excl",))
    assert got is not None and got.victims == ("ok",)
    assert select_victims(view, view.job("i"), prios, exclude=("excl", "ok")) is None
    assert select_victims(view, view.job("i"), prios, preemptible=(BE,)) is None  # no best-effort job runs


def test_equal_priorities_prefer_the_victim_already_on_the_jobs_image() -> None:
    """n0 runs `rocky`, n1 `deb`: the victim on n0 frees a node the job needs no OS swap on,
    though its checkpoint is larger."""
    view = _view(
        _run("on_rocky", (0,), memory_mb=4096),
        _run("on_deb", (1,), memory_mb=512),
        Job("i", "v", job_class=INT, nodes=1, os_image="rocky"),
        n=2,
        os_of=("rocky", "deb"),
    )
    got = select_victims(view, view.job("i"), {"on_rocky": 0.5, "on_deb": 0.5})
    assert got is not None and got.victims == ("on_rocky",) and got.os_swaps == 0


def test_the_cap_counts_running_interactive_jobs_only() -> None:
    """Cap 50 % of 4 nodes: another user's *pending* 2-node interactive job holds nothing yet."""
    view = _view(
        _run("a", (0, 1)),
        _run("b", (2, 3)),
        Job("other", "w", job_class=INT, nodes=2),
        Job("i", "v", job_class=INT, nodes=2, os_image="deb"),
    )
    got = select_victims(view, view.job("i"), {"a": 0.1, "b": 0.2}, interactive_cap=0.5)
    assert got is not None and got.victims == ("a",)
    held = _view(_run("x", (0, 1), INT), _run("b", (2, 3)), Job("i", "v", job_class=INT, nodes=2, os_image="deb"))
    assert select_victims(held, held.job("i"), {"b": 0.2}, interactive_cap=0.5) is None  # 2 + 2 > 2


def test_priorities_may_come_as_a_result_object() -> None:
    view = _view(_run("a", (0, 1)), _run("b", (2, 3)), Job("i", "v", job_class=INT, nodes=2, os_image="deb"))
    by_dict = SimpleNamespace(as_dict=lambda: {"a": 0.9, "b": 0.1})
    by_columns = SimpleNamespace(job_ids=["a", "b"], values=[0.9, 0.1])
    for prios in (by_dict, by_columns):
        got = select_victims(view, view.job("i"), prios)
        assert got is not None and got.victims == ("b",)


def test_running_priorities_rate_only_the_jobs_asked_for() -> None:
    view = _view(_run("a", (0, 1)), _run("b", (2, 3)), _run("c", (3,), INT), Job("p", "v", nodes=1))
    assert set(running_priorities(view, PriorityConfig())) == {"a", "b"}
    assert set(running_priorities(view, PriorityConfig(), only={"b", "c"})) == {"b"}


def test_a_job_may_ask_for_every_usable_node_but_not_one_more() -> None:
    view = _view(_run("a", (0, 1)), Job("i", "v", job_class=INT, nodes=2, os_image="deb"), n=2)
    got = select_victims(view, view.job("i"), {"a": 0.5})
    assert got is not None and got.victims == ("a",)
    assert dataclasses.is_dataclass(got) and not hasattr(got, "__dict__")  # frozen, slotted
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.victims = ()  # type: ignore[misc]
    big = _view(_run("a", (0, 1)), Job("i", "v", job_class=INT, nodes=3, os_image="deb"), n=2)
    assert select_victims(big, big.job("i"), {"a": 0.5}) is None


def test_priority_readers_name_what_they_cannot_read() -> None:
    view = _view(_run("a", (0, 1)), _run("b", (2, 3)), Job("i", "v", job_class=INT, nodes=2, os_image="deb"))
    got = select_victims(view, view.job("i"), SimpleNamespace(job_ids=["a", "b"], priorities=[0.1, 0.9]))
    assert got is not None and got.victims == ("a",)
    for bad in (SimpleNamespace(), SimpleNamespace(job_ids=["a", "b"]), SimpleNamespace(values=[0.1, 0.9])):
        with pytest.raises(InputError, match="priorities of type SimpleNamespace is not a job-id"):
            select_victims(view, view.job("i"), bad)
    assert running_priorities(_view(Job("p", "v", nodes=1)), PriorityConfig()) == {}


def test_a_running_interactive_job_counts_its_allocated_nodes_else_its_request() -> None:
    """Cap 50 % of 6 nodes = 3. x asked for 3 but the view shows it on 2 nodes: it holds 2, so
    a 1-node job fits (2 + 1 <= 3). y runs on no node the view lists: it counts its request."""
    x = Job("x", "w", job_class=INT, state=R, nodes=3, allocated_nodes=("n0", "n1"), os_image="deb")
    want = Job("i", "v", job_class=INT, nodes=1, os_image="deb")
    view = _view(x, _run("b", (2, 3, 4, 5)), want, n=6)
    got = select_victims(view, want, {"b": 0.1}, interactive_cap=0.5)
    assert got is not None and got.victims == ("b",)
    y = Job("y", "w", job_class=INT, state=R, nodes=3)
    view = _view(y, _run("b", (0, 1, 2, 3, 4, 5)), want, n=6)
    assert select_victims(view, want, {"b": 0.1}, interactive_cap=0.5) is None  # 3 + 1 > 3


def test_priority_columns_of_different_lengths_are_not_read_silently() -> None:
    view = _view(_run("a", (0, 1)), _run("b", (2, 3)), Job("i", "v", job_class=INT, nodes=2, os_image="deb"))
    with pytest.raises(ValueError, match="zip"):
        select_victims(view, view.job("i"), SimpleNamespace(job_ids=["a", "b"], values=[0.1]))
