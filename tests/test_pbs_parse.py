"""Every recorded Torque, OpenPBS and Moab output parses, with counts and states checked
against the raw files (counted here independently, with regular expressions and the standard
library's parsers, not with the adapter's code)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from plugins.pbs import parse_jobs, parse_output
from plugins.pbs.convert import Conventions, duration_s, exec_hosts, parse_nodes_spec, size_mb
from vjob.errors import InputError
from vjob.model import JobClass, JobState, NodeState


@pytest.fixture(scope="module")
def fixtures(shared_dir: Path) -> Path:
    return shared_dir / "data" / "fixtures"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_fixture_file_is_covered(fixtures: Path) -> None:
    """A new recorded file must get its own count test below: this lists the known ones."""
    names = {
        p.relative_to(fixtures).as_posix() for d in ("torque", "openpbs", "moab") for p in (fixtures / d).iterdir()
    }
    assert names == {
        "torque/fyrd_qstat_x.xml",
        "torque/vsc_qstat_full.txt",
        "torque/qhost_pbsnodes_x_output_04.xml",
        "torque/vsc_pbsnodes_thinking.txt",
        "openpbs/metacentrum_pbspro19_qstat_xf_F_json.json",
        "moab/vsc_showq.txt",
        "moab/vsc_checknode.txt",
        "moab/vsc_checknode.xml",
        "moab/vsc_checknode_r24g05.txt",
    }


def test_torque_xml_jobs(fixtures: Path) -> None:
    path = fixtures / "torque" / "fyrd_qstat_x.xml"
    raw = _read(path)
    states = Counter(re.findall(r"<job_state>([A-Z])</job_state>", raw))
    jobs = parse_output("jobs", raw, source=str(path))
    assert len(jobs) == raw.count("<Job>") == 6
    got = Counter(j.state for j in jobs)
    assert got[JobState.RUNNING] == states["R"]
    assert got[JobState.PENDING] == states["Q"]
    assert sum(n for s, n in got.items() if s.finished) == states["C"]
    # The job in queue "interactive" (the site's convention) is interactive; no job has the attribute.
    assert "<interactive>" not in raw
    assert [j.id for j in jobs if j.job_class is JobClass.INTERACTIVE] == ["665199.superserver.stanford.edu"]
    running = next(j for j in jobs if j.state is JobState.RUNNING)
    assert running.allocated_nodes == ("node01",)
    assert running.memory_mb == 4096
    assert running.start_time == 1479339665.0 and running.submit_time == 1479339279.0
    pending = next(j for j in jobs if j.state is JobState.PENDING)
    assert pending.walltime == 23 * 3600 + 59 * 60 and pending.memory_mb == 32 * 1024 and pending.user == "robby"
    # An array's parent and its subjobs are all records; a finished job has an end time.
    assert {"673175[].superserver.stanford.edu", "673175[19].fruster.stanford.edu"} <= {j.id for j in jobs}
    assert all(j.end_time is not None for j in jobs if j.id.startswith("673175[1"))


def test_torque_xml_jobs_without_the_interactive_queue_convention(fixtures: Path) -> None:
    raw = _read(fixtures / "torque" / "fyrd_qstat_x.xml")
    jobs = parse_jobs(raw, source="x", conventions=Conventions(interactive_queues=()))
    assert all(j.job_class is JobClass.BATCH for j in jobs)


def test_torque_text_jobs_with_wrapped_lines(fixtures: Path) -> None:
    path = fixtures / "torque" / "vsc_qstat_full.txt"
    raw = _read(path)
    jobs = parse_output("jobs", raw, source=str(path))
    assert len(jobs) == len(re.findall(r"^Job Id: ", raw, re.M)) == 121
    states = Counter(re.findall(r"^\s+job_state = (\w)", raw, re.M))
    got = Counter(j.state for j in jobs)
    assert got[JobState.PENDING] == states["Q"] and got[JobState.RUNNING] == states["R"]
    assert sum(states.values()) == 121
    # `interactive = True` (qsub -I) marks exactly the jobs the raw file says.
    interactive = set()
    current = ""
    for line in raw.splitlines():
        if line.startswith("Job Id: "):
            current = line.split(": ", 1)[1]
        elif line.strip() == "interactive = True":
            interactive.add(current)
    assert len(interactive) == 5
    assert {j.id for j in jobs if j.job_class is JobClass.INTERACTIVE} == interactive
    by_id = {j.id: j for j in jobs}
    gpu = by_id["20033710.icts-p-svcs-1"]
    assert gpu.nodes == 2 and gpu.cores == 2 and gpu.allocated_nodes == ("r7i3n1",)
    assert gpu.account == "lp_phylogeo_inf_gpu" and gpu.walltime == 300 * 3600
    first = by_id["20025307.icts-p-svcs-1"]
    assert first.nodes == 20 and first.memory_mb == 20 * 1024  # pmem=1gb x 20 processes
    assert first.state is JobState.PENDING and first.start_time is None
    # Every running job has the nodes of its exec_host, every pending one none.
    assert all(j.allocated_nodes for j in jobs if j.state is JobState.RUNNING)
    assert not any(j.allocated_nodes for j in jobs if j.state is JobState.PENDING)


def test_wrapped_and_raw_newline_values_are_joined(fixtures: Path) -> None:
    from plugins.pbs.records import pbs_text_jobs

    records = {r["Job_Id"]: r for r in pbs_text_jobs(_read(fixtures / "torque" / "vsc_qstat_full.txt"), source="x")}
    assert records["20025307.icts-p-svcs-1"]["Error_Path"].endswith("/vsc30772/Tai/3/tai-3.e20025307")
    assert records["20033710.icts-p-svcs-1"]["submit_args"] == (
        "-I -A lp_phylogeo_inf_gpu -l partition=gpu,nodes=2:ppn=1:K20Xm,walltime=300:00:00"
    )
    comment = records["20034320.icts-p-svcs-1"]["comment"]
    assert comment.startswith("nodes unavailable") and comment.endswith("available)\n)")
    assert (
        records["20025307.icts-p-svcs-1"]["Variable_List"]["PBS_O_WORKDIR"]
        == "/vsc-mounts/leuven-user/307/vsc30772/Tai/3"
    )


def test_torque_xml_nodes(fixtures: Path) -> None:
    path = fixtures / "torque" / "qhost_pbsnodes_x_output_04.xml"
    raw = _read(path)
    states = Counter(re.findall(r"<state>([^<]*)</state>", raw))
    nodes = parse_output("nodes", raw, source=str(path))
    assert len(nodes) == raw.count("<Node>") == 64
    got = Counter(n.state for n in nodes)
    assert got[NodeState.ALLOCATED] == states["job-exclusive"] == 7
    assert got[NodeState.DRAINED] == states["offline"] == 3
    assert got[NodeState.IDLE] + got[NodeState.MIXED] == states["free"]
    with_jobs = len(re.findall(r"<state>free</state>(?:(?!</Node>).)*<jobs>[^<]+</jobs>", raw))
    assert got[NodeState.MIXED] == with_jobs
    assert [n.cpus for n in nodes] == [int(x) for x in re.findall(r"<np>(\d+)</np>", raw)]
    assert [n.memory_mb for n in nodes] == [round(int(x) / 1024) for x in re.findall(r"physmem=(\d+)kb", raw)]
    assert nodes[0].features == ("compute", "enc1")


def test_torque_text_nodes(fixtures: Path) -> None:
    path = fixtures / "torque" / "vsc_pbsnodes_thinking.txt"
    raw = _read(path)
    names = re.findall(r"^(\S+)\s*$", raw, re.M)
    states = Counter(re.findall(r"^\s+state = (\S+)", raw, re.M))
    nodes = parse_output("nodes", raw, source=str(path))
    assert [n.name for n in nodes] == names and len(names) == 149
    got = Counter(n.state for n in nodes)
    assert got[NodeState.DOWN] == states["down"] + states["down,offline"] == 4
    assert got[NodeState.ALLOCATED] == states["busy"] + states["job-exclusive"]
    assert got[NodeState.IDLE] + got[NodeState.MIXED] == states["free"]
    gpu = next(n for n in nodes if n.name == "r10n5")
    assert gpu.cpus == 20 and gpu.memory_mb == round(61651604 / 1024) and "K40c" in gpu.features
    down = next(n for n in nodes if n.name == "r11i00n04")
    assert down.state is NodeState.DOWN and down.memory_mb == 1  # no status from its pbs_mom


def test_openpbs_json_jobs(fixtures: Path) -> None:
    path = fixtures / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json"
    raw = _read(path)
    data = json.loads(raw)
    jobs = parse_output("jobs", raw, source=str(path))
    assert [j.id for j in jobs] == list(data["Jobs"])
    (job,) = jobs
    record = data["Jobs"][job.id]
    assert record["job_state"] == "R" and job.state is JobState.RUNNING
    assert job.nodes == record["Resource_List"]["nodect"] and job.cores == record["Resource_List"]["ncpus"]
    assert job.memory_mb == 8 * 1024 and job.walltime == 60
    assert job.allocated_nodes == ("charon24", "charon21") and job.user == "jan_brezina"
    assert job.start_time - job.submit_time == 13  # stime 21:23:33, qtime 21:23:20
    assert job.account == ""  # _pbs_project_default is no account


def test_moab_showq(fixtures: Path) -> None:
    path = fixtures / "moab" / "vsc_showq.txt"
    raw = _read(path)
    jobs = parse_output("jobs", raw, source=str(path))
    total = int(re.search(r"Total jobs:\s+(\d+)", raw).group(1))
    sections = {m.group(2): int(m.group(1)) for m in re.finditer(r"^(\d+) (active|eligible|blocked) jobs", raw, re.M)}
    assert len(jobs) == total == sum(sections.values()) == 128
    got = Counter(j.state for j in jobs)
    assert got[JobState.RUNNING] == sections["active"]
    assert got[JobState.PENDING] == sections["eligible"]
    assert got[JobState.HELD] == sections["blocked"] == raw.count("SystemHold")
    big = next(j for j in jobs if j.id == "20034236")
    assert big.cores == 160 and big.walltime == 3 * 86400 + 18 * 3600


def test_moab_checknode_text_and_xml_agree(fixtures: Path) -> None:
    (text,) = parse_output("nodes", _read(fixtures / "moab" / "vsc_checknode.txt"), source="t")
    (xml,) = parse_output("nodes", _read(fixtures / "moab" / "vsc_checknode.xml"), source="x")
    assert text.name == xml.name == "r1i1n1"
    assert text.state is xml.state is NodeState.ALLOCATED  # Busy
    assert text.cpus == xml.cpus == 20 and text.features == xml.features
    assert text.os_image == xml.os_image == "linux"
    assert abs(text.memory_mb - xml.memory_mb) / xml.memory_mb < 0.02  # 62G rounded vs 64386 MB
    (gpu,) = parse_output("nodes", _read(fixtures / "moab" / "vsc_checknode_r24g05.txt"), source="g")
    assert gpu.state is NodeState.MIXED and gpu.cpus == 36 and gpu.memory_mb == 751 * 1024  # Running


OPENPBS_NODES = {
    "timestamp": 1699630815,
    "pbs_version": "2022.1.1",
    "pbs_server": "pbs-01",
    "nodes": {
        "cn01": {
            "Mom": "cn01.example.org",
            "ntype": "PBS",
            "state": "free",
            "pcpus": 64,
            "current_aoe": "rocky9",
            "resources_available": {
                "aoe": "rocky9,centos7",
                "host": "cn01",
                "mem": "263507636kb",
                "ncpus": 64,
                "vnode": "cn01",
                "gpu_node": "True",
            },
            "resources_assigned": {"ncpus": 0},
        },
        "cn02": {
            "state": "job-busy",
            "pcpus": 64,
            "jobs": ["12.pbs-01/0", "12.pbs-01/1"],
            "resources_available": {"ncpus": 64, "mem": "256gb"},
        },
        "cn03": {"state": "down,offline", "pcpus": 32, "resources_available": {"ncpus": 32}},
    },
}


def test_openpbs_json_nodes_from_the_documented_layout() -> None:
    """No OpenPBS pbsnodes recording exists in shared/data: the layout here follows the
    OpenPBS reference guide (pbsnodes -av -F json); see docs/pbs.md."""
    nodes = {n.name: n for n in parse_output("nodes", json.dumps(OPENPBS_NODES), source="pbsnodes")}
    assert nodes["cn01"].os_image == "rocky9" and nodes["cn01"].state is NodeState.IDLE
    assert nodes["cn01"].memory_mb == round(263507636 / 1024) and nodes["cn01"].features == ("gpu_node",)
    assert nodes["cn02"].state is NodeState.ALLOCATED and nodes["cn02"].memory_mb == 256 * 1024
    assert nodes["cn03"].state is NodeState.DOWN and nodes["cn03"].cpus == 32


def test_openpbs_text_nodes() -> None:
    """`pbsnodes -av` text of OpenPBS (layout of its reference guide; no recording exists)."""
    text = (
        "cn01\n     Mom = cn01.example.org\n     ntype = PBS\n     state = free\n     pcpus = 32\n"
        "     jobs = 12.pbs-01/0\n     resources_available.arch = linux\n     resources_available.mem = 131072mb\n"
        "     resources_available.ncpus = 32\n     resources_available.bigmem = True\n     current_aoe = rocky9\n"
    )
    (node,) = parse_output("nodes", text, source="pbsnodes-av.txt")
    assert (node.name, node.cpus, node.memory_mb, node.os_image) == ("cn01", 32, 131072, "rocky9")
    assert node.state is NodeState.MIXED and node.features == ("bigmem",)


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (
            "jobs",
            "<Data><Job><Job_Id>1.s</Job_Id><job_state>Z</job_state><Job_Owner>u@h</Job_Owner></Job></Data>",
            "job_state = 'Z'",
        ),
        ("jobs", "<Data><Job><Job_Id>1.s</Job_Id>", "not valid Torque XML"),
        (
            "jobs",
            '{"Jobs": {"1.s": {"job_state": "R", "Job_Owner": "u@h", "Resource_List": {"mem": "lots"}}}}',
            "Resource_List.mem = 'lots'",
        ),
        ("jobs", "Job Id: 1.s\n    job_state = R\n  garbage here\n", "cannot read attribute line"),
        ("jobs", "hello world", "not a qstat"),
        ("nodes", "<Data><Job><Job_Id>1</Job_Id></Job></Data>", "use --kind jobs"),
        ("jobs", json.dumps(OPENPBS_NODES), "not job output"),
        ("nodes", "n1\n     state = exploded\n     np = 4\n", "state = 'exploded'"),
        ("nodes", "n1\n     state = free\n", "neither resources_available.ncpus nor pcpus"),
        (
            "jobs",
            "Job Id: 1.s\n    job_state = R\n    Job_Owner = u@h\n    Resource_List.nodes = 0:ppn=2\n",
            "node count and ppn must be in 1..",
        ),
    ],
)
def test_bad_output_names_source_and_field(kind: str, text: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)) as info:
        parse_output(kind, text, source="recorded.out")
    assert "recorded.out" in str(info.value)


def test_unknown_kind() -> None:
    with pytest.raises(InputError, match="kind = 'queues'"):
        parse_output("queues", "", source="x")


def test_empty_outputs_are_no_jobs() -> None:
    assert parse_output("jobs", "", source="x") == [] and parse_output("nodes", "<Data></Data>", source="x") == []


def test_helpers() -> None:
    assert size_mb("17592kb", where="x") == 17 and size_mb("4gb", where="x") == 4096 and size_mb("2w", where="x") == 0
    assert size_mb("1tb", where="x") == 1024 * 1024 and size_mb("1048576", where="x") == 1
    assert duration_s("335:34:49", where="x") == 335 * 3600 + 34 * 60 + 49 and duration_s("90", where="x") == 90
    assert exec_hosts("charon24/0*2+charon21/0*2") == ("charon24", "charon21")
    assert exec_hosts("r3i2n3/0+r3i2n3/1+r3i2n4/0") == ("r3i2n3", "r3i2n4")
    spec = parse_nodes_spec("2:ppn=20:ivybridge+node07:ppn=4:os_centos7", where="x")
    assert (spec.nodes, spec.cores) == (3, 44) and spec.properties == ("ivybridge", "node07", "os_centos7")
    with pytest.raises(InputError, match="duration"):
        duration_s("1:xx", where="Resource_List.walltime")


def test_os_and_class_from_tags_and_properties() -> None:
    text = (
        "Job Id: 7.s\n    job_state = Q\n    Job_Owner = ann@h\n    queue = batch\n"
        "    Resource_List.nodes = 2:ppn=4:os_centos7\n"
        "    Variable_List = PBS_O_HOME=/home/ann,VJOB_CLASS=besteffort\n\n"
        "Job Id: 8.s\n    job_state = Q\n    Job_Owner = bob@h\n    queue = batch\n"
        "    Variable_List = VJOB_OS=rocky9,VJOB_CLASS=batch,X=a\\,b\n"
    )
    text += "\nJob Id: 9.s\n    job_state = Q\n    Job_Owner = cy@h\n    Resource_List.select = 2:ncpus=4:aoe=rocky9\n"
    first, second, third = parse_output("jobs", text, source="x")
    assert third.os_image == "rocky9"
    assert first.os_image == "centos7" and first.job_class is JobClass.BATCH and first.cores == 8
    assert second.os_image == "rocky9" and second.job_class is JobClass.BATCH
    # An unknown VJOB_CLASS (a later `qalter -v`) no longer fails the whole qstat read either.
    (bad, _, _) = parse_output("jobs", text.replace("VJOB_CLASS=besteffort", "VJOB_CLASS=urgent"), source="x")
    assert bad.job_class is JobClass.BATCH
    # An ill-formed VJOB_OS is ignored, never passed on as an image name.
    (evil, _, _) = parse_output("jobs", text.replace("os_centos7", "x").replace("PBS_O", "VJOB_OS=../x,A"), source="x")
    assert evil.os_image == ""
    node_text = "n1\n     state = free\n     np = 4\n     properties = fast,os_rocky9\n"
    (node,) = parse_output("nodes", node_text, source="x")
    assert node.os_image == "rocky9" and node.state is NodeState.IDLE


_CLASS_JOB = "Job Id: 5.s\n    job_state = Q\n    Job_Owner = mal@h\n    queue = {queue}\n{extra}"


@pytest.mark.parametrize(
    ("queue", "extra", "expected"),
    [
        # the user's word, in every place a Torque or OpenPBS user can put it: ignored
        ("batch", "    Variable_List = VJOB_CLASS=interactive\n", JobClass.BATCH),  # -v, -V, qalter -v
        ("batch", "    Variable_List = PBS_O_HOME=/h,VJOB_CLASS=interactive,VJOB_OS=rocky9\n", JobClass.BATCH),
        ("batch", "    Variable_List = VJOB_CLASS=besteffort\n", JobClass.BATCH),
        ("batch", "    Job_Name = VJOB_CLASS=interactive\n", JobClass.BATCH),
        # what the server and the operator decide
        ("batch", "    interactive = True\n", JobClass.INTERACTIVE),  # qsub -I
        ("interactive", "", JobClass.INTERACTIVE),  # [pbs] interactive_queues
        ("scavenger", "    Variable_List = VJOB_CLASS=interactive\n", JobClass.BESTEFFORT),
    ],
)
def test_class_is_derived_never_claimed(queue: str, extra: str, expected: JobClass) -> None:
    """Issue 23 item 10: a batch job with `VJOB_CLASS=interactive` was seen as interactive."""
    conventions = Conventions(interactive_queues=("interactive",), besteffort_queues=("scavenger",))
    (job,) = parse_jobs(_CLASS_JOB.format(queue=queue, extra=extra), source="x", conventions=conventions)
    assert job.job_class is expected
    as_json = {"Jobs": {"5.s": {"job_state": "Q", "Job_Owner": "mal@h", "queue": queue}}}
    if "Variable_List" in extra:
        as_json["Jobs"]["5.s"]["Variable_List"] = {"VJOB_CLASS": "interactive"}
    if "interactive = True" in extra:
        as_json["Jobs"]["5.s"]["interactive"] = "True"
    (job,) = parse_jobs(json.dumps(as_json), source="x", conventions=conventions)
    assert job.job_class is expected


def test_vjob_rms_parse_cli(fixtures: Path) -> None:
    """The operator's debugging command prints the same jobs as JSON."""
    path = fixtures / "torque" / "vsc_qstat_full.txt"
    done = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "rms", "parse", "--rms", "pbs", "--kind", "jobs", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert len(printed) == 121 and sum(j["job_class"] == "interactive" for j in printed) == 5
    wrong = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "rms", "parse", "--rms", "pbs", "--kind", "nodes", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert wrong.returncode == 2 and "use --kind jobs" in wrong.stderr
