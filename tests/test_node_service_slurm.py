"""The node service's Slurm authority: recorded Slurm outputs of three JSON layouts, and the real
`vjob node-service` against the dev cluster with jobs of the ordinary user `vjobtest`.

Run the slurm-marked tests under `flock /tmp/vjob-devcluster.lock` (the cluster is shared).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm.job_grant import grant_of
from provisioning.node_service.grant import Grant
from tests.node_service_peer import Peer
from tests.services import wait_for
from tests.services.node_service import NodeServiceProcess, node_service  # noqa: F401
from vjob.errors import InputError

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"
USER = "vjobtest"
REPO = Path(__file__).resolve().parents[1]


def _doc(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text()))


def test_openapi_v0_0_37_indexed_allocation_gives_cpus_and_memory_per_node() -> None:
    grant = grant_of(_doc("rivos_squeue_out.json"), "26515966", "cs75", source="rivos")
    assert grant == Grant("slurm", "26515966", 1977600017, 1977700000, "bkd", "cs75", ("cs75",), 1, 64000)
    assert grant_of(_doc("rivos_squeue_out.json"), "26515966", "cs76", source="rivos") is None


def test_data_parser_v0_0_40_counts_allocated_cores_and_finds_array_tasks() -> None:
    doc = _doc("zocalo_slurmrestd_23.11_v0.0.40_jobs.json")
    by_id = grant_of(doc, "6080221", "cma2-02", source="zocalo")
    by_task = grant_of(doc, "6077609_41", "cma2-02", source="zocalo")
    assert by_id == Grant("slurm", "6080221", 37524, 37524, "acc", "cma2-02", ("cma2-02",), 1, 9000)
    assert by_task == dataclasses.replace(by_id, job="6077609_41"), "the array task asked for is the same job"


def test_finished_or_unknown_jobs_have_no_grant() -> None:
    doc = _doc("debian-22.05-squeue.json")  # Debian 22.05's squeue --json: every job COMPLETED
    assert grant_of(doc, "2", "node1", source="debian") is None
    assert grant_of(doc, "999999", "node1", source="debian") is None


def test_a_running_record_with_threads_per_core_scales_cores_to_cpus() -> None:
    doc = _doc("debian-22.05-squeue.json")
    job = dict(doc["jobs"][1])  # node[1-8], four cores each, 32 CPUs
    job.update(job_state="RUNNING", cpus=64, user_id=1001, group_id=1001, user_name="u")  # two threads per core
    grant = grant_of({**doc, "jobs": [job]}, "2", "node3", source="edited")
    assert grant is not None and (grant.cpus, grant.nodes[2]) == (8, "node3")


def test_a_malformed_record_is_an_input_error_naming_the_job() -> None:
    doc = _doc("debian-22.05-squeue.json")
    job = dict(doc["jobs"][0], job_state="RUNNING", user_id="root")
    with pytest.raises(InputError, match=r"job 1\.user_id = 'root': expected int"):
        grant_of({**doc, "jobs": [job]}, "1", "node1", source="edited")
    job = dict(doc["jobs"][0], job_state="RUNNING", job_resources=None)
    with pytest.raises(InputError, match="a running job without job_resources"):
        grant_of({**doc, "jobs": [job]}, "1", "node1", source="edited")


def test_data_parser_v0_0_41_allocation_list() -> None:
    """Shape of `job_resources.nodes.allocation` in Slurm's v0.0.41+ OpenAPI schema (written
    from the schema: no recorded output of 24.05 is at hand)."""
    doc = _doc("zocalo_slurmrestd_23.11_v0.0.40_jobs.json")
    doc["meta"] = {"plugin": {"data_parser": "data_parser/v0.0.41"}}
    job = next(j for j in doc["jobs"] if j.get("job_resources"))
    job = dict(job, nodes="n[1-2]")
    job["job_resources"] = {
        "nodes": {
            "count": 2,
            "allocation": [
                {"index": 0, "name": "n1", "cpus": {"count": 4, "used": 0}, "memory": {"allocated": 1024}},
                {"index": 1, "name": "n2", "cpus": {"count": 2, "used": 0}, "memory": {"allocated": 512}},
            ],
        }
    }
    grant = grant_of({**doc, "jobs": [job]}, "6080221", "n2", source="v0.0.41")
    assert grant is not None and (grant.cpus, grant.memory_mib, grant.nodes) == (2, 512, ("n1", "n2"))


# -- the real service against the dev cluster ----------------------------------------------------


def _user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True, timeout=30)
        return pwd.getpwnam(USER)


def _sbatch(cluster: DevCluster, *args: str) -> str:
    done = subprocess.run(
        ["runuser", "-u", USER, "--", "sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", *args],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _squeue(cluster: DevCluster, job: str) -> tuple[str, str]:
    done = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T %N"], env={**os.environ, **cluster.env}, capture_output=True, text=True
    )
    state, _, nodes = done.stdout.strip().partition(" ")
    return state, nodes


@pytest.fixture(scope="module")
def jobs(slurm_cluster: DevCluster) -> Iterator[dict[str, str]]:
    """A running job (-c2 --mem=300M) and a held one, both of `vjobtest`; cancelled at the end."""
    _user()
    made: list[str] = []
    try:
        made.append(_sbatch(slurm_cluster, "-N1", "-c2", "--mem=300M", "--wrap", "sleep 120"))
        made.append(_sbatch(slurm_cluster, "-N1", "-c1", "--hold", "--wrap", "sleep 120"))
        wait_for(lambda: _squeue(slurm_cluster, made[0])[0] == "RUNNING", 30, f"job {made[0]} running")
        yield {"running": made[0], "node": _squeue(slurm_cluster, made[0])[1], "held": made[1]}
    finally:
        subprocess.run(["scancel", *made], env={**os.environ, **slurm_cluster.env}, timeout=30)


def _hello(peer: Peer, job: str, node: str) -> dict[str, Any]:
    assert peer.ask("open").startswith("opened")
    line = json.dumps({"op": "hello", "job": job, "node": node})
    return dict(json.loads(peer.ask(f"send 0 {line}")))


@pytest.mark.slurm
def test_hello_answers_the_owner_with_what_slurm_allocated(
    node_service: NodeServiceProcess,  # noqa: F811
    jobs: dict[str, str],
) -> None:
    with Peer(USER, node_service.socket) as peer:
        answer = _hello(peer, jobs["running"], jobs["node"])
    uid = pwd.getpwnam(USER).pw_uid
    assert answer == {
        "ok": True,
        "rms": "slurm",
        "job": jobs["running"],
        "uid": uid,
        "gid": pwd.getpwnam(USER).pw_gid,
        "user": USER,
        "node": jobs["node"],
        "nodes": [jobs["node"]],
        "cpus": 2,
        "memory_mib": 300,
    }


@pytest.mark.slurm
def test_another_user_another_node_and_a_pending_job_are_refused(
    node_service: NodeServiceProcess,  # noqa: F811
    jobs: dict[str, str],
) -> None:
    job, node = jobs["running"], jobs["node"]
    nobody = pwd.getpwnam("nobody").pw_uid
    with Peer("nobody", node_service.socket) as peer:
        assert _hello(peer, job, node) == {
            "ok": False,
            "error": f"job '{job}' is not a job of uid {nobody} on node '{node}'",
        }
    other = next(n for n in node_service.names if n != node)
    with Peer(USER, node_service.socket) as peer:
        assert _hello(peer, job, other) == {"ok": False, "error": f"job '{job}' is not running on node '{other}'"}
    with Peer(USER, node_service.socket) as peer:
        held = jobs["held"]
        assert _hello(peer, held, node) == {"ok": False, "error": f"job '{held}' is not running on node '{node}'"}
    with Peer(USER, node_service.socket) as peer:
        assert "not served here" in _hello(peer, job, "node99")["error"]


@pytest.mark.slurm
def test_once_check_asks_the_cluster_and_lists_the_operations(node_service: NodeServiceProcess) -> None:  # noqa: F811
    done = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "node-service", "--once-check"],
        env={**os.environ, "VJOB_CONFIG": str(node_service.config_path)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rms"] == "slurm" and summary["rms_answers"] is True and "hello" in summary["operations"]
    assert summary["socket"] == str(node_service.socket) and summary["names"] == sorted(node_service.names)


def test_a_job_no_longer_running_is_owned_for_clean_up_only() -> None:
    """After a requeue's save Slurm lists the job as not running: `grant` refuses it (nothing may
    be made for it), `owned` (the clean-up operations' check) still names its owner, with no CPUs
    or memory on the node."""
    doc = _doc("debian-22.05-squeue.json")
    job = dict(doc["jobs"][0], job_state="PENDING", user_id=1001, group_id=1002, user_name="u", nodes="")
    doc = {**doc, "jobs": [job]}
    name = str(job["job_id"])
    assert grant_of(doc, name, "node1", source="t") is None
    owned = grant_of(doc, name, "node1", source="t", running=False)
    assert owned is not None
    assert (owned.uid, owned.gid, owned.cpus, owned.memory_mib, owned.nodes) == (1001, 1002, 0, 0, ())
