"""An ended vjob (done, failed, cancelled) cleaned away: VMs, snapshots, identities, its lease.

Why apart from the loop (saline_bew.manager): the end is journalled first and cleaned on a
later pass, so an unreachable node or repository never keeps a vjob from ending; what the
cleanup removes (and what it keeps: a failed vjob's snapshot, for the operator) is here.
"""

from __future__ import annotations

import time

from sqlalchemy import update

from saline_bew import evacuation, identity, journal, lease, relocation
from saline_bew.events import EventKind, Phase
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from vjob.store.db import Store
from vjob.store.schema import JobRecord


def clean(ports: Ports, job: SalineJob) -> None:
    """Remove what the ended vjob left, journal `cleaned` and give its lease back."""
    left_open = relocation.open_request(journal.events(ports.store, job.key))
    if left_open is not None:  # ended while a dead manager's migration job was pending
        evacuation.abandon_request(ports, job, left_open)
    ports.free_nodes(job)
    keep = job.phase == Phase.FAILED  # a failed vjob's snapshot is kept for the operator
    if not keep:
        for site in ports.sites.values():
            site.repository.remove_job(job.key)
    identity.release(ports.store, job.key)
    ports.vms.work_path(job.key).unlink(missing_ok=True)  # the submitter's files, once the vjob is over
    _terminate(ports.store, job.key)
    ports.record(job.key, EventKind.CLEANED, {"snapshots_removed": not keep})
    lease.release(ports.store, job.key, ports.owner)


def _terminate(store: Store, key: str) -> None:
    """The vjob's row in the store's job table (the agent's view of every RMS) says it is over."""
    with store.session() as s:
        s.execute(
            update(JobRecord)
            .where(JobRecord.rms == journal.RMS, JobRecord.rms_job_id == key)
            .values(vjob_state="terminated", preempted_since=None, updated_at=time.time())
        )
