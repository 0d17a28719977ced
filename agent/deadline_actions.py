"""The deadline duty's actions: what DeadlineKeeper.propose proposed and the arbiter let through.

Why apart from the duty's decisions (agent.deadline): one plan per tick. The duty proposes its
cancels and checkpoints; the arbiter (agent.arbiter.deadline_checkpoints) refuses the checkpoints of
the pass's victims; this module carries the rest out on the RMS and the pilots, in the view's
order, and writes the duty's status for `vjob status`.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.deadline import DeadlineAction, DeadlineKeeper, DeadlineProposal, JobDeadline, Step
from vjob import log
from vjob.errors import VjobError
from vjob.rms import RMSAdapter

_log = log.get("agent.deadline")

Checkpoint = Callable[[str, str], bool]
"""(job id, reason) → whether its VM was saved: the agent's preemption path
(agent.act.checkpoint_vjob); False for a job without a VM (nothing to save)."""


def carry_out(
    keeper: DeadlineKeeper, proposal: DeadlineProposal, adapter: RMSAdapter, checkpoint: Checkpoint | None = None
) -> list[JobDeadline]:
    """Act on the proposal: a cancel through the RMS; a checkpoint through `checkpoint` (the VM
    saved by its pilot, the job requeue-held and released later, so it resumes where it was) —
    a job without a VM is requeued through the RMS and restarts. A failed action is logged and
    tried again next tick; the duty's status is written whatever happened. Returns the rows."""
    for action in proposal.actions:
        job_id, row = action.job_id, action.row
        if action.step is Step.CANCEL_PARKED:
            cancel_parked(keeper, job_id, row, adapter)
            continue
        try:
            if action.step is Step.CANCEL:
                adapter.cancel(job_id)
            elif checkpoint is not None and _checkpoint(keeper, proposal, action, checkpoint):
                keeper.parked[job_id] = (row.done_s, proposal.now)  # held until a placement with x < X exists
            elif adapter.abilities.requeue_hold:
                adapter.requeue_hold(job_id)
                adapter.release(job_id)
            else:
                continue
        except VjobError as exc:
            _log.error("deadline action failed, retrying next tick", job=job_id, error=str(exc))
            continue
        keeper.acted.add(job_id)
        _log.info(
            "deadline: job predicted to miss", job=job_id, x=round(row.x or 0, 3), X=keeper.x, action=row.decision
        )
    rows = list(proposal.rows)
    keeper.write_status(rows, proposal.now)
    return rows


def _checkpoint(keeper: DeadlineKeeper, proposal: DeadlineProposal, action: DeadlineAction, run: Checkpoint) -> bool:
    """The checkpoint of one job, unless the arbiter refused it (raised: logged as a failed
    action, looked at again next tick)."""
    refused = proposal.refused.get(action.job_id)
    if refused:
        raise VjobError(refused)
    return run(action.job_id, _reason(action.row, keeper.x))


def cancel_parked(keeper: DeadlineKeeper, job_id: str, row: JobDeadline, adapter: RMSAdapter) -> None:
    """A job held for its deadline that cannot make it even alone: cancelled, not kept to
    its deadline with its saved state (the simulator cancels such a waiting job too)."""
    try:
        adapter.cancel(job_id)
    except VjobError as exc:
        _log.error("deadline cancel failed, retrying next tick", job=job_id, error=str(exc))
        return
    del keeper.parked[job_id]
    keeper.given_up.add(job_id)
    _log.info(
        "deadline: checkpointed job can no longer make it anywhere: cancelled",
        job=job_id,
        x=round(row.x or 0, 3),
        X=keeper.x,
    )


def _reason(row: JobDeadline, threshold: float | None) -> str:
    """The journal's reason for a deadline checkpoint (what `vjob status` shows of the switch)."""
    x, limit = row.x or 0.0, threshold or 0.0
    return f"deadline: job {row.job_id} predicted to miss its deadline (x = {x:.2f} >= X = {limit:.2f})"


__all__ = ["Checkpoint", "cancel_parked", "carry_out"]
