"""The agent's act step that tells a held-back interactive user why their job waits.

Why a step of its own: the pass (`tick.decide`) says why each interactive job it does not start
waits (`Decision.waits`, preemption.scheduling.waiting); the user sees only PENDING unless
vjob writes that reason where they look. The adapter knows the field (`abilities.wait_field`:
Slurm AdminComment, PBS comment) and edits only vjob's group in it (`tell_wait`, through
vjob.record_text). This step decides when to write: only when a job's reason changed since the
agent last wrote it, so a steady queue costs no RMS call per tick; and it removes the reason
once the job is no longer held back (it starts, or the pass will start it). It also leaves
the reasons in `<data_dir>/waiting.json` for `vjob status`, which must answer without the RMS.

A failed write is logged and counted, and tried again next tick (the agent did not record it
as told). A job that left the RMS is forgotten without a write.

The field has other writers that replace it whole: an operator's `scontrol update
AdminComment=...`, and the node service adding a vjob's usage words (which reads, edits and
writes like vjob does, so two writes racing within milliseconds can drop the other's edit;
plugins.slurm.accounting checks its own and retries). What the agent last wrote is therefore
not proof the reason is still there: every RESYNC_S it reads the field of each job it holds
back once more (one read each, a write only where the reason went missing), so a reason lost
to another writer is back within RESYNC_S while a steady queue still costs no call in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.status_file import write_status_file
from preemption.scheduling.tick import Decision
from vjob.errors import CommandError, InputError
from vjob.model import ClusterView, JobState
from vjob.rms import RMSAdapter

STATUS_NAME = "waiting.json"
"""`vjob status`'s record of the reasons (agent.status_file)."""
RESYNC_S = 300.0
"""Seconds between two readings of every held-back job's field (see above)."""


class WaitNotices:
    """What the agent last wrote for each job (job id → reason text), and the writes it made."""

    def __init__(
        self,
        status_path: Path | None = None,
        *,
        resync_s: float = RESYNC_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.status_path = status_path
        """Where `vjob status` reads the reasons (`<data_dir>/waiting.json`); None: nowhere."""
        self.resync_s = resync_s
        self.clock = clock
        self.checked_at: float | None = None
        """When the fields of the held-back jobs were last read rather than trusted."""
        self.told: dict[str, str] = {}
        self.writes = 0
        """RMS writes made (`tell_wait` calls that changed the field), for tests and the log."""
        self.synced = False
        """Whether this agent has looked at every interactive job's field once: a reason left
        by an agent before it (a restart, another lease holder) is not in `told`."""

    def update(self, adapter: RMSAdapter, decision: Decision, view: ClusterView, log: Any, metrics: Any) -> None:
        """Write the reasons that changed, remove those no longer true, forget jobs that left."""
        want = {job_id: reason.text() for job_id, reason in decision.waits.items()}
        if adapter.abilities.wait_field is not None:
            listed = {j.id for j in view.jobs}
            if not self.synced:  # once: remove what an earlier agent wrote and is no longer true
                for job in view.jobs:
                    if job.interactive and job.id not in want and job.state in (JobState.PENDING, JobState.RUNNING):
                        self.told.setdefault(job.id, "")
                self.synced = True
            now = self.clock()
            if self.checked_at is None or now - self.checked_at >= self.resync_s:
                self.checked_at = now  # read each held-back job's field again: another writer may have dropped it
                for job_id in want:
                    self.told.pop(job_id, None)
            for job_id, text in want.items():
                if self.told.get(job_id) != text:
                    self._tell(adapter, job_id, text, log, metrics)
            for job_id in [j for j in self.told if j not in want]:
                if job_id not in listed:
                    del self.told[job_id]  # gone from the RMS: nothing to write to
                else:
                    self._tell(adapter, job_id, None, log, metrics)
        else:
            self.told = want
        self._status(want, log)

    def _tell(self, adapter: RMSAdapter, job_id: str, text: str | None, log: Any, metrics: Any) -> None:
        try:
            changed = adapter.tell_wait(job_id, text)
        except (CommandError, InputError) as exc:
            metrics.errors.labels(kind="rms").inc()
            log.error("cannot tell the job's user why it waits, retrying next tick", jobs=[job_id], error=str(exc))
            return
        if changed:
            self.writes += 1
        if text is None:
            self.told.pop(job_id, None)
            if changed:
                log.info("wait reason removed", jobs=[job_id])
        else:
            self.told[job_id] = text
            if changed:
                log.info("interactive job held back", jobs=[job_id], reason=text)

    def _status(self, want: dict[str, str], log: Any) -> None:
        if self.status_path is None:
            return
        try:
            write_status_file(self.status_path, {"at": time.time(), "jobs": want})
        except OSError as exc:
            log.warning("cannot write the wait reasons for vjob status", error=str(exc))


__all__ = ["RESYNC_S", "STATUS_NAME", "WaitNotices"]
