"""Slurm 23.02+ JSON (data_parser v0.0.39+) on recorded real outputs (issue 22, item 7).

Counts and values are taken from the raw JSON in each test, not from the reader under test.
Sources and licences: tests/data/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plugins.slurm import parse_json, parse_output
from plugins.slurm.adapter import SlurmAdapter
from vjob.errors import InputError
from vjob.model import JobClass, JobState, NodeState


@pytest.fixture(scope="module")
def fixtures(shared_dir: Path) -> Path:
    return shared_dir / "data" / "fixtures" / "slurm"


def _load(fixtures: Path, name: str) -> tuple[str, dict[str, Any]]:
    text = (fixtures / name).read_text()
    return text, json.loads(text)


def test_v0_0_40_jobs_of_slurmrestd_23_11(fixtures: Path) -> None:
    text, raw = _load(fixtures, "zocalo_slurmrestd_23.11_v0.0.40_jobs.json")
    assert parse_json.layout(raw, source="f") == "data_parser/v0.0.40"
    assert parse_json.release(raw) == "23.11.1"
    jobs = parse_output("jobs", text, source="f")
    assert len(jobs) == len(raw["jobs"])
    job, item = jobs[0], raw["jobs"][0]
    assert job.id == str(item["job_id"]) and job.user == item["user_name"] and job.account == item["account"]
    assert job.state is JobState.RUNNING and item["job_state"] == ["RUNNING"]
    assert job.job_class is JobClass.BATCH and item["batch_flag"] is True
    assert job.allocated_nodes == (item["nodes"],)
    # number objects: memory_per_cpu {set: true, number: 9000} x 1 core; memory_per_node is {set: false}
    assert job.memory_mb == item["memory_per_cpu"]["number"] * item["cpus"]["number"]
    assert job.walltime == item["time_limit"]["number"] * 60
    assert job.submit_time == item["submit_time"]["number"] and job.start_time == item["start_time"]["number"]


def test_v0_0_39_sinfo_of_23_02(fixtures: Path) -> None:
    text, raw = _load(fixtures, "rivos_sinfo_dataparser_23.02.json")
    assert parse_json.layout(raw, source="f") == "data_parser/v0.0.39"
    nodes = parse_output("nodes", text, source="f")
    names = [n for group in raw["sinfo"] for n in group["nodes"]["nodes"]]
    assert [n.name for n in nodes] == names == ["localhost"]
    assert nodes[0].state is NodeState.ALLOCATED and nodes[0].cpus == raw["sinfo"][0]["cpus"]["minimum"]


def _job_doc(parser: str, **fields: Any) -> dict[str, Any]:
    job = {"job_id": 5, "job_state": ["PENDING"], "user_name": "u", "batch_flag": True, **fields}
    return {"meta": {"plugin": {"type": "", "data_parser": parser}}, "jobs": [job]}


@pytest.mark.parametrize("parser", ["data_parser/v0.0.41", "v0.0.42", "data_parser/v0.0.42+complex"])
def test_later_data_parsers_are_read_alike(parser: str) -> None:
    """No recorded v0.0.41/42 output with a known source was found; these layouts keep every
    field vjob reads (checked against Slurm's generated OpenAPI specs), so the same reader serves."""
    doc = _job_doc(
        parser,
        hold=True,
        time_limit={"set": False, "infinite": True, "number": 0},
        memory_per_node={"set": True, "infinite": False, "number": 2048},
    )
    (job,) = parse_output("jobs", json.dumps(doc), source="f")
    assert job.state is JobState.HELD and job.walltime is None and job.memory_mb == 2048


def test_number_objects_are_checked() -> None:
    for bad in ({"set": True, "number": "5"}, {"set": True, "number": True}, [5]):
        with pytest.raises(InputError, match=r"jobs\[0\] \(job 5\)\.cpus"):
            parse_output("jobs", json.dumps(_job_doc("v0.0.40", cpus=bad)), source="f")


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ((22, 5), "--json"),
        ((23, 2), "--json=v0.0.39"),
        ((23, 11), "--json=v0.0.40"),
        ((24, 5), "--json=v0.0.41"),
        ((24, 11), "--json=v0.0.42"),
        ((25, 11), "--json=v0.0.42"),
    ],
)
def test_adapter_asks_for_an_explicit_data_parser(version: tuple[int, int], flag: str) -> None:
    adapter = SlurmAdapter()
    adapter._version = version  # what `sinfo --version` would have said
    assert adapter.uses_json and adapter._json_flag() == flag


def test_text_path_only_before_20_11() -> None:
    adapter = SlurmAdapter()
    adapter._version = (20, 2)
    assert not adapter.uses_json and adapter.data_parser() is None
