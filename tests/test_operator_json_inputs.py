"""JSON inputs through pydantic (issue 22, item 9): typed errors with the field path, bounds
against hostile files, `vjob schema`, and nothing but InputError on random JSON."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemption.planner import Instance
from preemption.planner.plan_schema import PlanInput
from vjob.cli import main
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobClass, Node


def test_a_view_round_trips_through_its_json() -> None:
    job = Job("1", "u", JobClass.INTERACTIVE, allocated_nodes=("n1",))
    view = ClusterView(now=5.0, nodes=(Node("n1", 4, 1024),), jobs=(job,), usage={"u": 3.0})
    again = ClusterView.from_dict(json.loads(json.dumps(view.to_dict())))
    assert again == view


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"now": 1, "jobs": [{"id": "j", "user": "u", "nodes": "3"}]},
            "v.jobs[0].nodes = '3': must be an integer >= 1",
        ),
        ({"now": 1, "jobs": [{"id": "j" * 300, "user": "u"}]}, "v.jobs[0].id = 'jjj"),
        ({"now": 1, "nodes": [{"name": "n", "cpus": 1, "memory_mb": 1, "features": "gpu"}]}, "v.nodes[0].features"),
        ({"now": math.nan}, "v.now = nan: must be a finite number"),
        ({"now": 1, "targets": {"u": 2}}, "v.targets.u = 2: must be <= 1"),
        ({"now": 1, "jobs": [{"id": "j"}]}, "v.jobs[0]: missing key 'user'"),
        ({"now": True}, "v.now = True"),
        ([], "v = []"),
    ],
)
def test_a_bad_view_names_the_field_path(data: object, message: str) -> None:
    with pytest.raises(InputError) as err:
        ClusterView.from_dict(data, source="v")
    assert message in str(err.value)
    assert len(str(err.value)) < 600, "long values are shortened"


def test_a_bad_instance_names_the_field_path() -> None:
    with pytest.raises(InputError, match=r"i\.vms\[0\]\.state = 'paused': must be one of waiting, running, sleeping"):
        Instance.from_dict(
            {"nodes": [], "vms": [{"id": "v", "vjob": "j", "cpu": 1, "mem": 1, "state": "paused"}]}, source="i"
        )
    with pytest.raises(InputError, match=r"i\.target\.j = 'gone'"):
        Instance.from_dict({"nodes": [], "vms": [], "target": {"j": "gone"}}, source="i")


def test_a_bad_plan_names_the_field_path() -> None:
    with pytest.raises(InputError, match=r"p\.pools\[0\]\[1\]: missing key 'vm'"):
        PlanInput.parse({"pools": [[{"action": "run", "vm": "a", "on": "n"}, {"action": "run"}]]}, "p")


@pytest.mark.parametrize("name", ["clusterview", "instance", "plan"])
def test_vjob_schema_prints_a_json_schema(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", name]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["$schema"].endswith("2020-12/schema") and doc["type"] == "object"
    assert doc["additionalProperties"] is False


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "now",
                    "jobs",
                    "nodes",
                    "vms",
                    "id",
                    "user",
                    "name",
                    "cpus",
                    "memory_mb",
                    "state",
                    "targets",
                    "usage",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=1500, deadline=None)
@given(_json)
def test_random_json_is_a_view_or_an_input_error(data: object) -> None:
    try:
        ClusterView.from_dict(data)
    except InputError:
        pass


@settings(max_examples=1000, deadline=None)
@given(_json)
def test_random_json_is_an_instance_or_an_input_error(data: object) -> None:
    try:
        Instance.from_dict(data)
    except InputError:
        pass
