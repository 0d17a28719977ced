"""The domain model: the vjob life cycle of Entropy §2.2 and the ClusterView contract."""

from __future__ import annotations

import json

import pytest

from vjob.errors import InputError, TransitionError
from vjob.model import (
    TRANSITIONS,
    VM,
    Action,
    ClusterView,
    Job,
    JobClass,
    JobState,
    Node,
    VJobState,
    transition,
)


def test_paper_transitions_are_allowed() -> None:
    assert transition(VJobState.WAITING, Action.RUN) is VJobState.RUNNING
    assert transition(VJobState.RUNNING, Action.SUSPEND) is VJobState.SLEEPING
    assert transition(VJobState.SLEEPING, Action.RESUME) is VJobState.RUNNING
    assert transition(VJobState.RUNNING, Action.STOP) is VJobState.TERMINATED
    assert transition(VJobState.RUNNING, Action.MIGRATE) is VJobState.RUNNING


@pytest.mark.parametrize("state", list(VJobState))
@pytest.mark.parametrize("action", list(Action))
def test_every_other_transition_is_refused(state: VJobState, action: Action) -> None:
    if (state, action) in TRANSITIONS:
        return
    with pytest.raises(TransitionError) as err:
        transition(state, action)
    assert action.value in str(err.value) and state.value in str(err.value)


def test_terminated_is_final() -> None:
    job = Job(id="1", user="u", vjob_state=VJobState.TERMINATED)
    for action in Action:
        with pytest.raises(TransitionError):
            job.apply(action)


def test_job_apply_returns_a_new_job() -> None:
    job = Job(id="1", user="u")
    running = job.apply(Action.RUN)
    assert running.vjob_state is VJobState.RUNNING and job.vjob_state is VJobState.WAITING


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"nodes": 0}, "nodes"), ({"cores": -1}, "cores"), ({"memory_mb": -5}, "memory_mb"), ({"id": ""}, "id")],
)
def test_bad_job_fields_are_named(kwargs: dict, field: str) -> None:
    base = {"id": "7", "user": "u"} | kwargs
    with pytest.raises(InputError, match=field):
        Job(**base)


def _view() -> ClusterView:
    return ClusterView(
        now=1000.0,
        nodes=(Node("n1", cpus=4, memory_mb=8192, os_image="debian"), Node("n2", cpus=4, memory_mb=8192)),
        jobs=(
            Job(id="1", user="alice", job_class=JobClass.INTERACTIVE, submit_time=900.0),
            Job(id="2", user="bob", state=JobState.RUNNING, allocated_nodes=("n1",), start_time=950.0),
        ),
        vms=(VM("vm-2-0", job_id="2", image="debian", node="n1"),),
        images=("debian",),
        usage={"bob": 3600.0},
        targets={"alice": 0.5, "bob": 0.5},
    )


def test_view_queries() -> None:
    view = _view()
    assert [j.id for j in view.pending] == ["1"]
    assert [j.id for j in view.running] == ["2"]
    assert [n.name for n in view.free_nodes()] == ["n2"]
    assert view.job("1").queue_time(view.now) == 100.0
    assert view.job("2").queue_time(view.now) == 0.0


def test_view_json_round_trip() -> None:
    view = _view()
    text = json.dumps(view.to_dict())
    again = ClusterView.from_dict(json.loads(text))
    assert again == view


def test_view_is_immutable() -> None:
    view = _view()
    with pytest.raises(TypeError):
        view.usage["bob"] = 0.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"jobs": [{"id": "1", "user": "u", "job_class": "urgent"}]}, r"jobs\[0\]\.job_class = 'urgent'"),
        ({"nodes": [{"name": "n1", "cpus": 0, "memory_mb": 1}]}, "cpus = 0"),
        ({"nodes": [{"name": "n1", "cpus": 1, "memory_mb": 1, "colour": "red"}]}, "colour"),
        ({"jobs": [{"id": "1", "user": "u"}, {"id": "1", "user": "v"}]}, "duplicate job id '1'"),
        ({"now": "yesterday"}, "now = 'yesterday'"),
        ({"extra": 1}, "unknown top-level"),
    ],
)
def test_bad_view_json_names_the_field(patch: dict, message: str) -> None:
    data = {"now": 0} | patch
    with pytest.raises(InputError, match=message):
        ClusterView.from_dict(data)
