"""A manager that dies while OAR starts the job it asked for a live migration (issue 21).

Migrate before suspend asks OAR for a new best-effort job and waits for it to start; a manager
killed in that wait used to leave that job to run until its walltime, holding its nodes, and
its successor asked for yet another one. The request is journalled before oarsub and again
with its id before the wait, so the next manager (here: the same master restarted, which takes
its own leases back at once) takes the job over when the vjob must still move, and deletes it
otherwise. Also when the manager died between oarsub and the journal entry of the id: the job
is found by the vjob's name.

OAR is the stand-in REST API of tests/saline_env.py (a real HTTP server; the manager's real
client, parsing and store); the VMs run on libvirt's test driver with one vm_dir for both
nodes, so a live migration is possible, and the new job is on the vjob's own host (other
cores of the same node: no migration call, which the test driver could not do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.oar.client import SubmitRequest
from plugins.oar.parse import OarJob
from saline_bew import journal, relocation
from saline_bew.events import EventKind
from saline_bew.manager import Manager
from tests.saline_env import FakeOar, stand_in_manager
from vjob.model import VMState
from vjob.store.db import now

pytestmark = pytest.mark.libvirt
USER = "nobody"


class ManagerKilled(BaseException):
    """The manager process ends here (SIGKILL): nothing after this line of it runs."""


@pytest.fixture
def oar() -> Iterator[FakeOar]:
    with FakeOar() as fake:
        yield fake


@pytest.fixture
def manager(tmp_path: Path, test_nodes: dict[str, str], oar: FakeOar) -> Iterator[Manager]:
    with stand_in_manager(tmp_path, test_nodes, oar, vm_dir=str(tmp_path / "vms")) as m:
        yield m


def _running(oar: FakeOar, job_id: str, key: str, resource: int, events: list[dict[str, Any]] | None = None) -> None:
    """OAR runs job `job_id` on node n1 (resource `resource`)."""
    oar.jobs[job_id] = {
        "id": job_id,
        "name": key,
        "state": "Running",
        "owner": USER,
        "types": ["besteffort"],
        "events": events or [],
    }
    oar.jobs[f"{job_id}/resources"] = {"items": [{"id": resource, "network_address": "n1"}]}


def _warned_vjob(manager: Manager, oar: FakeOar) -> journal.SalineJob:
    """A one-VM vjob running on n1 in OAR job 101, then OAR's checkpoint warning for it."""
    job = manager.submit(user=USER, image="empty", command=["sleep", "600"], site="a")
    assert job.oar_job_id == "101"
    _running(oar, "101", job.key, 1)
    manager.step()
    job = journal.get(manager.ports.store, job.key)
    assert job.phase == "running" and job.hosts == ("n1",)
    warning = {"event_id": 9, "type": "CHECKPOINT", "date": now(), "description": "checkpoint"}
    _running(oar, "101", job.key, 1, [warning])
    return job


def _dies(manager: Manager, where: str) -> None:
    """The manager's pass over the warned vjob, killed `where`: right after oarsub answered
    ("after_oarsub", before the id reached the journal) or in the wait for the job's start."""
    client = manager.ports.sites["a"].client
    real_submit: Callable[..., str] = client.submit
    real_job: Callable[..., OarJob | None] = client.job

    def submit(request: SubmitRequest, *, user: str) -> str:
        new_id = real_submit(request, user=user)
        if where == "after_oarsub":
            raise ManagerKilled
        return new_id

    def job(job_id: str, *, user: str = "") -> OarJob | None:
        if where == "waiting" and job_id == "102":
            raise ManagerKilled
        return real_job(job_id, user=user)

    client.submit = submit  # type: ignore[method-assign]
    client.job = job  # type: ignore[method-assign]
    with pytest.raises(ManagerKilled):
        manager.step()
    client.submit = real_submit  # type: ignore[method-assign]
    client.job = real_job  # type: ignore[method-assign]


def _restarted(dead: Manager) -> Manager:
    """The site master started again: same owner name, so it takes its leases back at once."""
    return Manager(dead.ports.config, dead.ports.store, dead.ports.sites, dead.ports.vms, owner=dead.ports.owner)


@pytest.mark.parametrize("where", ["waiting", "after_oarsub"])
def test_a_left_migration_job_is_deleted_once_the_vjob_no_longer_moves(
    manager: Manager, oar: FakeOar, where: str
) -> None:
    """Died in the wait (or right after oarsub); meanwhile OAR killed the warned job. The next
    manager resubmits the vjob and deletes the job the dead one asked for."""
    job = _warned_vjob(manager, oar)
    _dies(manager, where)
    kinds = [e.kind for e in journal.events(manager.ports.store, job.key)]
    assert kinds[-1] == (EventKind.MIGRATION_REQUESTED if where == "waiting" else EventKind.MIGRATION_ASKING), kinds
    assert len(oar.submitted) == 2, "the vjob's job and the one asked for the migration"
    oar.details = [dict(oar.jobs["102"], name=job.key, owner=USER)]  # what OAR lists: job 102 waits
    oar.killed("101", USER)

    _restarted(manager).step()
    after = journal.get(manager.ports.store, job.key)
    events = journal.events(manager.ports.store, job.key)
    assert after.kills == 1 and after.oar_job_id == "103", [(e.kind, e.detail) for e in events]
    assert "/oarapi/jobs/102.json" in oar.deleted, f"the dead manager's job is left to run: {oar.deleted}"
    assert "/oarapi/jobs/103.json" not in oar.deleted, "the vjob's own new job was deleted"
    abandoned = next(e for e in events if e.kind == "migration_abandoned")
    assert abandoned.detail["deleted"] == ["102"]
    assert relocation.open_request(events) is None


def test_a_left_migration_job_is_taken_over_while_the_vjob_must_still_move(manager: Manager, oar: FakeOar) -> None:
    """Died in the wait; OAR then started the job it asked for. The restarted manager finds the
    warning still unanswered, moves the VM into that job (no second request), gives the warned
    job back, and nothing is suspended."""
    job = _warned_vjob(manager, oar)
    _dies(manager, "waiting")
    _running(oar, "102", job.key, 2)

    again = _restarted(manager)
    again.step()
    after = journal.get(manager.ports.store, job.key)
    events = journal.events(manager.ports.store, job.key)
    kinds = [e.kind for e in events]
    assert after.oar_job_id == "102" and after.phase == "running" and after.kills == 0, kinds
    assert len(oar.submitted) == 2, f"a new job was asked for instead of the one waiting: {oar.submitted[2:]}"
    assert "migration_taken_over" in kinds and "migrated" in kinds and "snapshot" not in kinds
    assert oar.deleted == ["/oarapi/jobs/101.json"], "the warned job is given back, the new one kept"
    assert again.ports.vms.driver.state(job.vm_names[0], "n1") is VMState.RUNNING
    assert relocation.open_request(events) is None
