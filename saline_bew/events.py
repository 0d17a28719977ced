"""Every kind of entry the Saline journal holds, in one place.

Why one enum: the kinds are the contract between the manager that writes them, the decision
that reads them back (saline_bew.phases: the back-off, the adoption, the last safe point), the
relocation bookkeeping (saline_bew.relocation: an open migration request), the socket's `show`
and every journal an operator reads. Spelled as loose strings in five modules, a typo made a new
kind silently. The values are the strings journals have always held (a StrEnum: a member *is*
its string), so stored journals and the protocol stay byte-identical.
"""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    """The `kind` of a journal entry (saline_bew.journal.record)."""

    CREATED = "created"
    SUBMITTED = "submitted"
    SUBMIT_FAILED = "submit_failed"
    ADMITTED = "admitted"
    """Recorded by OAR's admission rule (the user typed oarsub); its OAR job is adopted later."""
    ADOPTED = "adopted"
    ADMISSION_ABANDONED = "admission_abandoned"
    ERROR = "error"
    """OAR or a node's libvirt unreachable: retried every pass, never counted."""
    STEP_FAILED = "step_failed"
    FAILED = "failed"
    OAR_JOB_VANISHED = "oar_job_vanished"
    WAITING_FOR_RESOURCES = "waiting_for_resources"
    MOVED = "moved"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    DEPLOYED = "deployed"
    RESUMED = "resumed"
    RESTARTED_FROM_SCRATCH = "restarted_from_scratch"
    SNAPSHOT = "snapshot"
    SNAPSHOT_FAILED = "snapshot_failed"
    KILLED = "killed"
    RELOCATION = "relocation"
    """The path chosen on OAR's warning (migration or suspension) and its time."""
    MIGRATION_ASKING = "migration_asking"
    """Journalled before OAR is asked for the new job: a manager that dies between the oarsub and
    the journal entry of its id leaves this behind, and its successor looks for the job by name."""
    MIGRATION_REQUESTED = "migration_requested"
    """Journalled with the new job's id as soon as OAR gave it, before any wait for its start."""
    MIGRATION_TAKEN_OVER = "migration_taken_over"
    MIGRATED = "migrated"
    MIGRATION_FAILED = "migration_failed"
    MIGRATION_ABANDONED = "migration_abandoned"
    WAITING_FOR_WORKDIR = "waiting_for_workdir"
    WORKDIR_STAGED = "workdir_staged"
    WORKDIR_NOT_STAGED = "workdir_not_staged"
    FINISHED = "finished"
    CLEANED = "cleaned"
    """The vjob's VMs, snapshots and identities are gone: the last entry of a vjob."""


class Phase(StrEnum):
    """Where a vjob stands (its row's `phase`): what the journal's entries moved it to."""

    SUBMITTED = "submitted"
    """Waiting for its OAR job to run (or to be asked for again)."""
    RUNNING = "running"
    KILLED = "killed"
    """OAR killed its job; it is being asked for again."""
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
