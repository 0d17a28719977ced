"""Observing Slurm by change (plugins.slurm.incremental, json_stream; issue 37 item 1).

The adapter runs stand-in squeue/sinfo/scontrol executables (devkit.slurm_standin) that print
the real Slurm 22.05 recording (and the 23.11 data_parser one), moved on by the test: a job
starts, one arrives, one goes. What is checked is what the adapter then returns and which
commands it ran; the expected values come from the recorded JSON, not from the reader.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from devkit.slurm_standin import SlurmStandIn, listing_line
from plugins.slurm import json_stream, parse_json
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.incremental import Inconsistent, IncrementalJobs, listing
from vjob.errors import InputError
from vjob.model import Job, JobState

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"


class Cluster:
    """The recorded jobs, movable, published through the stand-ins."""

    def __init__(self, tmp: Path, recording: str, version: str) -> None:
        doc = json.loads((FIXTURES / recording).read_text())
        self.items: dict[str, dict[str, Any]] = {str(j["job_id"]): j for j in doc["jobs"]}
        self.standin = SlurmStandIn(tmp / "bin", version=version, meta=doc["meta"])
        self.standin.write_base((k, _text(v)) for k, v in self.items.items())
        self.base = dict(self.items)
        self.publish()

    def publish(self) -> None:
        delta: dict[str, str | None] = {k: _text(v) for k, v in self.items.items() if self.base.get(k) is not v}
        delta.update({k: None for k in self.base if k not in self.items})
        self.standin.write_delta(delta)
        self.standin.write("listing.txt", "".join(listing_line(v) + "\n" for v in self.items.values()))

    def adapter(self, resync_every: int = 5) -> SlurmAdapter:
        return SlurmAdapter(SlurmCommands(bin_dir=str(self.standin.dir)), resync_every=resync_every)

    def json_calls(self) -> list[list[str]]:
        return [c for c in self.standin.calls() if c[0] == "squeue" and any(a.startswith("--json") for a in c)]


def _text(item: dict[str, Any]) -> str:
    return json.dumps(item, indent=2)


def _unfinished(items: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Job id → its recorded state word, for the jobs squeue would still call unfinished."""
    done = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")
    out = {}
    for k, v in items.items():
        word = v["job_state"][0] if isinstance(v["job_state"], list) else v["job_state"]
        if word not in done:
            out[k] = word
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, "debian-22.05-squeue.json", "22.05.8")


def test_steady_state_reads_no_json_and_a_change_is_read(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    first = {j.id: j for j in adapter.jobs()}
    assert set(first) == set(_unfinished(cluster.items)) and adapter.incremental.last.full
    cluster.standin.forget_calls()
    again = {j.id: j for j in adapter.jobs()}
    assert again == first and cluster.json_calls() == []  # nothing changed: the listing only
    pending = next(k for k, w in _unfinished(cluster.items).items() if w == "PENDING")
    started = copy.deepcopy(cluster.items[pending])
    started.update(job_state="RUNNING", nodes="node7", start_time=started["submit_time"] + 30)
    cluster.items[pending] = started
    cluster.publish()
    seen = {j.id: j for j in adapter.jobs()}
    assert seen[pending].state is JobState.RUNNING and seen[pending].allocated_nodes == ("node7",)
    assert seen[pending].start_time == started["start_time"]
    assert adapter.incremental.last.changed == 1 and adapter.incremental.last.new == 0
    assert len(cluster.json_calls()) == 1  # 22.05 ignores --jobs: one whole listing, streamed
    assert {k: v for k, v in seen.items() if k != pending} == {k: v for k, v in first.items() if k != pending}


def test_a_job_appears_and_one_disappears(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    adapter.jobs()
    gone = next(k for k, w in _unfinished(cluster.items).items() if w == "RUNNING")
    template = next(v for v in cluster.items.values() if v["job_state"] == "PENDING")
    new = copy.deepcopy(template)
    new.update(job_id=4242, batch_flag=False, user_name="alice")
    del cluster.items[gone]
    cluster.items["4242"] = new
    cluster.publish()
    seen = {j.id: j for j in adapter.jobs()}
    assert gone not in seen and seen["4242"].user == "alice" and seen["4242"].interactive
    last = adapter.incremental.last
    assert (last.new, last.gone, last.full) == (1, 1, False)
    del cluster.items["4242"]
    cluster.publish()
    cluster.standin.forget_calls()
    assert "4242" not in {j.id for j in adapter.jobs()} and cluster.json_calls() == []  # gone: no JSON needed


def test_resync_every_n_ticks_and_on_an_inconsistent_listing(cluster: Cluster) -> None:
    adapter = cluster.adapter(resync_every=3)
    fulls = []
    for _ in range(6):
        adapter.jobs()
        fulls.append(adapter.incremental.last.full)
    assert fulls == [True, False, False, True, False, False]
    listed = cluster.standin.dir / "listing.txt"
    lines = listed.read_text().splitlines()
    listed.write_text("\n".join([*lines, lines[-1]]) + "\n")  # one job twice
    adapter.jobs()
    assert adapter.incremental.last.full and adapter.incremental.last.reason == "inconsistent listing"
    cluster.publish()
    adapter.jobs()
    assert adapter.incremental.last.full  # after an inconsistent listing, read all once more
    adapter.jobs()
    assert not adapter.incremental.last.full


def test_a_name_like_field_in_the_listing_is_inconsistent() -> None:
    line = "17|PENDING|1|1|0M|UNLIMITED|2026-11-29T10:00:00|N/A||0"
    assert list(listing(line)) == ["17"]
    for bad in (line.replace("PENDING", "PENDING x"), line + "|5", "17 RUNNING", line.replace("17", "1 7"), line + "x"):
        with pytest.raises(Inconsistent):
            listing(bad)
    assert listing(line.replace("PENDING", "COMPLETED")) == {}  # finished: not a job to keep


def _job(job_id: str, state: JobState = JobState.PENDING) -> Job:
    return Job(id=job_id, user="u", rms="slurm", state=state)


def test_a_record_whose_id_was_not_asked_for_is_rejected() -> None:
    lines = {"1": "1|PENDING|1|1|0M|UNLIMITED|X|N/A||5", "2": "2|PENDING|1|1|0M|UNLIMITED|X|N/A||5"}
    listed = dict(lines)
    jobs = IncrementalJobs(
        list_jobs=lambda: "\n".join(listed.values()),
        fetch=lambda ids: [_job(i) for i in ids] + [_job("99", JobState.RUNNING)],
        read_all=lambda: [_job("1"), _job("2")],
        resync_every=10,
    )
    assert [j.id for j in jobs.jobs()] == ["1", "2"]
    listed["3"] = "3|PENDING|1|1|0M|UNLIMITED|X|N/A||5"
    assert [j.id for j in jobs.jobs()] == ["1", "2", "3"]
    assert jobs.last.rejected and "job 99" in jobs.last.rejected[0]


def test_data_parser_slurm_is_asked_for_the_changed_jobs_only(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "zocalo_slurmrestd_23.11_v0.0.40_jobs.json", "23.11.1")
    (only,) = cluster.items.values()
    for n in range(1, 4):  # a few more from the one recorded job, pending
        more = copy.deepcopy(only)
        more.update(job_id=only["job_id"] + n, job_state=["PENDING"], nodes="")
        cluster.items[str(more["job_id"])] = more
    cluster.publish()
    adapter = cluster.adapter()
    assert len(adapter.jobs()) == 4
    started, new = str(only["job_id"] + 2), str(only["job_id"] + 9)
    cluster.items[started] = dict(cluster.items[started], job_state=["RUNNING"], nodes="cma2-03")
    cluster.items[new] = dict(cluster.items[started], job_id=int(new), job_state=["PENDING"], nodes="")
    cluster.publish()
    cluster.standin.forget_calls()
    seen = {j.id: j for j in adapter.jobs()}
    assert seen[started].state is JobState.RUNNING and seen[started].allocated_nodes == ("cma2-03",)
    assert seen[new].state is JobState.PENDING and adapter.incremental.last.applied == 1  # the start: no JSON
    assert seen[started] == parse_json.job(cluster.items[started], "started")  # as its JSON says
    (call,) = cluster.json_calls()
    assert call[1] == "--json=v0.0.40" and f"--jobs={new}" in call


def test_priorities_go_in_one_scontrol_grouped_by_value(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    cluster.standin.forget_calls()
    assert adapter.set_priorities({"17": 500, "18": 400, "25": 500}) == {}
    (call,) = cluster.standin.calls()
    assert call[0] == "scontrol" and call[1].splitlines() == [
        "update JobId=17,25 SiteFactor=500",
        "update JobId=18 SiteFactor=400",
        "quit",
    ]
    with pytest.raises(InputError):
        adapter.set_priorities({"17; rm": 1})


def test_the_stream_reads_what_json_loads_reads() -> None:
    text = (FIXTURES / "debian-22.05-squeue.json").read_text()
    whole = parse_json.jobs(json.loads(text), source="f")
    for size in (1, 7, 4096):
        chunks = (text[i : i + size] for i in range(0, len(text), size))
        assert json_stream.jobs(chunks, source="f") == whole
    assert [j.id for j in json_stream.jobs([text], source="f", keep={17, 18}.__contains__)] == ["17", "18"]
    for bad in (text[:-3], text + "{}", text.replace('"meta"', '"mota"', 1), '{"meta": {}, "jobs": 5}'):
        with pytest.raises(InputError):
            json_stream.jobs([bad], source="f")


def test_skipping_unwanted_jobs_by_layout_equals_decoding_them_all() -> None:
    """The 22.05 fetch passes over the jobs not asked for by Slurm's indentation (json_stream
    learn, _asked); it must give what decoding every job gives, whatever the chunking."""
    text = (FIXTURES / "debian-22.05-squeue.json").read_text()
    whole = {int(j.id): j for j in parse_json.jobs(json.loads(text), source="f")}
    buf = json_stream._Buffer(iter([]), "f")
    buf.data = text.encode()
    buf.at = buf.data.index(b"{", buf.data.index(b'"jobs"'))
    assert json_stream.learn(buf) is not None  # the recording is laid out as Slurm lays it out
    for wanted in ({17}, {1, 29}, {14, 15, 16, 99}, set()):
        for size in (7, 333, 1 << 20):
            chunks = (text[i : i + size] for i in range(0, len(text), size))
            got = json_stream.jobs(chunks, source="f", keep=wanted.__contains__)
            assert got == [whole[i] for i in sorted(wanted) if i in whole]


def test_a_job_name_cannot_pose_as_the_end_of_a_job_or_another_id() -> None:
    doc = json.loads((FIXTURES / "debian-22.05-squeue.json").read_text())
    forged = '\n    },\n    {\n      "job_id": 17,\n      "user_name": "alice",\n'
    doc["jobs"][0]["name"] = forged
    doc["jobs"][0]["comment"] = '"job_id": 17,'
    text = json.dumps(doc, indent=2)  # the name is written with \n escapes, as Slurm writes it
    got = json_stream.jobs([text], source="f", keep={17}.__contains__)
    real = next(j for j in doc["jobs"] if j["job_id"] == 17)
    assert [(j.id, j.user) for j in got] == [("17", real["user_name"])]
    first = json_stream.jobs([text], source="f", keep={doc["jobs"][0]["job_id"]}.__contains__)
    assert [j.id for j in first] == [str(doc["jobs"][0]["job_id"])]


def test_a_pending_jobs_moving_priority_and_expected_start_are_no_change_but_a_hold_is() -> None:
    listed = {"1": "1|PENDING|1|1|0M|UNLIMITED|X|N/A||5"}
    asked: list[set[str]] = []

    def fetch(ids: set[str]) -> list[Job]:
        asked.append(set(ids))
        return [_job(i, JobState.HELD) for i in ids]

    jobs = IncrementalJobs(lambda: "\n".join(listed.values()), fetch, lambda: [_job("1")], resync_every=10)
    jobs.jobs()
    listed["1"] = "1|PENDING|1|1|0M|UNLIMITED|X|2026-12-01T00:00:00||9"  # backfill's guess, age
    assert [j.state for j in jobs.jobs()] == [JobState.PENDING] and asked == []
    listed["1"] = "1|PENDING|1|1|0M|UNLIMITED|X|2026-12-01T00:00:00||0"  # held: priority 0
    assert [j.state for j in jobs.jobs()] == [JobState.HELD] and asked == [{"1"}]
