"""Admission and continuation: what happens to a job whose x-factor is at or over X.

Refusing at submission is the paper's choice; checkpointing a running job to resume it later or
elsewhere (where it can still make its deadline) is vjob's, since a vjob can be suspended rather
than killed; cancelling frees the node at once for jobs that can still succeed."""

from __future__ import annotations

import math
from enum import StrEnum

from preemption.deadline.xfactor import x_factor
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


def resume_x(
    estimate_s: float, done_s: float, slowdown: float, time_to_deadline_s: float, *, pause_s: float = 0.0
) -> float:
    """x of a job (re)started now at `slowdown`, after `pause_s` without progress (a restore).

    The one formula for a waiting, checkpointed or held job's x: the simulator's replay and the
    agent's release both call it, so a held job is judged the same way in both."""
    if not math.isfinite(pause_s) or pause_s < 0:
        raise InputError(f"resume_x: pause_s = {pause_s!r}: must be a finite number >= 0")
    return x_factor(predicted_remaining(estimate_s, done_s, slowdown) + pause_s, time_to_deadline_s)


class Held(StrEnum):
    """What becomes of a job checkpointed for its deadline while it waits to run again."""

    RELEASE = "release"
    HOLD = "hold"
    CANCEL = "cancel"


def held_verdict(x_alone: float, x_placement: float | None, threshold: float | None) -> Held:
    """A job checkpointed for its deadline runs again only on a placement where x < X.

    `x_alone` is its x in a VM alone on a node (the best any placement can give),
    `x_placement` its x on the placement on offer now (None: none). Why not release it on
    the next free node like any other checkpointed job: it was stopped because where it ran it
    would miss; resumed beside the same neighbours it would be stopped again at once. Why
    cancel when even alone x ≥ X: the threshold says it should not run at all, and holding it
    to its deadline keeps its saved state for nothing (the simulator's hopeless waiting job)."""
    if threshold is None:
        return Held.RELEASE
    if not admit(x_alone, threshold):
        return Held.CANCEL
    if x_placement is not None and admit(x_placement, threshold):
        return Held.RELEASE
    return Held.HOLD
