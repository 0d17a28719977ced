"""A few jobs' JSON searched from the end of a whole `squeue --json` held in a memfd
(plugins.slurm.json_tail; issue 37 item 1): the same Jobs as decoding everything and as the
forward stream (json_stream), wherever the jobs sit, whatever the order, the layout and the text
users put in their jobs; truncated or foreign output refused; the command's errors as the pipe
stream reports them; only the tail read when the jobs are there.

The expected Jobs come from `json.loads` of the whole text and parse_json.jobs.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devkit.slurm_standin import SlurmStandIn
from plugins.slurm import json_stream, json_tail, parse_json
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.json_fields import Reuse
from vjob.errors import CommandError, CommandUnavailable, InputError
from vjob.model import Job

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"


def _doc(copies: int = 1) -> dict[str, Any]:
    """The 22.05 recording (29 jobs, ids 1-29), its jobs repeated `copies` times under new ids."""
    doc = json.loads((FIXTURES / "debian-22.05-squeue.json").read_text())
    jobs = doc["jobs"]
    for n in range(1, copies):
        for job in jobs[:29]:
            jobs.append(dict(job, job_id=job["job_id"] + 100 * n))
    return doc


def _expected(text: str | bytes, wanted: set[int]) -> list[Job]:
    whole = parse_json.jobs(json.loads(text), source="f")
    return [j for j in whole if int(j.id) in wanted]


def _from_file(data: bytes, wanted: set[int]) -> tuple[list[Job], int]:
    """The jobs `wanted` of `data` read through a memfd as Fetch reads it, and the bytes read."""
    fd = os.memfd_create("test-json-tail")
    try:
        os.write(fd, data)
        buf = json_tail.FileBuffer(fd, len(data), "f")
        got = json_stream.jobs_in(buf, source="f", keep=wanted, reuse=Reuse(), asked=json_tail._from_end)
        return got, buf.read_bytes
    finally:
        os.close(fd)


def _check(text: str, wanted: set[int]) -> int:
    """The tail read gives what decoding everything gives, and what the forward stream gives."""
    data = text.encode()
    got, read = _from_file(data, wanted)
    assert got == _expected(text, wanted)
    assert got == json_stream.jobs([data], source="f", keep=set(wanted))
    return read


WANTED = {
    "the last": {29},
    "the last three": {27, 28, 29},
    "in the middle": {14, 15},
    "the first": {1},
    "first and last": {1, 29},
    "missing": {99_999},
    "some missing": {3, 99_999, 28},
    "none": set(),
    "every job": set(range(1, 30)),
}


@pytest.mark.parametrize("name", sorted(WANTED))
def test_jobs_anywhere_are_found_as_decoding_everything_finds_them(name: str) -> None:
    _check(json.dumps(_doc(), indent=2), WANTED[name])


def test_jobs_at_the_end_are_read_from_the_tail_alone() -> None:
    text = json.dumps(_doc(copies=40), indent=2)  # 1,160 jobs, 4.3 MB
    last = {j["job_id"] for j in _doc(copies=40)["jobs"][-5:]}
    read = _check(text, last)
    assert read < len(text) // 8  # the head, the tail and one window: not the whole output
    assert _check(text, {1}) >= len(text)  # the first job: every window down to it


def test_the_answer_does_not_depend_on_the_order() -> None:
    doc = _doc(copies=3)
    random.Random(37).shuffle(doc["jobs"])
    text = json.dumps(doc, indent=2)
    for wanted in ({1, 229}, {doc["jobs"][0]["job_id"]}, {doc["jobs"][-1]["job_id"], 17}, {5, 105, 205}):
        _check(text, wanted)


def test_text_a_user_wrote_cannot_pose_as_an_id_line_a_job_end_or_the_list_end() -> None:
    doc = _doc()
    last, before = doc["jobs"][-1], doc["jobs"][-2]
    last["name"] = '\n      "job_id": 17,\n    },\n    {\n      "job_id": 18,\n'
    last["comment"] = '"job_id": 17,\n    }\n  ]\n}'
    before["account"] = "x\n    }\n  ],\n"
    before["admin_comment"] = '\n      "user_name": "alice",\n'
    text = json.dumps(doc, indent=2)  # strings written with \n escapes, as Slurm writes them
    for wanted in ({17}, {18}, {last["job_id"]}, {before["job_id"]}, {17, last["job_id"]}):
        _check(text, wanted)
    assert all(j.user != "alice" for j in _from_file(text.encode(), set(range(1, 30)))[0])


def test_an_empty_list_and_a_single_job() -> None:
    doc = _doc()
    for jobs in ([], doc["jobs"][-1:]):
        text = json.dumps({**doc, "jobs": jobs}, indent=2)
        for wanted in (set(), {29}, {1}):
            _check(text, wanted)
    _check('{"meta": ' + json.dumps(doc["meta"]) + ', "errors": [], "jobs": [\n  ]\n}', {1})


def test_other_layouts_and_members_after_the_jobs() -> None:
    doc = _doc()
    warned = {**doc, "warnings": [{"description": "a", "source": "b"}, {"description": "c", "source": "d"}]}
    meta_last = {"errors": [], "jobs": doc["jobs"], "meta": doc["meta"]}
    texts = [
        json.dumps(doc),  # one line: decoded job by job
        json.dumps(doc, indent=4),
        json.dumps(warned, indent=2),  # an array of objects at the jobs' indents after them
        json.dumps(meta_last, indent=2),
        json.dumps(doc, indent=2) + "\n",
    ]
    for text in texts:
        for wanted in ({29}, {1, 15}, {99}):
            _check(text, wanted)


def test_truncated_or_foreign_output_is_refused() -> None:
    text = json.dumps(_doc(), indent=2)
    last_id = text.rindex('"job_id"')
    bad = [
        text[:-1],  # the object not closed
        text[: text.rindex("]")],  # the list not closed
        text[: last_id + 20],  # cut inside the last job
        text[: text.index('"job_id"', text.index('"job_id"') + 10)],  # cut inside the second job
        text + "{}",
        text.replace('"meta"', '"mota"', 1),  # no layout to check
        '{"meta": {}, "jobs": 5}',
        "[]",
    ]
    for one in bad:
        for wanted in ({29}, {1}):
            with pytest.raises(InputError) as tail:
                _from_file(one.encode(), wanted)
            with pytest.raises(InputError) as stream:
                json_stream.jobs([one.encode()], source="f", keep=set(wanted))
            assert str(tail.value) == str(stream.value)


def _standin(tmp_path: Path, doc: dict[str, Any]) -> tuple[SlurmCommands, bytes]:
    """The stand-in squeue (22.05: prints every job whatever it is asked) over `doc`, laid out
    as Slurm lays it out, and its whole output."""
    standin = SlurmStandIn(tmp_path / "bin", version="22.05.8", meta=doc["meta"])
    standin.write_base(
        (str(j["job_id"]), "    " + json.dumps(j, indent=2).replace("\n", "\n    ")) for j in doc["jobs"]
    )
    whole = subprocess.run([str(standin.dir / "squeue"), "--json"], capture_output=True, check=True).stdout
    return SlurmCommands(bin_dir=str(standin.dir)), whole


def test_squeue_writes_into_the_memfd_and_the_tail_is_read(tmp_path: Path) -> None:
    cmd, whole = _standin(tmp_path, _doc(copies=40))
    fetch = json_tail.Fetch()
    for wanted in ({3929, 3928}, {1}, {2005, 99_999}, set()):
        got = fetch.jobs(cmd, ["--json"], wanted, source="squeue --json", reuse=Reuse())
        assert got == _expected(whole, wanted)
        assert fetch.last_size == len(whole)
        if wanted == {3929, 3928}:
            assert fetch.last_read < len(whole) // 8


def test_an_output_past_the_limit_is_streamed_through_a_pipe(tmp_path: Path) -> None:
    cmd, whole = _standin(tmp_path, _doc(copies=4))
    fetch = json_tail.Fetch(limit=len(whole) - 1)
    first = fetch.jobs(cmd, ["--json"], {329}, source="s", reuse=Reuse())  # size unknown yet: memfd
    assert fetch.last_read < fetch.last_size == len(whole)
    again = fetch.jobs(cmd, ["--json"], {329}, source="s", reuse=Reuse())  # past the limit: the pipe
    assert fetch.last_read == fetch.last_size == len(whole)
    assert first == again == _expected(whole, {329})


def _command(tmp_path: Path, script: str) -> SlurmCommands:
    (tmp_path / "squeue").write_text("#!/bin/sh\n" + script + "\n")
    (tmp_path / "squeue").chmod(0o755)
    return SlurmCommands(bin_dir=str(tmp_path), timeout_s=1)


def test_the_commands_errors_are_the_pipe_streams(tmp_path: Path) -> None:
    failing = _command(
        tmp_path, "echo '{\"jobs\": ['; echo 'squeue: error: Unable to contact slurm controller' >&2; exit 3"
    )
    for reader in (
        lambda: json_tail.Fetch().jobs(failing, ["--json"], {1}, source="s", reuse=Reuse()),
        lambda: json_stream.jobs(json_stream.command_chunks(failing, "squeue", ["--json"]), source="s", keep={1}),
    ):
        with pytest.raises(CommandError) as failed:
            reader()
        assert str(failed.value) == "squeue: exit status 3: squeue: error: Unable to contact slurm controller"
    hanging = _command(tmp_path, "echo '{'; exec sleep 60")
    with pytest.raises(CommandUnavailable, match=r"no complete answer within 1 s; killed \(is slurmctld up\?\)"):
        json_tail.Fetch().jobs(hanging, ["--json"], {1}, source="s", reuse=Reuse())
    missing = SlurmCommands(bin_dir=str(tmp_path / "nowhere"))
    with pytest.raises(CommandError, match="not found"):
        json_tail.Fetch().jobs(missing, ["--json"], {1}, source="s", reuse=Reuse())


def test_unchanged_jobs_fetched_again_are_the_same_objects() -> None:
    doc = _doc()
    reuse = Reuse()
    text = json.dumps(doc, indent=2).encode()
    fd = os.memfd_create("t")
    try:
        os.write(fd, text)
        reads = []
        for _ in range(2):
            buf = json_tail.FileBuffer(fd, len(text), "f")
            reads.append(json_stream.jobs_in(buf, source="f", keep={28, 29}, reuse=reuse, asked=json_tail._from_end))
    finally:
        os.close(fd)
    assert [a is b for a, b in zip(*reads, strict=True)] == [True, True]
    changed = copy.deepcopy(doc)
    changed["jobs"][-1]["user_name"] = "someone"
    got, _ = _from_file(json.dumps(changed, indent=2).encode(), {29})
    assert got[0].user == "someone"


def test_what_follows_each_object_is_checked_in_a_full_read_too() -> None:
    """json_stream reads what follows each object in one step (a comma and the next object, or
    the list's end); anything else, at any chunking, is refused as before."""
    text = json.dumps(_doc(), indent=2)
    whole = parse_json.jobs(json.loads(text), source="f")
    end = text.rindex("}\n  ]")
    for bad in (text[:end] + "},\n    5\n  ]\n}", text[:end] + "}\n    x\n  ]\n}", text[:end] + "},\n  ]\n}"):
        for size in (3, 4096, 1 << 20):
            with pytest.raises(InputError):
                json_stream.jobs([bad.encode()[i : i + size] for i in range(0, len(bad), size)], source="f")
    for size in (3, 4096, 1 << 20):
        assert json_stream.jobs([text.encode()[i : i + size] for i in range(0, len(text), size)], source="f") == whole
