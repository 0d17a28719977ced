"""The PBS adapter end to end against stand-in qstat/pbsnodes/qalter/... executables that
replay recorded real outputs and record their arguments (tests/pbs_standins.py): argument
construction, non-zero exits, garbage output, timeouts, missing commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plugins.pbs import PbsAdapter, make_adapter
from plugins.pbs.config import PbsConfig
from tests.pbs_standins import StandIns
from vjob.config import Config, parse
from vjob.errors import CommandError, InputError
from vjob.model import JobClass, JobState, NodeState


@pytest.fixture
def standins(tmp_path: Path) -> StandIns:
    return StandIns(tmp_path / "bin")


@pytest.fixture
def fixtures(shared_dir: Path) -> Path:
    return shared_dir / "data" / "fixtures"


def _adapter(standins: StandIns, timeout_s: float = 20.0, **pbs: object) -> PbsAdapter:
    return PbsAdapter(PbsConfig(bin_dir=str(standins.dir), **pbs), timeout_s=timeout_s)


def test_torque_xml_observation(standins: StandIns, fixtures: Path) -> None:
    standins.script("qstat", stdout_file=fixtures / "torque" / "fyrd_qstat_x.xml")
    standins.script("pbsnodes", stdout_file=fixtures / "torque" / "qhost_pbsnodes_x_output_04.xml")
    adapter = _adapter(standins, dialect="torque")
    jobs = adapter.jobs()
    # The 4 completed records (C) are history, not work: only the running and queued job remain.
    assert sorted((j.id, j.state) for j in jobs) == [
        ("665199.superserver.stanford.edu", JobState.RUNNING),
        ("667999.superserver.stanford.edu", JobState.PENDING),
    ]
    assert len(adapter.nodes()) == 64
    assert standins.calls() == [["qstat", "-x", "-t"], ["pbsnodes", "-x"]]


def test_torque_text_observation(standins: StandIns, fixtures: Path) -> None:
    standins.script("qstat", stdout_file=fixtures / "torque" / "vsc_qstat_full.txt")
    standins.script("pbsnodes", stdout_file=fixtures / "torque" / "vsc_pbsnodes_thinking.txt")
    adapter = _adapter(standins, dialect="torque", torque_format="text")
    jobs = adapter.jobs()
    assert len(jobs) == 121 and sum(j.job_class is JobClass.INTERACTIVE for j in jobs) == 5
    nodes = adapter.nodes()
    assert len(nodes) == 149 and sum(n.state is NodeState.DOWN for n in nodes) == 4
    assert standins.calls() == [["qstat", "-f", "-t"], ["pbsnodes", "-a"]]


def test_openpbs_observation(standins: StandIns, fixtures: Path, tmp_path: Path) -> None:
    from tests.test_pbs_parse import OPENPBS_NODES

    standins.script("qstat", stdout_file=fixtures / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json")
    nodes_file = tmp_path / "pbsnodes.json"
    nodes_file.write_text(__import__("json").dumps(OPENPBS_NODES))
    standins.script("pbsnodes", stdout_file=nodes_file)
    adapter = _adapter(standins)  # openpbs is the default dialect
    (job,) = adapter.jobs()
    assert job.state is JobState.RUNNING and job.allocated_nodes == ("charon24", "charon21")
    assert {n.name for n in adapter.nodes()} == {"cn01", "cn02", "cn03"}
    assert standins.calls() == [["qstat", "-f", "-F", "json", "-t"], ["pbsnodes", "-av", "-F", "json"]]


def test_an_array_is_its_subjobs(standins: StandIns, tmp_path: Path) -> None:
    """With -t PBS lists the array (state B: begun) and its subjobs; vjob counts the subjobs."""
    record = "Job Id: {id}\n    job_state = {state}\n    Job_Owner = ann@h\n    queue = workq\n"
    listing = tmp_path / "qstat.txt"
    listing.write_text(
        "\n".join(
            record.format(id=i, state=s)
            for i, s in [("5[].pbs-01", "B"), ("5[1].pbs-01", "R"), ("5[2].pbs-01", "Q"), ("6[].pbs-01", "Q")]
        )
    )
    standins.script("qstat", stdout_file=listing)
    jobs = _adapter(standins, dialect="torque", torque_format="text").jobs()
    # 6[] has no subjob listed (not started yet on Torque): the parent stands for the array.
    assert [j.id for j in jobs] == ["5[1].pbs-01", "5[2].pbs-01", "6[].pbs-01"]


def test_actions_build_argument_lists(standins: StandIns, tmp_path: Path) -> None:
    adapter = _adapter(standins)
    adapter.set_priority("12.pbs-01", 1023)
    adapter.set_priority("12.pbs-01", -1024)
    adapter.hold("13.pbs-01")
    adapter.release("13.pbs-01")
    adapter.requeue_hold("14.pbs-01")
    adapter.suspend("673175[19].fruster.stanford.edu")
    adapter.resume("673175[19].fruster.stanford.edu")
    adapter.rerun("15")
    assert standins.calls() == [
        ["qalter", "-p", "1023", "12.pbs-01"],
        ["qalter", "-p", "-1024", "12.pbs-01"],
        ["qhold", "-h", "u", "13.pbs-01"],
        ["qrls", "-h", "u", "13.pbs-01"],
        ["qhold", "-h", "u", "14.pbs-01"],  # hold before the requeue: never restarted in between
        ["qrerun", "14.pbs-01"],
        ["qsig", "-s", "suspend", "673175[19].fruster.stanford.edu"],
        ["qsig", "-s", "resume", "673175[19].fruster.stanford.edu"],
        ["qrerun", "15"],
    ]


def test_submit_returns_the_new_job_id(standins: StandIns, tmp_path: Path) -> None:
    script = tmp_path / "job; rm -rf ~.sh"
    script.write_text("#!/bin/sh\nsleep 1\n")
    standins.script("qsub", stdout="4242.pbs-01\n")
    adapter = _adapter(standins)
    assert adapter.submit(script, options=["-N", "name with spaces;$(x)", "-I"]) == "4242.pbs-01"
    assert standins.calls() == [["qsub", "-N", "name with spaces;$(x)", "-I", str(script)]]
    standins.script("qsub", stdout="qsub: you have been naughty\n")
    with pytest.raises(CommandError, match="instead of a job id"):
        adapter.submit(script)
    with pytest.raises(InputError, match="not a file"):
        adapter.submit(tmp_path / "missing.sh")


@pytest.mark.parametrize("value", [1024, -1025, 3.5, True, "7"])
def test_priority_outside_the_pbs_range_is_refused_before_any_command(standins: StandIns, value: object) -> None:
    with pytest.raises(InputError, match=r"priority = .*-1024\.\.1023"):
        _adapter(standins).set_priority("12.pbs-01", value)  # type: ignore[arg-type]
    assert standins.calls() == []


@pytest.mark.parametrize(
    "job_id", ["-p", "12; rm -rf /", "12.pbs-01 -x", "$(reboot)", "", "12\n13", "12\n", "../12", "١٢"]
)
def test_hostile_job_ids_never_reach_a_command(standins: StandIns, job_id: str) -> None:
    adapter = _adapter(standins)
    for action in (adapter.hold, adapter.release, adapter.requeue_hold, adapter.suspend, adapter.resume):
        with pytest.raises(InputError, match="not a PBS job id"):
            action(job_id)
    with pytest.raises(InputError, match="not a PBS job id"):
        adapter.set_priority(job_id, 0)
    assert standins.calls() == []


def test_non_zero_exit_names_command_job_and_message(standins: StandIns) -> None:
    standins.script("qalter", exit=153, stderr="qalter: Unknown Job Id Error 99.pbs-01\n")
    with pytest.raises(CommandError) as info:
        _adapter(standins).set_priority("99.pbs-01", 5)
    text = str(info.value)
    assert text.startswith(str(standins.dir / "qalter")) and "(job 99.pbs-01)" in text
    assert "exit status 153" in text and "Unknown Job Id Error 99.pbs-01" in text
    assert info.value.job == "99.pbs-01" and info.value.command[1:] == ["-p", "5", "99.pbs-01"]


def test_requeue_hold_stops_when_the_hold_fails(standins: StandIns) -> None:
    standins.script("qhold", exit=168, stderr="qhold: Request invalid for state of job 5.s\n")
    with pytest.raises(CommandError, match="Request invalid"):
        _adapter(standins).requeue_hold("5.s")
    assert [c[0] for c in standins.calls()] == ["qhold"]  # never requeued without its hold


def test_requeue_hold_takes_the_hold_back_when_the_job_cannot_be_requeued(standins: StandIns) -> None:
    standins.script("qrerun", exit=1, stderr="qrerun: Request invalid for state of job 20033710.icts-p-svcs-1\n")
    with pytest.raises(CommandError, match=r"qrerun \(job 20033710.icts-p-svcs-1\): exit status 1: qrerun: Request"):
        _adapter(standins).requeue_hold("20033710.icts-p-svcs-1")
    assert standins.calls() == [
        ["qhold", "-h", "u", "20033710.icts-p-svcs-1"],
        ["qrerun", "20033710.icts-p-svcs-1"],
        ["qrls", "-h", "u", "20033710.icts-p-svcs-1"],
    ]


@pytest.mark.parametrize(
    ("dialect", "garbage"),
    [
        ("openpbs", "Segmentation fault (core dumped)\n"),
        ("openpbs", '{"Jobs": {"1.s": {"job_state": "R"'),
        ("torque", "<Data><Job><Job_Id>1</Job_Id><job_state>R</job_state></Job></Data>"),
        ("torque", "\x00\x01\x02binary"),
    ],
)
def test_garbage_output_is_a_command_error(standins: StandIns, dialect: str, garbage: str) -> None:
    standins.script("qstat", stdout=garbage)
    with pytest.raises(CommandError, match="printed output vjob cannot read") as info:
        _adapter(standins, dialect=dialect).jobs()
    assert info.value.command[0] == "qstat"


def test_a_hanging_command_is_killed_and_reported(standins: StandIns) -> None:
    standins.script("pbsnodes", sleep=30)
    with pytest.raises(CommandError, match=r"no answer within 0\.5 s; killed") as info:
        _adapter(standins, timeout_s=0.5).nodes()
    assert info.value.command[1:] == ["-av", "-F", "json"]


def test_missing_command(tmp_path: Path) -> None:
    adapter = PbsAdapter(PbsConfig(bin_dir=str(tmp_path)), timeout_s=5)
    with pytest.raises(CommandError, match="command not found: set \\[pbs\\] bin_dir or PATH"):
        adapter.hold("1.s")


def test_commands_found_on_path(standins: StandIns, fixtures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no bin_dir the adapter runs whatever `qstat` is first on PATH."""
    monkeypatch.setenv("PATH", f"{standins.dir}{os.pathsep}{os.environ['PATH']}")
    standins.script("qstat", stdout_file=fixtures / "torque" / "fyrd_qstat_x.xml")
    assert len(PbsAdapter(PbsConfig(dialect="torque")).jobs()) == 2
    assert standins.calls() == [["qstat", "-x", "-t"]]


def test_make_adapter_takes_the_whole_configuration(standins: StandIns) -> None:
    cfg = parse({"pbs": {"dialect": "torque", "bin_dir": str(standins.dir)}, "agent": {"command_timeout_s": 7}})
    adapter = make_adapter(cfg)
    assert adapter.name == "pbs" and adapter.timeout_s == 7 and adapter.config.dialect == "torque"
    assert make_adapter(PbsConfig()).config.dialect == "openpbs"
    assert isinstance(make_adapter(Config()), PbsAdapter)


def test_the_shipped_example_configuration() -> None:
    """deploy/pbs/vjob.toml is valid, and gives the adapter the dialect and timeout it says."""
    from vjob.config import load

    cfg = load(Path(__file__).resolve().parents[1] / "deploy" / "pbs" / "vjob.toml")
    adapter = make_adapter(cfg)
    assert cfg.agent.rms == "pbs" and adapter.config.dialect == "openpbs" and adapter.timeout_s == 30
    assert adapter.job_command() == ["qstat", "-f", "-F", "json", "-t"]
