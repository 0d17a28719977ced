"""Admission and continuation: what happens to a job whose x-factor is at or over X.

Refusing at submission is the paper's choice; checkpointing a running job to resume it later or
elsewhere (where it can still make its deadline) is vjob's, since a vjob can be suspended rather
than killed; cancelling frees the node at once for jobs that can still succeed."""

from __future__ import annotations

from enum import StrEnum

from vjob.errors import InputError

ACTIONS = ("cancel", "checkpoint")


class Continuation(StrEnum):
    CONTINUE = "continue"
    CHECKPOINT = "checkpoint"
    CANCEL = "cancel"


def admit(x: float, threshold: float | None) -> bool:
    """Accept while x < X; `threshold` None means no deadline admission (accept everything)."""
    return threshold is None or x < threshold


def continuation(x: float, threshold: float | None, *, action: str, can_meet_elsewhere: bool) -> Continuation:
    """A running job keeps running while x < X; over it, the site's `action` applies.

    `checkpoint` only when the job could still meet its deadline somewhere (at no overhead, from
    its current progress): saving a job that cannot make it anywhere wastes the disk and the
    transfer, so it is cancelled instead."""
    if action not in ACTIONS:
        raise InputError(f"deadline action = {action!r}: must be one of {', '.join(ACTIONS)}")
    if threshold is None or x < threshold:
        return Continuation.CONTINUE
    if action == "checkpoint" and can_meet_elsewhere:
        return Continuation.CHECKPOINT
    return Continuation.CANCEL


def predicted_remaining(estimate_s: float, done_s: float, slowdown: float, *, floor: float = 0.05) -> float:
    """Wall seconds still needed: the estimated work not yet done, slowed by the VO model.

    A job already past its own estimate is given `floor` of it still to run (it has not ended,
    so something remains): otherwise x would say "on time" for every overrunning job. Only then:
    a floor applied before the estimate is reached cancels jobs about to finish on time."""
    if estimate_s < 0 or done_s < 0 or slowdown <= 0:
        raise InputError(
            f"predicted_remaining: estimate_s = {estimate_s!r}, done_s = {done_s!r}, slowdown = {slowdown!r}: "
            "need estimate and done >= 0, slowdown > 0"
        )
    left = estimate_s - done_s if done_s < estimate_s else floor * estimate_s
    return max(left, 0.0) * slowdown
