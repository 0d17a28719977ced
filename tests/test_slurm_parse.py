"""The Slurm adapter's readers on recorded real outputs (../shared/data/fixtures/slurm)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devkit.devcluster import Settings
from plugins.slurm import hostlist, parse_output
from plugins.slurm.images import parse_tag, read_image_list, requested_image, write_image_list
from plugins.slurm.states import Partition, duration_s, node_state, size_mb
from vjob.cli import main
from vjob.config import load
from vjob.errors import InputError, UsageError
from vjob.model import JobClass, JobState, NodeState

# Every fixture, the kind it holds, and how many entries it must yield.
FIXTURES = [
    ("debian-22.05-squeue.json", "jobs", 29),
    ("rivos_squeue_out.json", "jobs", 2),
    ("rivos_sinfo_out.json", "nodes", 4),
    ("irush_scontrol_show_job_multi.txt", "jobs", 9),
    ("ood_owens_scontrol_show_partitions.txt", "partitions", 15),
    ("rivos_squeue_fallback.txt", "jobs", 6),
    ("rivos_sinfo_fallback.txt", "nodes", 4),
    ("rivos_sinfo_dataparser_23.02.json", "nodes", 1),
    ("zocalo_slurmrestd_23.11_v0.0.40_jobs.json", "jobs", 1),
]


@pytest.fixture(scope="module")
def fixtures(shared_dir: Path) -> Path:
    return shared_dir / "data" / "fixtures" / "slurm"


def test_every_recorded_output_is_covered(fixtures: Path) -> None:
    # sprio's output is not a parse_output kind: tests/test_sprio_lines.py reads it
    read_elsewhere = ["sprio-22.05.txt"]
    files = sorted(p.name for p in fixtures.iterdir() if p.is_file())
    assert files == sorted([name for name, _, _ in FIXTURES] + read_elsewhere)
    # recordings of several steps, each read by its own test: test_slurm_incremental_transitions.py,
    # test_slurm_node_listing.py
    assert sorted(p.name for p in fixtures.iterdir() if p.is_dir()) == ["node-listing-22.05", "transitions-22.05"]


@pytest.mark.parametrize(("name", "kind", "count"), FIXTURES)
def test_fixture_parses(fixtures: Path, name: str, kind: str, count: int) -> None:
    items = parse_output(kind, (fixtures / name).read_text(), source=name)
    assert len(items) == count
    if kind == "jobs":
        assert all(j.rms == "slurm" and j.id for j in items)
        running = [j for j in items if j.state is JobState.RUNNING]
        assert running and all(j.allocated_nodes for j in running)
    if kind == "nodes":
        assert all(n.cpus >= 1 and n.memory_mb >= 1 for n in items)


def test_openapi_v0_0_38_fields(fixtures: Path) -> None:
    jobs = {j.id: j for j in parse_output("jobs", (fixtures / "debian-22.05-squeue.json").read_text(), source="f")}
    states = {s: sum(1 for j in jobs.values() if j.state is s) for s in JobState}
    assert states[JobState.RUNNING] == 8 and states[JobState.CANCELLED] == 8 and states[JobState.COMPLETED] == 6
    # `srun hostname` / `srun bash` without a batch script: Slurm's own notion of interactive
    interactive = sorted(j.id for j in jobs.values() if j.job_class is JobClass.INTERACTIVE)
    assert len(interactive) == 2
    running = next(j for j in jobs.values() if j.state is JobState.RUNNING)
    assert running.allocated_nodes and running.allocated_nodes[0].startswith("node")
    assert running.start_time is not None and running.end_time is None


def test_openapi_v0_0_37_and_its_wrapped_numbers(fixtures: Path) -> None:
    jobs = parse_output("jobs", (fixtures / "rivos_squeue_out.json").read_text(), source="f")
    first = jobs[0]
    assert (first.id, first.user, first.account, first.memory_mb) == ("26515966", "bkd", "account1", 64000)
    assert first.allocated_nodes == ("cs75",)
    assert first.walltime == 30240 * 60


def test_scontrol_show_job_multi(fixtures: Path) -> None:
    jobs = {
        j.id: j for j in parse_output("jobs", (fixtures / "irush_scontrol_show_job_multi.txt").read_text(), source="f")
    }
    first = jobs["1"]
    assert first.user == "user1" and first.account == "account1"
    assert first.allocated_nodes == ("node-63", "node-64", "node-65")
    # per node: 8 CPUs over 3 nodes need 3 cores each; MinMemoryCPU=500M x 3 cores
    assert (first.nodes, first.cores, first.memory_mb, first.walltime) == (3, 3, 1500, 86400.0)
    assert jobs["2398617"].state is JobState.COMPLETED  # an array task is its own job


def test_partitions(fixtures: Path) -> None:
    parts = {
        p.name: p
        for p in parse_output(
            "partitions", (fixtures / "ood_owens_scontrol_show_partitions.txt").read_text(), source="f"
        )
    }
    batch = parts["batch"]
    assert isinstance(batch, Partition)
    assert batch.default and batch.total_nodes == 810 and batch.max_time_s == 7 * 86400
    assert len(batch.nodes) == batch.total_nodes and batch.nodes[0] == "o0002"


def test_json_lines_skip_a_bad_line_but_keep_the_rest(fixtures: Path) -> None:
    text = (fixtures / "rivos_squeue_fallback.txt").read_text()
    jobs = parse_output("jobs", text, source="f")
    assert [j.id for j in jobs][:2] == ["26515966", "50580016"]
    assert "18805" not in {j.id for j in jobs}  # `"cpu": xx` is not JSON


def test_wrong_kind_and_garbage_are_named(fixtures: Path) -> None:
    with pytest.raises(InputError, match=r"squeue --json output, which holds jobs, not nodes"):
        parse_output("nodes", (fixtures / "debian-22.05-squeue.json").read_text(), source="x.json")
    with pytest.raises(InputError, match=r"g.txt: not a Slurm output"):
        parse_output("jobs", "hello world\n", source="g.txt")
    with pytest.raises(InputError, match=r"kind 'vms'"):
        parse_output("vms", "{}", source="g")
    with pytest.raises(InputError, match=r"no valid line"):
        parse_output("jobs", '{"id": xx}\n', source="g")


def test_unknown_json_layout_is_refused_with_the_way_out() -> None:
    doc = {"meta": {"plugin": {"data_parser": "data_parser/v0.0.43"}, "slurm": {"release": "25.05.1"}}, "jobs": []}
    with pytest.raises(InputError, match=r"data_parser/v0.0.43.*Slurm 25.05.1.*not supported.*--json=v0.0.42"):
        parse_output("jobs", json.dumps(doc), source="new.json")


def test_unknown_state_is_named() -> None:
    doc = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "jobs": [{"job_id": 7, "job_state": "DANCING"}]}
    with pytest.raises(InputError, match=r"job 7.*'DANCING'"):
        parse_output("jobs", json.dumps(doc), source="s.json")


def test_vjob_rms_parse_command(fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixtures / "rivos_sinfo_out.json"
    assert main(["rms", "parse", "--rms", "slurm", "--kind", "nodes", str(path)]) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert nodes[0]["name"] == "cs2.example.company.com" and nodes[0]["state"] == "mixed"
    assert main(["rms", "parse", "--rms", "slurm", "--kind", "jobs", str(path)]) == 2
    assert "holds nodes, not jobs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node[1-3]", ("node1", "node2", "node3")),
        ("o[0008-0010],cs25", ("o0008", "o0009", "o0010", "cs25")),
        ("r[1-2]-n[1-2]", ("r1-n1", "r1-n2", "r2-n1", "r2-n2")),
        ("(null)", ()),
    ],
)
def test_hostlist(text: str, expected: tuple[str, ...]) -> None:
    assert hostlist.expand(text) == expected


def test_hostlist_errors() -> None:
    with pytest.raises(InputError, match="unbalanced"):
        hostlist.expand("node[1-2")
    with pytest.raises(InputError, match="backwards"):
        hostlist.expand("node[5-2]")
    with pytest.raises(InputError, match=r"bad range '²'"):
        hostlist.expand("node[²]")  # str.isdigit() says yes, int() says no


def test_hostlist_counts_before_expanding() -> None:
    """`n[0-3000000]` took 4 s and 300 MB before its length was checked; now it is refused
    before a name is built. Measured in memory (tracemalloc's peak, deterministic), not time: a
    list of even the first 100,001 names would take several MB, the count alone a few kB."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"3000001 hosts, more than 100000"):
            hostlist.expand("n[0-3000000]")
        with pytest.raises(InputError, match=r"more than 100000"):
            hostlist.expand("r[0-999]-n[0-999]")  # 10^6 from two small ranges
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak} bytes allocated to refuse a host list"


def test_validators_refuse_a_trailing_newline() -> None:
    """`^...$` with re.match accepts 'x\n': every Slurm validator now uses fullmatch."""
    from plugins.slurm.commands import check_job_id
    from plugins.slurm.images import check_image_name

    for bad in ("123\n", "123\nscancel 1"):
        with pytest.raises(InputError, match="not a Slurm job id"):
            check_job_id(bad)
    with pytest.raises(InputError, match="must be 1-64 letters"):
        check_image_name("debian\n")
    assert requested_image("", "#!/bin/sh\n#VJOB os=alpine\n") == "alpine"
    with pytest.raises(InputError, match="not part of a node name"):
        hostlist.expand("node1\nnode2")


def test_values() -> None:
    assert duration_s("1-00:00:00", where="t") == 86400
    assert duration_s("30", where="t") == 1800
    assert duration_s("2-12", where="t") == 2 * 86400 + 12 * 3600
    assert duration_s("UNLIMITED", where="t") is None
    assert size_mb("62.50G", where="m") == 64000 and size_mb("4000M", where="m") == 4000
    assert node_state("IDLE+DRAIN", where="n") is NodeState.DRAINED
    assert node_state("idle*", where="n") is NodeState.DOWN
    assert node_state("mixed", where="n") is NodeState.MIXED


def test_os_request_convention(tmp_path: Path) -> None:
    assert requested_image("vjob:os=debian-tiny") == "debian-tiny"
    assert requested_image("", "#!/bin/bash\n#SBATCH -N1\n#VJOB os=alpine\nsleep 1\n#VJOB os=late\n") == "alpine"
    with pytest.raises(InputError, match=r"comment says 'a'.*script says 'b'"):
        requested_image("vjob:os=a", "#!/bin/sh\n#VJOB os=b\n")
    with pytest.raises(InputError, match="'bad/name'"):
        requested_image("vjob:os=bad/name")
    assert parse_tag("vjob:class=interactive,os=alpine old comment") == ("interactive", "alpine")
    path = tmp_path / "vjob-images.list"
    write_image_list(path, ["b", "a", "a"])
    assert read_image_list(path) == ["a", "b"] and path.stat().st_mode & 0o777 == 0o644
    with pytest.raises(InputError, match=r"'\.\./etc'"):
        write_image_list(path, ["../etc"])


def test_settings_are_checked() -> None:
    with pytest.raises(UsageError, match=r"--nodes 0: must be between 1 and 64"):
        Settings(run_dir=Path("/nonexistent"), nodes=0)
    with pytest.raises(UsageError, match=r"--memory-mb 64"):
        Settings(run_dir=Path("/nonexistent"), memory_mb=64)


@given(
    prefix=st.from_regex(r"[a-z]{1,6}", fullmatch=True),
    ranges=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), min_size=1, max_size=4),
    width=st.integers(1, 4),
)
def test_hostlist_expands_every_range(prefix: str, ranges: list[tuple[int, int]], width: int) -> None:
    parts = [f"{lo:0{width}d}-{lo + span:0{width}d}" if span else f"{lo:0{width}d}" for lo, span in ranges]
    names = hostlist.expand(f"{prefix}[{','.join(parts)}]")
    assert len(names) == sum(span + 1 for _, span in ranges)
    expected = [f"{prefix}{n:0{width}d}" for lo, span in ranges for n in range(lo, lo + span + 1)]
    assert list(names) == expected


def test_operator_example_configuration_loads() -> None:
    cfg = load(Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "vjob.toml.example")
    assert cfg.agent.rms == "slurm" and cfg.slurm.image_list.endswith("vjob-images.list")
