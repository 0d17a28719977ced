"""Reading only the members vjob needs of Slurm's pretty JSON (plugins.slurm.json_fields and the
stream of json_stream; issue 37 item 1): the same Jobs as decoding everything, whatever the
layout, the chunking and the text users put in their jobs; unchanged jobs given back as the
same objects, and a change that matters never hidden.

The expected Jobs always come from `json.loads` of the whole text and parse_json.jobs, the path
every layout is held to.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plugins.slurm import json_stream, parse_json
from plugins.slurm.json_fields import JOB_FIELDS, NODE_FIELDS, NodeReuse, Reuse
from vjob.errors import InputError
from vjob.model import JobClass, JobState

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"


def _recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def _many_2311() -> dict[str, Any]:
    """The 23.11 recording (one job) made into a few, pending and running, as data_parser prints them."""
    doc = _recorded("zocalo_slurmrestd_23.11_v0.0.40_jobs.json")
    (only,) = doc["jobs"]
    for n in range(1, 4):
        more = copy.deepcopy(only)
        more.update(job_id=only["job_id"] + n, job_state=["PENDING"], nodes="")
        doc["jobs"].append(more)
    return doc


def _slurm_order(doc: dict[str, Any]) -> dict[str, Any]:
    """meta, errors, warnings first, then jobs (Slurm's own order; the recording's is sorted)."""
    first = {k: doc[k] for k in ("meta", "errors", "warnings") if k in doc}
    return {**first, **{k: v for k, v in doc.items() if k not in first}}


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


DOCS = {
    "22.05": lambda: _recorded("debian-22.05-squeue.json"),
    "23.11 sorted (meta after jobs)": _many_2311,
    "23.11 Slurm's order": lambda: _slurm_order(_many_2311()),
}
LAYOUTS = {
    "pretty": lambda doc: json.dumps(doc, indent=2),
    "one line": lambda doc: json.dumps(doc),
    "indent 4": lambda doc: json.dumps(doc, indent=4),
    "two warnings after the jobs": lambda doc: json.dumps(
        {**doc, "warnings": [{"description": "a", "source": "b"}, {"description": "c", "source": "d"}]}, indent=2
    ),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("doc_name", sorted(DOCS))
def test_the_stream_reads_every_layout_as_json_loads_does(doc_name: str, layout: str) -> None:
    doc = DOCS[doc_name]()
    text = LAYOUTS[layout](doc)
    whole = parse_json.jobs(json.loads(text), source="f")
    ids = [int(j.id) for j in whole]
    for size in (7, 333, 1 << 20):
        assert json_stream.jobs(_chunks(text.encode(), size), source="f") == whole
        for wanted in ({ids[0]}, {ids[-1], ids[len(ids) // 2]}, set(ids), {99999999}):
            expected = [j for j in whole if int(j.id) in wanted]
            got = json_stream.jobs(_chunks(text.encode(), size), source="f", keep=wanted.__contains__)
            assert got == expected
            assert json_stream.jobs(_chunks(text.encode(), size), source="f", keep=wanted) == expected


class _Reads(dict):  # type: ignore[type-arg]
    """A job's dict that remembers every key parse_json.job asks for."""

    asked: ClassVar[set[str]] = set()

    def get(self, key: str, default: Any = None) -> Any:
        _Reads.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        _Reads.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        _Reads.asked.add(str(key))
        return super().__contains__(key)


def test_job_fields_are_the_members_parse_json_reads() -> None:
    """Cutting out JOB_FIELDS is exact only while parse_json.job reads nothing else."""
    _Reads.asked = set()
    items = [*_recorded("debian-22.05-squeue.json")["jobs"], *_many_2311()["jobs"]]
    variants = []
    for item in items:
        variants.append(item)
        for change in (
            {"memory_per_node": 0, "memory_per_cpu": 0, "user_name": ""},
            {"job_state": "COMPLETED"},
            {"job_state": "PENDING", "priority": 5, "hold": True},
        ):
            variants.append({**item, **change})
    for item in variants:
        parse_json.job(_Reads(item), "f")
    assert _Reads.asked == set(JOB_FIELDS)


def _hostile(doc: dict[str, Any]) -> dict[str, Any]:
    """Job names, comments and accounts that spell out other members, other jobs and ends of jobs."""
    doc = copy.deepcopy(doc)
    first, second = doc["jobs"][0], doc["jobs"][1]
    first["name"] = '\n      "admin_comment": "vjob:class=interactive",\n      "user_name": "alice",\n'
    first["comment"] = f'\n    }},\n    {{\n      "job_id": {second["job_id"]},\n      "user_name": "alice"\n    }}'
    second["name"] = '"job_id": 1,\n"batch_flag": false,\u2028é\x00\x1b[2J'
    second["account"] = "x\n      }\n    ]\n  }"
    return doc


@pytest.mark.parametrize("doc_name", sorted(DOCS))
def test_text_a_user_wrote_cannot_pose_as_a_member_or_a_job(doc_name: str) -> None:
    doc = _hostile(DOCS[doc_name]())
    text = json.dumps(doc, indent=2)  # the texts are written with \n escapes, as Slurm writes them
    whole = parse_json.jobs(json.loads(text), source="f")
    got = json_stream.jobs([text.encode()], source="f")
    assert got == whole
    assert all(j.user != "alice" for j in got) and got[0].job_class is JobClass.BATCH
    one = {doc["jobs"][1]["job_id"]}
    assert json_stream.jobs([text.encode()], source="f", keep=one.__contains__) == [whole[1]]


def test_bytes_that_are_not_utf8_read_as_the_whole_text_reads_them() -> None:
    doc = _recorded("debian-22.05-squeue.json")
    doc["jobs"][0]["user_name"] = "MARK"
    data = json.dumps(doc, indent=2).encode().replace(b"MARK", b"a\xffb")
    whole = parse_json.jobs(json.loads(data.decode("utf-8", "replace")), source="f")
    assert json_stream.jobs([data], source="f") == whole and whole[0].user == "a\ufffdb"


def test_truncated_or_foreign_output_is_refused_whole() -> None:
    text = json.dumps(_recorded("debian-22.05-squeue.json"), indent=2)
    cut = text[: text.index('"job_id"', text.index('"job_id"') + 10)]
    for bad in (cut, text[:-4], text + "{}", '{"meta": {}, "jobs": 5}'):
        with pytest.raises(InputError):
            json_stream.jobs([bad.encode()], source="f")
        with pytest.raises(InputError):
            json_stream.jobs([bad.encode()], source="f", keep={17}.__contains__)


def _read(doc: dict[str, Any], reuse: Reuse) -> dict[str, Any]:
    return {j.id: j for j in json_stream.jobs([json.dumps(doc, indent=2).encode()], source="f", reuse=reuse)}


def test_unchanged_jobs_come_back_as_the_same_objects_and_what_matters_is_never_hidden() -> None:
    doc = _recorded("debian-22.05-squeue.json")
    by_id = {str(j["job_id"]): j for j in doc["jobs"]}
    pending = next(k for k, j in by_id.items() if j["job_state"] == "PENDING" and j["priority"] > 0)
    running = next(k for k, j in by_id.items() if j["job_state"] == "RUNNING")
    reuse = Reuse()
    first = _read(doc, reuse)
    again = _read(doc, reuse)
    assert all(again[k] is first[k] for k in first) and reuse.misses == 0
    # a pending job's priority (age) and expected start move: the job itself did not change
    by_id[pending].update(priority=by_id[pending]["priority"] + 7, start_time=by_id[pending]["start_time"] + 600)
    moved = _read(doc, reuse)
    assert moved[pending] is first[pending] and reuse.misses == 0
    by_id[pending]["priority"] = 0  # held: a change that matters
    held = _read(doc, reuse)
    assert held[pending].state is JobState.HELD and held == parse_json_jobs(doc)
    by_id[running]["start_time"] += 5  # a running job's start is read: a restart
    by_id[running]["nodes"] = "node9"
    restarted = _read(doc, reuse)
    assert restarted[running] is not first[running] and restarted == parse_json_jobs(doc)
    del doc["jobs"][0]
    _read(doc, reuse)
    assert len(reuse.entries) == len(doc["jobs"])  # a full read forgets the jobs gone


def parse_json_jobs(doc: dict[str, Any]) -> dict[str, Any]:
    return {j.id: j for j in parse_json.jobs(doc, source="f")}


def _nodes_doc() -> dict[str, Any]:
    """The 21.08 `sinfo --json` recording's nodes, and more of them, states and features varied."""
    doc = _recorded("rivos_sinfo_out.json")
    doc["meta"] = _recorded("debian-22.05-squeue.json")["meta"]
    node = doc["nodes"][0]
    doc["nodes"] += [
        dict(node, name=f"n{i}", state=s, active_features=f)
        for i, (s, f) in enumerate([("idle", "a,b"), ("mixed", ""), ("down", "x"), ("allocated", "gpu")])
    ]
    doc["nodes"].append(dict(node))  # a name twice: the first one is kept
    return doc


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_nodes_are_read_as_json_loads_reads_them(layout: str) -> None:
    text = LAYOUTS[layout](_nodes_doc())
    whole = parse_json.nodes(json.loads(text), source="f")
    for size in (5, 777, 1 << 20):
        assert json_stream.nodes(_chunks(text.encode(), size), source="f") == whole


def test_node_fields_are_the_members_parse_json_reads_and_unchanged_nodes_are_kept() -> None:
    _Reads.asked = set()
    for item in _nodes_doc()["nodes"]:
        parse_json.node(_Reads(item), "f")
        parse_json.node(_Reads({**item, "active_features": None}), "f")
    assert _Reads.asked == set(NODE_FIELDS)
    doc = _nodes_doc()
    reuse = NodeReuse()
    first = json_stream.nodes([json.dumps(doc, indent=2).encode()], source="f", reuse=reuse)
    for node in doc["nodes"]:
        node["cpu_load"] = node.get("cpu_load", 0) + 3  # moves at every look, not read
    doc["nodes"][1]["state"] = "drain"
    again = json_stream.nodes([json.dumps(doc, indent=2).encode()], source="f", reuse=reuse)
    assert [a is b for a, b in zip(first, again, strict=True)] == [i != 1 for i in range(len(first))]
    assert again == parse_json.nodes(doc, source="f")
