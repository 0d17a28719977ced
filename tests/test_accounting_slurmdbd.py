"""Issue 33 item 5 on the real dev cluster: slurmdbd (its own MariaDB) records every job, and the
node service's usage.start / usage.final write the VMs' usage into the job's AdminComment,
accumulated over two runs and read back with `sacct -j N -o AdminComment -P`.

The job's "VMs" are processes of the job's user named as its QEMU (tests/usage_burners.py): the
sampler reads the kernel's counters, so what it counts is what they burnt. The job's grant comes
from Slurm itself (plugins.slurm.job_grant), as in the running service."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm.accounting import SlurmUsageWriter
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.job_grant import SlurmJobAuthority
from provisioning.node_service import usage_ops
from provisioning.node_service.grant import Grant
from tests.node_service_peer import Peer
from tests.services import wait_for
from tests.services.node_service import NodeServiceProcess, node_service  # noqa: F401
from tests.usage_burners import PYTHON, burner, wait_burnt
from vjob import usage_record

pytestmark = pytest.mark.slurm


def _sbatch_as_nobody(cluster: DevCluster, script: str) -> str:
    """Submit `script` as nobody (a user with no Slurm association: none is enforced)."""
    done = subprocess.run(
        ["/usr/sbin/runuser", "-u", "nobody", "--", "sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp"],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
        check=True,
    )
    return done.stdout.strip().split(";")[0]


def _sacct(cluster: DevCluster, job: str, fields: str) -> list[str]:
    """`sacct -j job -n -P -o JobID,fields` as an operator types it: the job's own line (with
    -X, TotalCPU would be the allocation's alone, 0: the steps hold the CPU time)."""
    done = subprocess.run(
        ["sacct", "-j", job, "-n", "-P", "-o", f"JobID,{fields}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
        check=True,
    )
    rows = [line.split("|") for line in done.stdout.splitlines()]
    mine = [row[1:] for row in rows if row[0] == job]
    return mine[-1] if mine else []


def _seconds(elapsed: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm] in seconds."""
    days, _, clock = elapsed.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def test_the_cluster_runs_slurmdbd_and_mariadb(slurm_cluster: DevCluster) -> None:
    status = slurm_cluster.status()
    assert status["slurmdbd"] and status["mariadb"] and status["up"]
    conf = slurm_cluster.etc / "slurmdbd.conf"
    assert oct(conf.stat().st_mode & 0o777) == "0o600" and conf.owner() == "slurm"


def test_sacct_shows_a_finished_job(slurm_cluster: DevCluster) -> None:
    """Exit code, elapsed time and the CPU time of a job that burns 1 s of CPU and exits 3."""
    script = f"#!/bin/sh\n{PYTHON} -c 'import time\nwhile time.process_time() < 1.0: pass'\nexit 3\n"
    job = _sbatch_as_nobody(slurm_cluster, script)

    def recorded() -> bool:
        """The allocation's end and its batch step's figures have both reached slurmdbd."""
        done = subprocess.run(
            ["sacct", "-j", job, "-n", "-P", "-o", "JobID,State"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", **slurm_cluster.env},
        )
        return {f"{job}|FAILED", f"{job}.batch|FAILED"} <= set(done.stdout.split())

    wait_for(recorded, 60, f"job {job} and its batch step FAILED in sacct")
    state, exit_code, elapsed, total_cpu, user = _sacct(slurm_cluster, job, "State,ExitCode,Elapsed,TotalCPU,User")
    assert (state, exit_code, user) == ("FAILED", "3:0", "nobody")
    assert _seconds(elapsed) >= 1.0
    assert 0.9 <= _seconds(total_cpu) < 30


@pytest.fixture
def writer(slurm_adapter: SlurmAdapter) -> Iterator[SlurmUsageWriter]:
    """The node service composed as plugins.node_service_cmd composes it: Slurm's writer."""
    writer = SlurmUsageWriter(slurm_adapter)
    usage_ops.install_writer(writer)
    try:
        yield writer
    finally:
        usage_ops.install_writer(None)


def _run(grant: Grant, op: str) -> dict:
    return usage_ops.OPERATIONS[op].run(grant, {})


def test_admin_comment_accumulates_two_runs(
    slurm_cluster: DevCluster, slurm_adapter: SlurmAdapter, writer: SlurmUsageWriter
) -> None:
    """Two runs of a job's VMs (usage.start, a VM burning CPU, usage.final) add up in the job's
    AdminComment next to job_submit.lua's label; a third final after the job ended goes through
    slurmdbd (sacctmgr); sacct shows them all."""
    job = _sbatch_as_nobody(slurm_cluster, "#!/bin/sh\nsleep 300\n")
    try:
        authority = SlurmJobAuthority(slurm_adapter)
        wait_for(lambda: slurm_adapter.job(job).state.value == "running", 60, f"job {job} running")
        node = slurm_adapter.job(job).allocated_nodes[0]
        grant = authority.grant(job, node)
        assert grant is not None and grant.uid == 65534
        burnt = []
        for cpu in (1.0, 0.7):
            _run(grant, "usage.start")
            with burner(f"vjob-slurm-{job}", cpu_s=cpu, mib=32) as vm:
                wait_burnt(vm)
                answer = _run(grant, "usage.final")
            assert answer["written"] is True, answer
            burnt.append(answer["cpu_s"])
        live = slurm_adapter.job_fields(job)["AdminComment"]
        assert live.startswith("vjob:class=batch,os=")  # job_submit.lua's label kept
        mine = usage_record.parse(live)[node]
        assert mine.runs == 2 and mine.cpu_s >= 1.6 and mine.peak_mib >= 32
        assert abs(mine.cpu_s - sum(burnt)) < 0.02
    finally:
        slurm_adapter.cancel(job)
    wait_for(lambda: _sacct(slurm_cluster, job, "State")[:1] == ["CANCELLED by 0"], 60, f"job {job} ended in sacct")
    _run(grant, "usage.start")  # a last run whose end came after the job's (the slurmdbd path)
    with burner(f"vjob-slurm-{job}", cpu_s=0.3) as vm:
        wait_burnt(vm)
        assert _run(grant, "usage.final")["written"] is True
    deadline = time.monotonic() + 30
    while True:
        (comment,) = _sacct(slurm_cluster, job, "AdminComment")
        words = usage_record.parse(comment)
        if words.get(node, usage_record.Usage()).runs == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert comment.startswith("vjob:class=batch,os=")
    assert words[node].runs == 3 and words[node].cpu_s >= mine.cpu_s + 0.25


def test_the_node_service_measures_an_ordinary_users_vm(
    slurm_cluster: DevCluster,
    slurm_adapter: SlurmAdapter,
    node_service: NodeServiceProcess,  # noqa: F811
) -> None:
    """Through the real `vjob node-service`: nobody's pilot (a peer of uid 65534) marks its run's
    start and end; the service, as root, measures nobody's VM of that job and writes it."""
    job = _sbatch_as_nobody(slurm_cluster, "#!/bin/sh\nsleep 300\n")
    try:
        wait_for(lambda: slurm_adapter.job(job).state.value == "running", 60, f"job {job} running")
        node = slurm_adapter.job(job).allocated_nodes[0]
        with Peer("nobody", node_service.socket) as peer:
            assert peer.ask("open") == "opened 0"
            request = {"job": job, "node": node}
            started = json.loads(peer.ask("send 0 " + json.dumps({"op": "usage.start", **request})))
            assert started["ok"] and started["tracking"], started
            with burner(f"vjob-slurm-{job}", cpu_s=0.8) as vm:
                wait_burnt(vm)
                assert peer.ask("open") == "opened 1"
                final = json.loads(peer.ask("send 1 " + json.dumps({"op": "usage.final", **request})))
        assert final["ok"], final
        assert final["written"] and final["cpu_s"] >= 0.7, final.get("reason")
        mine = usage_record.parse(slurm_adapter.job_fields(job)["AdminComment"])[node]
        assert mine.runs == 1 and mine.cpu_s == final["cpu_s"]
    finally:
        slurm_adapter.cancel(job)
