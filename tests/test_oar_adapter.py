"""The OAR adapter: the recorded fixture, bad input, and a real OAR through commands and REST."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import plugins.oar as oar
from plugins.oar.client import OarCommands, OarRest, SubmitRequest
from plugins.oar.parse import OarJob
from tests.services import free_port
from vjob.errors import CommandError, InputError
from vjob.model import JobClass, JobState, NodeState


def _fixture_text(shared_dir: Path) -> str:
    return (shared_dir / "data" / "fixtures" / "oar" / "oartui_oarstat_array_u_J_f.json").read_text()


def test_recorded_oarstat_parses(shared_dir: Path) -> None:
    jobs = oar.parse_output("jobs", _fixture_text(shared_dir), source="fixture")
    assert len(jobs) == 5
    by_id = {j.id: j for j in jobs}
    assert by_id["13056638"].state is JobState.PENDING
    assert by_id["13056638"].start_time is None  # a waiting job's startTime is only the plan
    running = by_id["13056639"]
    assert running.state is JobState.RUNNING
    assert running.job_class is JobClass.BESTEFFORT
    assert running.allocated_nodes == ("jefgpu48.rorg.fr",)
    assert running.walltime == 259200
    assert running.cores == 26


def test_recorded_events_are_kept(shared_dir: Path) -> None:
    from plugins.oar.parse import parse_jobs

    jobs = {j.id: j for j in parse_jobs(_fixture_text(shared_dir), source="fixture")}
    assert [e.type for e in jobs["13056639"].events] == ["FRAG_JOB_REQUEST"]
    assert not jobs["13056639"].killed_for_besteffort


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(InputError, match="job 7: state = 'Flying'"):
        oar.parse_output("jobs", '{"7": {"state": "Flying", "job_user": "u"}}', source="x")
    with pytest.raises(InputError, match="x: not valid JSON"):
        oar.parse_output("jobs", "{oops", source="x")
    with pytest.raises(InputError, match="kind = 'vms'"):
        oar.parse_output("vms", "{}", source="x")
    assert oar.parse_output("jobs", "", source="x") == []  # oarstat prints 0 bytes for no jobs


def test_submit_request_refuses_shell_words() -> None:
    with pytest.raises(InputError, match=r"command\[1\] = 'a;rm'"):
        SubmitRequest(command=["echo", "a;rm"])
    with pytest.raises(InputError, match="type = 'evil'"):
        SubmitRequest(command=["true"], types=("evil",))
    req = SubmitRequest(
        command=["sleep", "5"], types=("besteffort",), checkpoint_s=30, signal=12, properties="site='a'"
    )
    assert req.oarsub_args() == [
        "-l",
        "/resource_id=1,walltime=1:00:00",
        "-t",
        "besteffort",
        "-p",
        "site='a'",
        "--checkpoint",
        "30",
        "--signal",
        "12",
        "sleep 5",
    ]


def test_unreachable_api_is_a_clear_error() -> None:
    client = OarRest(f"http://127.0.0.1:{free_port()}/oarapi", timeout_s=2)
    with pytest.raises(CommandError, match="OAR API unreachable"):
        client.submit(SubmitRequest(command=["true"]), user="nobody")


def _wait_state(client: oar.OarClient, job_id: str, user: str, states: set[str], timeout: float = 90) -> OarJob:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = client.job(job_id, user=user)
        if job is not None and job.state in states:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s (last: {job and job.state})")


@pytest.mark.oar
def test_real_oar_commands_and_rest(oar_cluster) -> None:
    cli = OarCommands(timeout_s=30)
    rest = OarRest(oar_cluster.api_url)
    assert rest.version()["oar_version"].startswith("2.5")
    nodes = {n.name: n for n in oar.OarAdapter(cli).nodes()}
    assert {nodes["localhost"].site, nodes["127.0.0.1"].site} == {"a", "b"}
    user = oar_cluster.user
    quick = SubmitRequest(command=["sleep", "1"], walltime="0:05:00", properties=oar_cluster.properties("b"))
    via_cli = cli.submit(quick, user=user)
    done = _wait_state(cli, via_cli, user, {"Terminated", "Error"})
    assert done.state == "Terminated" and done.hosts == ("127.0.0.1",)
    assert cli.job("999999", user=user) is None

    # The REST API sees the same job as the commands, hosts and all, and can delete it.
    slow = SubmitRequest(command=["sleep", "60"], walltime="0:05:00", properties=oar_cluster.properties("b"))
    via_rest = rest.submit(slow, user=user)
    running = _wait_state(rest, via_rest, user, {"Running"})
    assert running.hosts == ("127.0.0.1",) and len(running.resources) == 1
    assert via_rest in {j.id for j in rest.jobs()}
    assert cli.job(via_rest, user=user).resources == running.resources
    busy = {n.name: n.state for n in oar.OarAdapter(rest).nodes()}
    assert busy["127.0.0.1"] is NodeState.MIXED and busy["localhost"] is NodeState.IDLE
    rest.delete(via_rest, user=user)
    gone = _wait_state(cli, via_rest, user, {"Error", "Terminated"})
    assert gone.state == "Error" and not gone.killed_for_besteffort  # a user's delete is not a kill


# Two resources as OAR 2.5.9's `oarnodes -J` printed them on the test cluster (fields trimmed).
OARNODES = """{
   "3" : {"state" : "Alive", "network_address" : "127.0.0.1", "resource_id" : 3, "site" : "b", "core" : 3},
   "4" : {"state" : "Suspected", "network_address" : "127.0.0.1", "resource_id" : 4, "site" : "b", "core" : 4},
   "1" : {"state" : "Alive", "network_address" : "localhost", "resource_id" : 1, "site" : "a", "core" : 1}
}"""


def test_oarnodes_output_becomes_nodes_per_host() -> None:
    nodes = {n.name: n for n in oar.parse_output("nodes", OARNODES, source="oarnodes")}
    assert nodes["127.0.0.1"].cpus == 2 and nodes["127.0.0.1"].site == "b"
    assert nodes["localhost"].state is NodeState.IDLE
    with pytest.raises(InputError, match="resource #0: expected an object with 'network_address' and 'state'"):
        oar.parse_output("nodes", '{"1": {"state": "Alive"}}', source="oarnodes")
