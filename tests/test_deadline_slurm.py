"""Deadlines on the real Slurm development cluster: job_submit.lua refuses a job whose x-factor
is over the X the agent publishes, fails open without a usable threshold file, and the agent's
deadline duty publishes X and acts on a running job predicted to miss."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.deadline import DeadlineKeeper
from agent.deadline_threshold import threshold_path
from agent.loop import Agent
from agent.status_cmd import collect
from devkit.devcluster import JOB_SUBMIT_LUA, DevCluster
from plugins.slurm.adapter import SlurmAdapter
from preemption.deadline.threshold_file import THRESHOLD_NAME, read_threshold, write_threshold
from tests.agent_steps import deadline_duty
from tests.services import wait_for
from vjob.config import parse
from vjob.errors import CommandError
from vjob.model import ClusterView, JobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(slurm_cluster: DevCluster) -> Iterator[DevCluster]:
    """The cluster running this checkout's job_submit.lua (Slurm rereads it when it changes);
    the threshold file removed before and after."""
    installed = slurm_cluster.etc / "job_submit.lua"
    if installed.read_text() != JOB_SUBMIT_LUA.read_text():
        installed.write_text(JOB_SUBMIT_LUA.read_text())
    threshold = slurm_cluster.etc / THRESHOLD_NAME
    threshold.unlink(missing_ok=True)
    yield slurm_cluster
    threshold.unlink(missing_ok=True)


@pytest.fixture
def jobs(slurm_adapter: SlurmAdapter) -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for job_id in ids:
        try:
            slurm_adapter.cancel(job_id)
        except CommandError:
            pass


def _sbatch(cluster: DevCluster, deadline: float, *args: str) -> subprocess.CompletedProcess[str]:
    script = f"#!/bin/sh\n#VJOB deadline={int(deadline)}\nsleep 600\n"
    return subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--job-name=vjobdl", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
    )


def _job_id(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_a_job_that_cannot_meet_its_deadline_is_refused_with_x_and_X(
    cluster: DevCluster, slurm_adapter: SlurmAdapter, jobs: list[str]
) -> None:
    now = time.time()
    write_threshold(cluster.etc / THRESHOLD_NAME, 0.2, 1.1, now)
    # 60 min × 1.1 = 66 min to run, 30 min left: x = (66 − 30) / 66 = 0.55 >= 0.2
    refused = _sbatch(cluster, now + 1800, "--time=60", "--begin=now+3600")
    assert refused.returncode != 0
    assert "vjob: refused: the job cannot be expected to meet its deadline: x = 0.55 >= X = 0.20" in refused.stderr
    assert "time limit 60 min x VM slowdown 1.10 = 66 min to run, deadline in 30 min" in refused.stderr
    # two hours left: x < 0, accepted, and the deadline reaches the adapter through the tag
    ok = _job_id(_sbatch(cluster, now + 7200, "--time=60", "--begin=now+3600"))
    jobs.append(ok)
    job = slurm_adapter.job(ok)
    assert job.deadline == int(now + 7200) and job.walltime == 3600


@pytest.mark.parametrize("content", ["missing", "corrupt", "stale", "future"])
def test_the_hook_accepts_everything_without_a_usable_threshold(
    cluster: DevCluster, jobs: list[str], content: str
) -> None:
    path = cluster.etc / THRESHOLD_NAME
    now = time.time()
    if content == "corrupt":
        path.write_bytes(b"x=banana slowdown=\xff at=yesterday\n")
    elif content == "stale":
        write_threshold(path, 0.0, 1.1, now - 3600)
    elif content == "future":
        write_threshold(path, 0.0, 1.1, now + 3600)
    assert read_threshold(path, now=now) is None  # the Python reader agrees
    jobs.append(_job_id(_sbatch(cluster, now + 60, "--time=60", "--begin=now+3600")))


def test_the_hook_takes_its_staleness_limit_from_the_file(cluster: DevCluster, jobs: list[str]) -> None:
    """The agent writes [deadline] stale_after_s into the file; the hook parses no config."""
    path = cluster.etc / THRESHOLD_NAME
    now = time.time()
    write_threshold(path, 0.0, 1.1, now - 3600, stale_after_s=7200)  # an hour old, stale after two: used
    refused = _sbatch(cluster, now + 60, "--time=60", "--begin=now+3600")
    assert refused.returncode != 0 and "X = 0.00" in refused.stderr
    write_threshold(path, 0.0, 1.1, now - 120, stale_after_s=60)  # two minutes old, stale after one: ignored
    jobs.append(_job_id(_sbatch(cluster, now + 60, "--time=60", "--begin=now+3600")))


def test_the_agent_publishes_X_and_cancels_a_running_job_predicted_to_miss(
    cluster: DevCluster, slurm_adapter: SlurmAdapter, jobs: list[str], tmp_path: Path
) -> None:
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "slurm": {"conf": str(cluster.conf)},
            "deadline": {"admission": "static", "static_x": 0.3, "action": "cancel", "stale_after_s": 1234},
        }
    )
    assert threshold_path(cfg, "slurm") == cluster.etc / THRESHOLD_NAME
    # no threshold yet: a job 10 min long with 3 min to its deadline is let in (fail open) and runs
    doomed = _job_id(_sbatch(cluster, time.time() + 180, "--time=10"))
    jobs.append(doomed)
    # 10 min with 7.5 min left: of unknown kind (the worst, io: 1.10) x = 0.32 >= 0.3, cancelled;
    # declared CPU-bound (1.02) x = 0.26, let run — the kind read from its comment
    typed = _job_id(_sbatch(cluster, time.time() + 450, "--time=10", "--comment=vjob:kind=cpu"))
    jobs.append(typed)
    for j in (doomed, typed):
        wait_for(lambda j=j: slurm_adapter.job(j).state is JobState.RUNNING, 30, f"job {j} running")
    keeper = DeadlineKeeper(cfg, "slurm")
    view = ClusterView(now=time.time(), jobs=tuple(slurm_adapter.jobs()))
    rows = {r.job_id: r for r in deadline_duty(keeper, view, slurm_adapter, act=True)}
    assert keeper.kinds[typed] == "cpu" and keeper.kinds[doomed] is None
    assert rows[typed].decision == "continue" and 0.2 < (rows[typed].x or 0) < 0.3
    published = read_threshold(cluster.etc / THRESHOLD_NAME, now=time.time())
    assert published is not None and published.x == pytest.approx(0.3) and published.slowdown > 1
    assert published.stale_after_s == 1234  # [deadline] stale_after_s, for the hooks
    assert rows[doomed].x is not None and rows[doomed].x > 0.3 and rows[doomed].decision == "cancel"
    wait_for(lambda: _gone_or(slurm_adapter, doomed, JobState.CANCELLED), 30, "the doomed job cancelled")
    # and the hook now refuses the same request from the published X
    again = _sbatch(cluster, time.time() + 180, "--time=10")
    assert again.returncode != 0 and "X = 0.30" in again.stderr
    shown = collect(cfg, "slurm")["deadline"]  # what `vjob status` shows
    assert shown["X"] == pytest.approx(0.3) and shown["jobs"][doomed]["x"] == pytest.approx(rows[doomed].x)
    assert shown["jobs"][doomed]["deadline"] == slurm_adapter.job(doomed).deadline


def _gone_or(adapter: SlurmAdapter, job_id: str, state: JobState) -> bool:
    try:
        return adapter.job(job_id).state is state
    except (CommandError, KeyError, LookupError):
        return True


def _filler(cluster: DevCluster, node: str) -> str:
    """A one-CPU job on `node`: the neighbour that slows a vjob beside it (the VO model)."""
    out = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--job-name=vjobfill", f"--nodelist={node}", "--time=10"],
        input="#!/bin/sh\nsleep 600\n",
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
    )
    return _job_id(out)


def test_with_action_checkpoint_the_agent_requeues_a_job_that_can_still_make_it(
    cluster: DevCluster, slurm_adapter: SlurmAdapter, jobs: list[str], tmp_path: Path
) -> None:
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "slurm": {"conf": str(cluster.conf)},
            "deadline": {
                "admission": "static",
                "static_x": 0.0,
                "x_min": 0.0,
                "action": "checkpoint",
                "checkpoint_s": 0,
            },
        }
    )
    # beside a neighbour on node1, 10 min at the VM slowdown (1.10 + 0.08) is 11.8 min for 11.5
    # min left: x > 0 = X; alone (1.10, 11 min) it would make it, so it is put back in the
    # queue instead of cancelled (no VM: requeued, it restarts)
    jobs.append(_filler(cluster, "node1"))
    job_id = _job_id(_sbatch(cluster, time.time() + 690, "--time=10", "--nodelist=node1"))
    jobs.append(job_id)
    wait_for(lambda: slurm_adapter.job(job_id).state is JobState.RUNNING, 30, "the job running")
    wait_for(lambda: slurm_adapter.job(jobs[0]).state is JobState.RUNNING, 30, "its neighbour running")
    keeper = DeadlineKeeper(cfg, "slurm")
    view = ClusterView(now=time.time(), jobs=tuple(slurm_adapter.jobs()))
    rows = {r.job_id: r for r in deadline_duty(keeper, view, slurm_adapter, act=True)}
    assert rows[job_id].decision == "checkpoint" and rows[job_id].x is not None and rows[job_id].x > 0
    wait_for(lambda: slurm_adapter.job_fields(job_id).get("Restarts", "0") != "0", 30, "the job requeued")
    assert slurm_adapter.job(job_id).state in (JobState.PENDING, JobState.RUNNING)
    assert keeper.parked == {}  # no VM saved: nothing held for a placement


def test_a_vjob_checkpointed_for_its_deadline_is_released_only_where_it_makes_it(
    cluster: DevCluster, slurm_adapter: SlurmAdapter, jobs: list[str], tmp_path: Path
) -> None:
    """Two vjobs (jobs with a pilot whose VM runs on their node) share node1 with a third job
    and are predicted to miss there: both are checkpointed as a preemption victim is (the
    switch journalled with a suspend of the VM, the pilot asked to save it, the job
    requeue-held). They run again only on a placement where x < X (the simulator's rule):
    after X moves down, the one that still makes it alone is released pinned to a free node —
    not left for Slurm to put back on node1 — and the one that no longer can is cancelled
    instead of released. The pilots are stand-ins answering through the pilot files (the real
    one needs a QEMU guest: tests/test_agent_e2e_slurm.py covers that path end to end for
    preemption)."""
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(cluster.conf)},
            # save-first, what the stand-in pilots below answer (the dev cluster's proctrack would
            # make "auto" pause-first: tests/test_realjob_slurm.py runs that with a real pilot)
            "agent": {"checkpoint_timeout_s": 60, "pause_first": False},
            "deadline": {
                "admission": "static",
                "static_x": 0.0,
                "x_min": 0.0,
                "action": "checkpoint",
                "checkpoint_s": 0,
            },
        }
    )
    Store(cfg.database_url).upgrade()
    jobs.append(_filler(cluster, "node1"))
    # three jobs on node1 (1.10 + 2 × 0.08 = 1.26): 10 min of work needs 12.6 min; alone 11 min
    now = time.time()
    keep = _job_id(_sbatch(cluster, now + 740, "--time=10", "--nodelist=node1"))  # alone x ≈ -0.12
    lose = _job_id(_sbatch(cluster, now + 690, "--time=10", "--nodelist=node1"))  # alone x ≈ -0.045
    jobs += [keep, lose]
    for j in jobs:
        wait_for(lambda j=j: slurm_adapter.job(j).state is JobState.RUNNING, 30, f"job {j} running")
    agent = Agent(cfg, slurm_adapter, rms="slurm")
    asked: dict[str, str] = {}
    stop = threading.Event()
    pilots = {j: _stand_in_pilot(agent, j, "node1") for j in (keep, lose)}

    def pilot() -> None:  # saves the VM when asked, as pilot.pilot does
        while not stop.wait(0.1) and len(asked) < len(pilots):
            for j, (pdir, running) in pilots.items():
                req = pdir.read_request()
                if j in asked or req is None or req.kind is not RequestKind.CHECKPOINT:
                    continue
                asked[j] = req.reason
                memory = pdir.path / "memory.save"
                memory.write_bytes(b"saved")
                pdir.write_state(
                    running.moved(
                        PilotState.SAVED,
                        request_id=req.request_id,
                        memory_path=str(memory),
                        saved_node="node1",
                        saved_nodes=["node1"],
                    )
                )

    thread = threading.Thread(target=pilot, daemon=True)
    thread.start()
    try:
        report = agent.tick()
    finally:
        stop.set()
        thread.join(10)
    assert sorted(report.checkpointed) == sorted([keep, lose]), report.errors
    assert asked[keep].startswith(f"deadline: job {keep} predicted to miss its deadline (x = ")
    (switch,) = [sw for sw in journal.recent(agent.ports.store()) if sw.reason.startswith(f"deadline: job {keep} ")]
    assert [(a.action, a.job_key, a.vm_name, a.state) for a in switch.actions] == [
        ("suspend", f"slurm:{keep}", pilots[keep][0].vm, "done")
    ]
    held = {"JobState": "PENDING", "Reason": "job_requeued_in_held_state"}
    for j in (keep, lose):
        wait_for(lambda j=j: {k: slurm_adapter.job_fields(j).get(k) for k in held} == held, 30, f"job {j} held")
        record = store_jobs.get(agent.ports.store(), "slurm", j)
        assert record is not None and record.preempted_since is not None
    # X moves down (as an adaptive X does after failures): alone, `keep` still makes it, `lose` not
    agent.deadline.x = -0.08
    again = agent.tick()
    assert again.checkpointed == [], again.errors  # not checkpointed a second time
    assert again.released == [keep], (again.released, again.errors)
    pinned = slurm_adapter.job_fields(keep).get("ReqNodeList", "")
    assert pinned and pinned != "node1" and pinned in {f"node{i}" for i in range(2, 9)}
    wait_for(lambda: _gone_or(slurm_adapter, lose, JobState.CANCELLED), 30, "the hopeless vjob cancelled")
    shown = json.loads((cfg.data_path / "deadline.json").read_text())["jobs"]
    assert shown[lose]["decision"] == "cancel" and shown[keep]["decision"] == "hold"


def _stand_in_pilot(agent: Agent, job_id: str, node: str) -> tuple[PilotDir, PilotStatus]:
    pdir = agent.ports.pilot_dir(job_id)
    pdir.ensure()
    running = PilotStatus(
        job_id=job_id,
        vm=pdir.vm,
        node=node,
        uri="test:///default",
        state=PilotState.RUNNING,
        since=time.time(),
        image="debian-tiny",
        memory_mb=64,
    )
    pdir.write_state(running)
    return pdir, running
