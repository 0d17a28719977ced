"""Signals, checkpoints and kills of best-effort jobs, seen over OAR's REST API, in real OAR 2.5.9.

Why on the real API: Saline tells a best-effort job OAR killed (resubmit it from its snapshot)
from one that finished (the vjob is done) or one its user deleted (the vjob is cancelled) only
from OAR's state and event log, and a site master in another site has nothing but the REST
API. Each job below is observed through the API (`OarRest`) and through `oarstat`
(`OarCommands`): both must show the same state and events, and `saline_bew.phases.decide`
must take the action Saline takes for it. The job is a shell script that writes down the
signals it receives, so a signal or checkpoint asked over the API is seen arriving.
"""

from __future__ import annotations

import os
import pwd
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from plugins.oar.client import OarCommands, OarRest, SubmitRequest
from plugins.oar.parse import OarJob
from saline_bew.phases import Action, Kind, Observed, decide
from tests.services import wait_for
from vjob.errors import CommandError

pytestmark = pytest.mark.oar

SCRIPT = """#!/bin/sh
out={out}/signals.$OAR_JOB_ID
trap 'echo HUP >> $out' HUP
trap 'echo USR2 >> $out' USR2
echo start >> $out
i=0
while [ $i -lt 600 ]; do sleep 1 & wait $!; i=$((i+1)); done
"""
CHECKPOINT_SIGNAL = 12  # SIGUSR2, what Saline's jobs give oarsub --signal
SERIES = 160
"""Requests in a row: one of the API's 3 FastCGI workers serves more than 51 of them."""


@dataclass
class Record:
    """A vjob's row as phases.decide reads it: running on its OAR job since `since`."""

    oar_job_id: str
    updated_at: float
    phase: str = "running"
    snapshot_at: float | None = None
    last_event_id: int = 0


class Timing:
    snapshot_period_s = 3600.0
    requeue_after_s = 3600.0


@pytest.fixture
def workdir(oar_cluster) -> Iterator[Path]:
    """A directory the job's user writes its signal log in, and the script it runs."""
    where = Path(tempfile.mkdtemp(prefix="vjob-oar-signals-", dir="/var/tmp"))
    user = pwd.getpwnam(oar_cluster.user)
    os.chown(where, user.pw_uid, user.pw_gid)
    script = where / "job.sh"
    script.write_text(SCRIPT.format(out=where))
    script.chmod(0o755)
    yield where
    for f in where.iterdir():
        f.unlink()
    where.rmdir()


def _until(what: str, probe: Callable[[], bool], timeout: float = 60) -> None:
    wait_for(probe, timeout, what, interval=0.5)


def _signals(where: Path, job: str) -> list[str]:
    log = where / f"signals.{job}"
    return log.read_text().split() if log.exists() else []


def _both(rest: OarRest, cmds: OarCommands, job: str, user: str) -> OarJob:
    """The job through the API, after checking oarstat shows the same state and events."""
    via_api = rest.job(job, user=user)
    via_oarstat = cmds.job(job)
    assert via_api is not None and via_oarstat is not None
    if via_api.state != via_oarstat.state or len(via_api.events) != len(via_oarstat.events):
        return _both(rest, cmds, job, user)  # OAR moved on between the two reads: read again
    assert [(e.event_id, e.type) for e in via_api.events] == [(e.event_id, e.type) for e in via_oarstat.events]
    assert via_api.killed_for_besteffort == via_oarstat.killed_for_besteffort
    return via_api


def _decided(job: OarJob, since: float, *, vms_finished: bool = False) -> Action:
    seen = Observed(oar_job=job, vms_finished=vms_finished, last_safe_point=since, last_deploy=since)
    return decide(Record(job.id, since), seen, now=time.time(), timing=Timing())


def test_signal_checkpoint_and_kill_of_besteffort_jobs_over_rest(oar_cluster, workdir: Path) -> None:
    user = oar_cluster.user
    rest = OarRest(oar_cluster.api_url, timeout_s=30)
    cmds = OarCommands(timeout_s=30)
    script = [str(workdir / "job.sh")]

    def besteffort(site: str, command: list[str], checkpoint_s: int = 0) -> str:
        req = SubmitRequest(
            command=command,
            walltime="0:10:00",
            types=("besteffort",),
            properties=oar_cluster.properties(site),
            checkpoint_s=checkpoint_s,
            signal=CHECKPOINT_SIGNAL if checkpoint_s else 0,
            directory=str(workdir),
        )
        return rest.submit(req, user=user)

    warned = besteffort("a", script, checkpoint_s=5)  # Saline's jobs: checkpoint signal, then the kill
    plain = besteffort("a", script)  # no warning: SIGKILL at once
    finished = besteffort("b", ["true"])
    deleted = besteffort("b", ["sleep", "300"])
    jobs = (warned, plain, finished, deleted)
    blocker = ""
    try:
        _until("the best-effort jobs running", lambda: all(_signals(workdir, j) for j in (warned, plain)))
        _until("sleep 300 running", lambda: rest.job(deleted, user=user).state == "Running")
        since = time.time()

        # A signal asked over the API and one through oardel -s both reach the job.
        rest.signal(warned, signal.SIGHUP, user=user)
        cmds.signal(plain, signal.SIGHUP, user=user)
        _until("SIGHUP delivered", lambda: "HUP" in _signals(workdir, warned) and "HUP" in _signals(workdir, plain))
        assert {"SIGNAL_1", "SIG_SUCCESS"} <= {e.type for e in _both(rest, cmds, warned, user).events}
        assert _decided(_both(rest, cmds, warned, user), since).kind is Kind.WAIT  # a signal is no checkpoint

        # OAR's API worker exits after 50 requests and the next one gets a 500 without being
        # run: the client asks again, so a long series of requests gets every answer.
        for _ in range(SERIES):
            assert rest.version()["oar_version"]
        assert rest.retried >= 1, "no worker restart was crossed: the series proves nothing"

        # A checkpoint asked over the API: the job gets its checkpoint signal, Saline evacuates.
        rest.checkpoint(warned, user=user)
        _until("checkpoint signal delivered", lambda: "USR2" in _signals(workdir, warned))
        seen = _both(rest, cmds, warned, user)
        assert seen.state == "Running" and seen.checkpoint_requested
        action = _decided(seen, since)
        assert action.kind is Kind.EVACUATE and action.event_id == max(e.event_id for e in seen.events)

        # The user's oardel: no kill event, the vjob is cancelled (not resubmitted).
        rest.delete(deleted, user=user)
        _until("deleted job over", lambda: rest.job(deleted, user=user).finished)
        seen = _both(rest, cmds, deleted, user)
        assert seen.state == "Error" and not seen.killed_for_besteffort
        assert _decided(seen, since).kind is Kind.CANCELLED_IN_OAR

        # A job whose command ended: Terminated, never a kill; with its VMs off the vjob is done.
        _until("true finished", lambda: rest.job(finished, user=user).finished)
        seen = _both(rest, cmds, finished, user)
        assert seen.state == "Terminated" and seen.exit_code == 0 and not seen.killed_for_besteffort
        assert _decided(seen, since, vms_finished=True).kind is Kind.COMPLETE

        # A normal job needs site a: OAR kills the plain job at once; the warned one gets the
        # checkpoint signal from OAR itself first and is killed when its 5 s run out.
        killed_at = time.time()
        normal = SubmitRequest(
            command=["sleep", "300"],
            resource=f"/resource_id={oar_cluster.resources_per_site}",
            walltime="0:10:00",
            properties=oar_cluster.properties("a"),
        )
        blocker = rest.submit(normal, user=user)
        for job in (plain, warned):
            _until(f"job {job} killed", lambda job=job: rest.job(job, user=user).finished, timeout=90)
            seen = _both(rest, cmds, job, user)
            assert seen.state == "Error" and seen.killed_for_besteffort, [e.type for e in seen.events]
            action = _decided(seen, since)
            assert action.kind is Kind.KILLED and action.cause == "besteffort_kill"
            assert killed_at - since - 1 <= action.lost_s <= time.time() - since + 1
        kinds = [e.type for e in _both(rest, cmds, warned, user).events]
        assert kinds.index("CHECKPOINT_TIMEOUT") < kinds.index("BESTEFFORT_KILL"), kinds
        _until("the normal job running", lambda: rest.job(blocker, user=user).state == "Running")
    finally:
        for job in (*jobs, blocker):
            if job:
                _delete(rest, job, user)


def _delete(rest: OarRest, job: str, user: str) -> None:
    """Clean-up: delete the job unless it is over (OAR refuses to delete a killed job)."""
    try:
        rest.delete(job, user=user)
    except CommandError as exc:
        if "already killed" not in str(exc) and "Terminated" not in str(exc) and "Error" not in str(exc):
            raise
