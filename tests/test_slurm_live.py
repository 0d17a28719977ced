"""The Slurm adapter and job_submit.lua against the real development cluster (deploy/devcluster)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.act import REQUEUE_RESTART_MARGIN_S
from devkit.devcluster import DevCluster, Settings
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.images import read_image_list
from tests.services import wait_for
from vjob.errors import CommandError, InputError, UsageError
from vjob.model import JobClass, JobState, NodeState

pytestmark = pytest.mark.slurm

SLEEP = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def submit(slurm_adapter: SlurmAdapter) -> Iterator[Callable[..., str]]:
    """sbatch through the adapter; every job a test submits is cancelled after it."""
    ids: list[str] = []

    def _submit(*args: str, script: str = SLEEP) -> str:
        job_id = slurm_adapter.submit(["--job-name=vjobtest", "--output=/dev/null", *args], script)
        ids.append(job_id)
        return job_id

    yield _submit
    for job_id in ids:
        try:
            slurm_adapter.cancel(job_id)
        except CommandError:
            pass  # already finished and forgotten


def _state(adapter: SlurmAdapter, job_id: str) -> JobState:
    return adapter.job(job_id).state


def _wait_state(adapter: SlurmAdapter, job_id: str, state: JobState, timeout: float = 30) -> None:
    wait_for(lambda: _state(adapter, job_id) is state, timeout, f"job {job_id} {state.value}")


def _sbatch(cluster: DevCluster, *args: str, script: str = SLEEP) -> subprocess.CompletedProcess[str]:
    """sbatch as a user types it, to see exactly what the user sees."""
    return subprocess.run(
        ["sbatch", "--output=/dev/null", "--job-name=vjobtest", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
        check=False,
    )


def test_observes_the_live_cluster_in_json_and_text(
    slurm_adapter: SlurmAdapter, submit: Callable[..., str], slurm_cluster: DevCluster
) -> None:
    assert slurm_adapter.version() >= (20, 11) and slurm_adapter.uses_json
    nodes = slurm_adapter.nodes()
    assert sorted(n.name for n in nodes) == sorted(slurm_cluster.node_names())
    assert all(n.cpus == 4 and n.state in (NodeState.IDLE, NodeState.MIXED, NodeState.ALLOCATED) for n in nodes)
    running = submit("-N2", "--comment=vjob:os=debian-tiny")
    _wait_state(slurm_adapter, running, JobState.RUNNING)
    text = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf)), use_json=False)
    by_json = {j.id: j for j in slurm_adapter.jobs()}
    by_text = {j.id: j for j in text.jobs()}
    for job in (by_json[running], by_text[running]):
        assert job.state is JobState.RUNNING and len(job.allocated_nodes) == 2
        assert job.os_image == "debian-tiny" and job.job_class is JobClass.BATCH and job.nodes == 2
        assert (job.cores, job.memory_mb) == (1, 1024)  # per node: 1 CPU x DefMemPerCPU
    assert by_json[running].submit_time == by_text[running].submit_time
    assert sorted(n.name for n in text.nodes()) == sorted(n.name for n in nodes)
    # by change (plugins.slurm.node_listing): the JSON first, then sinfo's listing gives the same nodes
    by_change = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20), resync_every=30)
    assert by_change.node_listing is not None
    whole = by_change.nodes()
    listed = by_change.nodes()
    assert by_change.node_listing.last.full is False and by_change.node_listing.last.listed == len(whole)
    assert listed == whole == slurm_adapter.nodes()


def test_site_factor_decides_the_order(
    slurm_adapter: SlurmAdapter, submit: Callable[..., str], slurm_cluster: DevCluster
) -> None:
    everything = f"-N{len(slurm_cluster.node_names())}"
    blocker = submit(everything, "--exclusive")
    _wait_state(slurm_adapter, blocker, JobState.RUNNING)
    first, second = submit(everything, "--exclusive"), submit(everything, "--exclusive")
    slurm_adapter.set_priority(second, 5000)
    factors = slurm_adapter.priority_factors()
    assert factors[second]["site"] == 5000 and factors[first]["site"] == 0
    assert factors[second]["priority"] == factors[first]["priority"] + 5000  # multifactor stays live
    slurm_adapter.cancel(blocker)
    _wait_state(slurm_adapter, second, JobState.RUNNING)
    assert _state(slurm_adapter, first) is JobState.PENDING  # submitted first, yet it waits


def test_requeue_hold_then_release_restarts_the_job(slurm_adapter: SlurmAdapter, submit: Callable[..., str]) -> None:
    job = submit("-N1")
    _wait_state(slurm_adapter, job, JobState.RUNNING)
    slurm_adapter.requeue_hold(job)
    _wait_state(slurm_adapter, job, JobState.HELD)
    assert slurm_adapter.job_fields(job)["Restarts"] == "1"
    # A restart within the second of the requeue is killed by Slurm ("Job credential revoked"):
    # the agent waits REQUEUE_RESTART_MARGIN_S before forcing one; so does this test.
    time.sleep(REQUEUE_RESTART_MARGIN_S)
    slurm_adapter.release(job)

    def restarted() -> bool:
        if _state(slurm_adapter, job) is JobState.RUNNING:
            return True
        # Slurm resets the begin time when the old instance has finished leaving its node (slow
        # under load), overriding an earlier StartTime=now: ask again, as the agent does.
        slurm_adapter.start_now(job)
        return False

    wait_for(restarted, 40, f"job {job} running again", interval=1.0)


def test_require_nodes_pins_a_released_job_to_its_saved_nodes(
    slurm_adapter: SlurmAdapter, submit: Callable[..., str]
) -> None:
    job = submit("-N1", "--hold")
    _wait_state(slurm_adapter, job, JobState.HELD)
    idle = sorted(n.name for n in slurm_adapter.nodes() if n.state is NodeState.IDLE)
    target = idle[-1]  # not the first idle node, which Slurm would pick by itself
    slurm_adapter.require_nodes(job, [target])
    slurm_adapter.release(job)
    _wait_state(slurm_adapter, job, JobState.RUNNING)
    assert slurm_adapter.job(job).allocated_nodes == (target,)
    with pytest.raises(InputError, match="not Slurm node names"):
        slurm_adapter.require_nodes(job, ["n1;reboot"])


def test_hold_release_suspend_resume(slurm_adapter: SlurmAdapter, submit: Callable[..., str]) -> None:
    later = submit("-N1", "--begin=now+3600")
    slurm_adapter.hold(later)
    _wait_state(slurm_adapter, later, JobState.HELD)
    slurm_adapter.release(later)
    _wait_state(slurm_adapter, later, JobState.PENDING)
    job = submit("-N1")
    _wait_state(slurm_adapter, job, JobState.RUNNING)
    slurm_adapter.suspend(job)
    _wait_state(slurm_adapter, job, JobState.SUSPENDED)
    slurm_adapter.resume(job)
    _wait_state(slurm_adapter, job, JobState.RUNNING)


def test_errors_name_the_command_and_the_job(slurm_adapter: SlurmAdapter) -> None:
    with pytest.raises(CommandError, match=r"^scontrol \(job 99999999\): .*Invalid job id") as err:
        slurm_adapter.requeue_hold("99999999")
    assert err.value.job == "99999999"
    with pytest.raises(InputError, match=r"'1;reboot'"):
        slurm_adapter.hold("1;reboot")
    with pytest.raises(InputError, match=r"outside ±"):
        slurm_adapter.set_priority("1", 10**9)
    nowhere = SlurmAdapter(SlurmCommands(conf="/nonexistent/slurm.conf", timeout_s=2), use_json=True)
    with pytest.raises(CommandError, match=r"^squeue: (no answer within 2 s|.*exit status)"):
        nowhere.jobs()


def test_job_submit_tags_class_and_os(
    slurm_adapter: SlurmAdapter, submit: Callable[..., str], slurm_cluster: DevCluster
) -> None:
    image = read_image_list(slurm_cluster.image_list)[0]
    batch = submit("-N1", script=f"#!/bin/sh\n#SBATCH -N1\n#VJOB os={image}\nsleep 600\n")
    assert slurm_adapter.job_fields(batch)["AdminComment"].startswith(f"vjob:class=batch,os={image}")
    assert slurm_adapter.job(batch).os_image == image
    alloc = subprocess.run(
        ["salloc", "--no-shell", "-N1", "--job-name=vjobtest"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **slurm_cluster.env},
        check=False,
    )
    assert alloc.returncode == 0, alloc.stderr
    interactive = alloc.stderr.split("Granted job allocation")[1].split()[0]
    try:
        job = slurm_adapter.job(interactive)
        assert job.job_class is JobClass.INTERACTIVE
        assert slurm_adapter.job_fields(interactive)["AdminComment"].startswith("vjob:class=interactive,os=")
    finally:
        slurm_adapter.cancel(interactive)


def test_job_submit_refuses_bad_requests_clearly(slurm_cluster: DevCluster) -> None:
    unknown = _sbatch(slurm_cluster, "--comment=vjob:os=no-such-os")
    assert unknown.returncode != 0
    assert "vjob: unknown OS image 'no-such-os'; known images:" in unknown.stderr
    conflict = _sbatch(slurm_cluster, "--comment=vjob:os=a", script="#!/bin/sh\n#VJOB os=b\nsleep 1\n")
    assert conflict.returncode != 0 and "'a'" in conflict.stderr and "'b'" in conflict.stderr
    too_big = _sbatch(slurm_cluster, f"-N{len(slurm_cluster.node_names()) + 1}")
    assert too_big.returncode != 0
    assert f"asks for {len(slurm_cluster.node_names()) + 1} nodes but partition main has only" in too_big.stderr


def test_job_submit_fails_open_on_an_internal_error(
    slurm_cluster: DevCluster, slurm_adapter: SlurmAdapter, submit: Callable[..., str]
) -> None:
    """No list accepts any name; a directory in its place makes the Lua reader raise: the job passes."""
    listing = slurm_cluster.image_list
    aside = listing.with_name("vjob-images.list.aside")
    listing.rename(aside)
    try:
        time.sleep(2.5)  # the script caches the list for 2 s
        without_list = _sbatch(slurm_cluster, "--comment=vjob:os=any-name", "--begin=now+3600")
        assert without_list.returncode == 0, without_list.stderr
        slurm_adapter.cancel(without_list.stdout.split()[-1])
        listing.mkdir()
        time.sleep(2.5)
        accepted = _sbatch(slurm_cluster, "--comment=vjob:os=no-such-os", "--begin=now+3600")
        assert accepted.returncode == 0, accepted.stderr
        job = accepted.stdout.split()[-1]
        slurm_adapter.cancel(job)
        log = Path(slurm_cluster.root / "log" / "slurmctld.log").read_text(errors="replace")
        assert "vjob job_submit.lua: internal error, job accepted unchanged" in log
    finally:
        if listing.is_dir():
            listing.rmdir()
        aside.rename(listing)
    time.sleep(2.5)
    assert _sbatch(slurm_cluster, "--comment=vjob:os=no-such-os").returncode != 0  # back to normal


def test_devcluster_status_and_idempotent_up(slurm_cluster: DevCluster) -> None:
    status = slurm_cluster.status()
    assert status["up"] and status["munged"] and all(status["slurmd"].values())
    ctld = (slurm_cluster.run / "slurmctld.pid").read_text()
    again = slurm_cluster.up(Settings(run_dir=slurm_cluster.root, agent="no", libvirt=False))
    assert again["status"]["up"] and (slurm_cluster.run / "slurmctld.pid").read_text() == ctld
    proc = subprocess.run(
        [
            str(Path(__file__).resolve().parents[1] / "deploy" / "devcluster"),
            "--dir",
            str(slurm_cluster.root),
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and "cluster    UP" in proc.stdout


def test_a_second_cluster_refuses_to_start_on_taken_ports(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    other = DevCluster(tmp_path / "other")
    with pytest.raises(UsageError, match=rf"port {slurm_cluster.port} is taken by another Slurm controller"):
        other.up(Settings(run_dir=other.root, nodes=2, agent="no", libvirt=False, port=slurm_cluster.port))
    assert not list(other.run.glob("slurm*.pid"))
    other.down()  # stops only what it started: nothing, not the shared munged
    status = slurm_cluster.status()
    assert status["up"] and status["munged"]  # the running one is untouched
