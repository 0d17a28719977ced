"""The Saline phase decision on its own: no OAR, no libvirt, no database (issue 14 item 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from plugins.oar.parse import OarEvent, OarJob
from saline_bew.phases import Action, Kind, Observed, backoff, decide


@dataclass
class Rec:
    phase: str = "running"
    oar_job_id: str | None = "1"
    updated_at: float = 1000.0
    snapshot_at: float | None = None
    last_event_id: int = 0


@dataclass
class Timing:
    snapshot_period_s: float = 600.0
    requeue_after_s: float = 30.0


@dataclass
class Ev:
    at: float
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


def oj(state: str = "Running", *events: tuple[int, str, float], hosts: tuple[str, ...] = ("n1",)) -> OarJob:
    return OarJob(id="1", state=state, user="u", hosts=hosts, events=tuple(OarEvent(i, t, d) for i, t, d in events))


NOW = 2000.0


@pytest.mark.parametrize(
    ("rec", "seen", "expected"),
    [
        (Rec(phase="killed"), Observed(), Action(Kind.RESUBMIT)),
        (Rec(phase="submitted", oar_job_id=None), Observed(), Action(Kind.RESUBMIT)),
        (Rec(), Observed(cancel_requested=True), Action(Kind.CANCEL)),
        (Rec(phase="submitted"), Observed(oar_job=oj()), Action(Kind.DEPLOY)),
        (Rec(phase="submitted"), Observed(oar_job=oj("Running", hosts=())), Action(Kind.WAIT)),
        (Rec(phase="submitted", updated_at=NOW - 10), Observed(oar_job=oj("Waiting")), Action(Kind.WAIT)),
        (Rec(phase="submitted", updated_at=NOW - 31), Observed(oar_job=oj("Waiting")), Action(Kind.MOVE)),
        (Rec(phase="submitted"), Observed(oar_job=None), Action(Kind.FORGET_OAR_JOB)),
        (Rec(phase="submitted"), Observed(oar_job=oj("Error")), Action(Kind.CANCELLED_IN_OAR)),
        (Rec(), Observed(oar_job=oj(), last_safe_point=NOW - 10), Action(Kind.WAIT)),
        (Rec(), Observed(oar_job=oj(), last_safe_point=NOW - 600), Action(Kind.SNAPSHOT)),
        (Rec(), Observed(oar_job=oj(), vms_finished=True), Action(Kind.COMPLETE)),
        (
            Rec(),
            Observed(oar_job=oj("Running", (5, "CHECKPOINT", NOW - 8), (9, "CHECKPOINT", NOW))),
            Action(Kind.EVACUATE, event_id=9, warned_at=NOW - 8),  # the first warning starts OAR's countdown
        ),
        (
            Rec(last_event_id=9),
            Observed(oar_job=oj("Running", (9, "CHECKPOINT", NOW)), last_safe_point=NOW),
            Action(Kind.WAIT),
        ),
        (
            Rec(snapshot_at=1500.0),
            Observed(oar_job=oj("Error", (7, "BESTEFFORT_KILL", 1800.0)), last_deploy=1000.0),
            Action(Kind.KILLED, cause="besteffort_kill", lost_s=300.0),
        ),
        (
            Rec(),
            Observed(oar_job=oj("Error", (7, "WALLTIME", 1900.0)), last_deploy=1700.0),
            Action(Kind.KILLED, cause="walltime", lost_s=200.0),
        ),
        (Rec(), Observed(oar_job=None, last_deploy=1500.0), Action(Kind.KILLED, cause="vanished", lost_s=500.0)),
        (
            Rec(phase="submitted"),
            Observed(oar_job=oj("Error", (7, "BESTEFFORT_KILL", 1800.0))),
            Action(Kind.KILLED, cause="besteffort_kill", lost_s=0.0),
        ),
        (Rec(), Observed(oar_job=oj("Terminated"), vms_finished=True), Action(Kind.COMPLETE)),
        (Rec(), Observed(oar_job=oj("Error")), Action(Kind.CANCELLED_IN_OAR)),
    ],
)
def test_decide(rec: Rec, seen: Observed, expected: Action) -> None:
    assert decide(rec, seen, now=NOW, timing=Timing()) == expected


def test_backoff_counts_failures_in_a_row_and_doubles_the_wait() -> None:
    assert backoff([Ev(1, "created")], base_s=30) == (0, 0.0)
    events = [Ev(1, "deployed"), Ev(10, "step_failed"), Ev(11, "error"), Ev(20, "step_failed")]
    assert backoff(events, base_s=30) == (2, 20 + 60)
    assert backoff([*events, Ev(30, "snapshot")], base_s=30) == (0, 0.0)  # progress resets the count
    many = [Ev(float(i), "step_failed") for i in range(20)]
    assert backoff(many, base_s=30, cap_s=3600) == (20, 19 + 3600)
