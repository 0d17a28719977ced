"""The pilot files fuzzed (issue 39, item 2): whatever bytes a job's user puts in state.json or
request.json, the reader answers with a typed value or an InputError, and the agent's tick goes
on for every other job.

Seeded: derandomized under the "ci" profile (tests/conftest.py), so CI and a developer's run see
the same cases; `HYPOTHESIS_PROFILE=random` draws new ones for a soak run. Three kinds of input:
any bytes, a valid file with slices overwritten by any bytes, and valid JSON with each field
replaced by any JSON value (huge integers, non-finite floats, long strings, nesting).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.act import _vm_view
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation, read_pilots
from vjob.config import parse
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobState, Node
from vjob.pilot_files import (
    CheckpointRequest,
    PilotDir,
    PilotState,
    PilotStatus,
    RequestKind,
    all_dirs,
    request_from_json,
)

FUZZ = settings(max_examples=800, suppress_health_check=list(HealthCheck))
"""Derandomized (and deadline-free) from the loaded profile: "ci" by default and under CI, so the
cases are the same every run; HYPOTHESIS_PROFILE=random makes this a soak run."""
GOOD, HOSTILE = "1", "2"


def _good_state(job_id: str) -> PilotStatus:
    return PilotStatus(
        job_id=job_id,
        vm=f"vjob-slurm-{job_id}",
        node="node1",
        uri="qemu:///system",
        state=PilotState.SAVED,
        since=time.time(),
        memory_path=f"/var/lib/vjob/{job_id}.state",
        saved_nodes=["node1"],
        history=[{"state": "saved", "at": 1.0, "node": "node1"}],
    )


VALID = json.dumps(_good_state(HOSTILE).to_json(), indent=1, sort_keys=True).encode()
REQUEST = json.dumps(
    {
        "request_id": "switch-1-action-2",
        "at": 1.5,
        "reason": "interactive job 9",
        "nodes": ["node1", "node2"],
        "kind": "resume",
        "node": "node2",
        "from_node": "node1",
    }
).encode()


class Site:
    """One pilot root with a good job's directory and a hostile one's, and an agent to read them."""

    def __init__(self, base: Path) -> None:
        self.root = base / "pilots"
        self.good = PilotDir(self.root, "slurm", GOOD)
        self.good.ensure()
        self.good.write_state(_good_state(GOOD))
        self.hostile = PilotDir(self.root, "slurm", HOSTILE)
        self.hostile.ensure()
        cfg = parse({"data_dir": str(base / "data"), "agent": {"pilot_dir": str(self.root)}})
        self.agent = Agent(cfg, object(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
        jobs = tuple(
            Job(id=j, user="root", rms="slurm", state=JobState.RUNNING, allocated_nodes=("node1",))
            for j in (GOOD, HOSTILE)
        )
        self.view = ClusterView(now=time.time(), jobs=jobs, nodes=(Node("node1", 4, 4096),))

    def tick_with(self, data: bytes) -> None:
        """What the agent's observation and switch view make of the hostile job writing `data`."""
        self.hostile.state_file.write_bytes(data)
        users = {GOOD: "root", HOSTILE: "root"}
        pilots = read_pilots(self.agent.ports, all_dirs(self.root, "slurm"), users)
        assert pilots[GOOD] == self.good.read_state(), "the good job's state must come through unchanged"
        if HOSTILE in pilots:
            st = pilots[HOSTILE]
            assert isinstance(st.memory_saved, bool)
            assert all(isinstance(v, int) and 0 <= v < 2**63 for v in (st.memory_mb, st.boots, st.pid))
            assert all(isinstance(v, float) and v >= 0 and v != float("inf") for v in (st.since, st.cpu_at))
        _vm_view(Observation(view=self.view, pilots=pilots, sleeping={}, store_ok=True), {HOSTILE})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return Site(tmp_path_factory.mktemp("pilot-fuzz"))


def _edits(base: bytes) -> st.SearchStrategy[bytes]:
    """`base` with up to 4 slices overwritten by any bytes or by a token that crashed a reader
    once (a number of 5000 digits, 10**400, non-finite literals, deep nesting)."""
    tokens = st.sampled_from([b"9" * 5000, b"1" + b"0" * 400, b"1e999", b"NaN", b"-Infinity", b"[" * 3000])
    edit = st.tuples(st.integers(0, len(base)), st.integers(0, 16), st.binary(max_size=24) | tokens)

    def apply(edits: list[tuple[int, int, bytes]]) -> bytes:
        out = base
        for at, cut, new in edits:
            out = out[:at] + new + out[at + cut :]
        return out

    return st.lists(edit, min_size=1, max_size=4).map(apply)


HUGE_INTS = st.sampled_from([10**400, -(10**30), 2**63, 2**63 - 1, -1, 0])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE_INTS
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(["/" + "a" * 300, "x" * 5000, "a\nb", "running", "node1", "\0", "inf", "nan", "1e400"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
"""Any JSON value, with the ones that crashed the reader (issue 39) drawn often."""


def _with_fields(base: bytes) -> st.SearchStrategy[bytes]:
    """`base` (a JSON object) with up to 5 of its fields (or new ones) set to any JSON value."""
    fields = sorted(json.loads(base))
    changes = st.dictionaries(st.sampled_from([*fields, "extra"]), JSON_VALUES, min_size=1, max_size=5)

    def apply(new: dict[str, Any]) -> bytes:
        # allow_nan: a hostile file may hold NaN/Infinity literals, which json.loads accepts
        return json.dumps({**json.loads(base), **new}).encode()

    return changes.map(apply)


@FUZZ
@given(data=st.binary(max_size=1024))
def test_any_bytes_in_state_json_cost_only_that_job(site: Site, data: bytes) -> None:
    site.tick_with(data)


@FUZZ
@given(data=_edits(VALID))
def test_a_mangled_state_json_costs_only_that_job(site: Site, data: bytes) -> None:
    site.tick_with(data)


@FUZZ
@given(data=_with_fields(VALID))
def test_any_field_values_in_state_json_cost_only_that_job(site: Site, data: bytes) -> None:
    site.tick_with(data)


def test_the_good_file_is_heard_when_the_hostile_one_is_valid(site: Site) -> None:
    """The fuzz above can pass vacuously only if the hostile job is never heard: it is, when valid."""
    site.hostile.state_file.write_bytes(VALID)
    pilots = read_pilots(site.agent.ports, all_dirs(site.root, "slurm"), {GOOD: "root", HOSTILE: "root"})
    assert set(pilots) == {GOOD, HOSTILE}


def _check_request(data: bytes, pdir: PilotDir) -> None:
    pdir.request_file.write_bytes(data)
    try:
        req = pdir.read_request()
    except InputError:
        return
    assert isinstance(req, CheckpointRequest) and isinstance(req.kind, RequestKind)
    assert isinstance(req.at, float) and 0 <= req.at < float("inf")
    assert all(isinstance(n, str) for n in (req.request_id, req.reason, req.node, req.from_node, *req.nodes))


@FUZZ
@given(data=st.one_of(st.binary(max_size=512), _edits(REQUEST), _with_fields(REQUEST)))
def test_any_request_json_is_a_request_or_an_input_error(site: Site, data: bytes) -> None:
    _check_request(data, site.hostile)


def test_the_valid_request_reads_back() -> None:
    req = request_from_json(json.loads(REQUEST), source="request.json")
    assert (req.kind, req.node, req.from_node, req.nodes) == (RequestKind.RESUME, "node2", "node1", ("node1", "node2"))


def test_fuzz_files_are_the_users_own(site: Site) -> None:
    """The fuzzed directory is a plain 0700 directory (ensure): the reader saw what a pilot makes."""
    assert os.stat(site.hostile.path).st_mode & 0o777 == 0o700
