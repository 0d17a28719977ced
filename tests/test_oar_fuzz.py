"""OAR parsers under hostile input (issue 23 item 13 and Low): a result or an InputError,
never another exception; words handed to OAR are checked with re.fullmatch; credentials in
an OAR API URL never reach an error message.

Hypothesis runs a fixed, derandomized set of cases (the "ci" profile of tests/conftest.py), a
few hundred per test, about a second.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plugins.oar as oar
from plugins.oar.client import OarRest, SubmitRequest, check_job_id, check_user, mask_url
from plugins.oar.parse import job_deadline, job_from_dict, parse_jobs, parse_resources
from tests.services import free_port
from vjob.errors import CommandError, InputError

FIXTURE = Path(__file__).resolve().parent / "data" / "fixtures" / "oar" / "oartui_oarstat_array_u_J_f.json"
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ODD: list[Any] = [
    None,
    "",
    "x\nrm -rf /",
    [],
    {},
    [1, "a"],
    {"a": {"b": []}},
    1e308,
    -1,
    True,
    "9" * 5000,
    "NaN",
    2**70,
    [[[[]]]],
    "a" * 10000,
]


def _fixture() -> str:
    return FIXTURE.read_text()


def _parse_either(text: str) -> None:
    for kind in ("jobs", "nodes"):
        try:
            oar.parse_output(kind, text, source="fuzz")
        except InputError:
            pass


@FUZZ
@given(st.data())
def test_mutated_oarstat_output_is_parsed_or_refused(data: st.DataObject) -> None:
    text = _fixture()
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, min(len(text), start + 200)))
    insert = data.draw(st.text(alphabet='{}[]",:0123456789.e-\\n tx\\u00e9', max_size=30))
    _parse_either(text[:start] + insert + text[end:])


@pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
def test_every_job_field_swept_with_odd_values(value: Any) -> None:
    jobs = json.loads(_fixture().replace('\\\\"', '\\"'))
    first = next(iter(jobs.values()))
    for field in [*first, "events", "assigned_resources", "nodes", "resources", "owner"]:
        job = {**first, field: value}
        try:
            parse_jobs(json.dumps({"1": job}), source="sweep")
            job_from_dict("1", job, source="sweep")
        except InputError:
            pass
        job = {**first, "events": [{"type": "X", field: value}, value]}
        try:
            job_from_dict("1", job, source="sweep")
        except InputError:
            pass


@pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
def test_every_resource_field_swept_with_odd_values(value: Any) -> None:
    base = {"state": "Alive", "network_address": "n1", "resource_id": 1, "site": "a", "memnode": 1024}
    for field in [*base, "id", "cluster"]:
        for shape in ({"1": {**base, field: value}}, {"items": [{**base, field: value}]}, [value], value):
            try:
                oar.parse_output("nodes", json.dumps(shape), source="sweep")
            except InputError:
                pass


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_value_is_a_result_or_an_input_error(value: Any) -> None:
    text = json.dumps(value)
    _parse_either(text)
    try:
        job_from_dict("1", value, source="any")
    except InputError:
        pass
    try:
        parse_resources(text, source="any")
    except InputError:
        pass


def test_deep_nesting_and_huge_input_are_input_errors() -> None:
    with pytest.raises(InputError, match="nested too deeply"):
        parse_jobs("[" * 100000 + "]" * 100000, source="deep")


@pytest.mark.parametrize(
    "bad",
    ["true\nrm -rf ~", "true\n", "a b", "x;y", "$(id)", "a\x00b", ""],
)
def test_command_words_are_fullmatched(bad: str) -> None:
    with pytest.raises(InputError, match=r"command\[1\]"):
        SubmitRequest(command=["/bin/sh", bad])


def test_users_job_ids_and_names_are_fullmatched() -> None:
    for bad_user in ("alice\n", "alice\nroot", "Alice", "a" * 40):
        with pytest.raises(InputError, match="user"):
            check_user(bad_user)
    for bad_id in ("12\n", "12 13", "-1", ""):
        with pytest.raises(InputError, match="OAR job id"):
            check_job_id(bad_id)
    with pytest.raises(InputError, match="name"):
        SubmitRequest(command=["true"], name="be01\n")
    with pytest.raises(InputError, match="walltime"):
        SubmitRequest(command=["true"], walltime="1:00:00\n")
    with pytest.raises(InputError, match="job id"):
        parse_jobs('{"1": {"state": "Running", "job_user": "u", "Job_Id": "1\\nrm"}}', source="x")
    with pytest.raises(InputError, match="user"):
        parse_jobs('{"1": {"state": "Running", "job_user": "u\\n"}}', source="x")
    with pytest.raises(InputError, match="host"):
        parse_jobs('{"1": {"state": "Running", "job_user": "u", "assigned_network_address": ["../x"]}}', source="x")


def test_credentials_in_the_api_url_are_masked() -> None:
    assert mask_url("http://oar:s3cr@t@host:8080/oarapi") == "http://oar:***@host:8080/oarapi"
    assert mask_url("https://host/oarapi") == "https://host/oarapi"
    url = f"http://vjob:hunter2@127.0.0.1:{free_port()}/oarapi"
    client = OarRest(url, timeout_s=2)
    assert "hunter2" not in client.where
    with pytest.raises(CommandError) as caught:
        client.submit(SubmitRequest(command=["true"]), user="nobody")
    assert "hunter2" not in str(caught.value) and "***@127.0.0.1" in str(caught.value)
    with pytest.raises(InputError) as bad:
        OarRest("ftp://vjob:hunter2@host/")
    assert "hunter2" not in str(bad.value)


def test_the_deadline_type_becomes_the_jobs_deadline_in_local_time() -> None:
    """`oarsub -t deadline=...` is what the deadline rule checks at submission; the agent reads the
    same type so it can evaluate the running job (docs/deadline.md, "Live on OAR")."""
    job = {"id": 7, "owner": "alice", "state": "Running", "types": ["besteffort", "deadline=2031-05-04 10:20:30"]}
    parsed = job_from_dict("7", job, source="t").to_job()
    assert parsed.deadline == time.mktime((2031, 5, 4, 10, 20, 30, 0, 0, -1))
    assert job_deadline(("deadline=2031-05-04",)) == time.mktime((2031, 5, 4, 0, 0, 0, 0, 0, -1))
    assert job_deadline(("deadline=2031-05-04", "deadline=2031-05-05 01:00")) == time.mktime(
        (2031, 5, 5, 1, 0, 0, 0, 0, -1)
    )
    for bad in (
        "deadline=2031-13-01",
        "deadline=2031-02-31",
        "deadline=2031-05-04 25:00",
        "deadline=tomorrow",
        "deadline=2031-05-04 10:20:30; rm -rf /",
        "deadline=2031-05-04\n",
    ):
        assert job_deadline((bad,)) is None, bad
    assert job_from_dict("8", {**job, "types": ["besteffort"]}, source="t").to_job().deadline is None
