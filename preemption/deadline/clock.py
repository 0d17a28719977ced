"""Where a job's deadline clock starts: at its submission, or when it starts on its node.

Khalid et al. give the deadline only as "a buffer of 5 % of the job duration". Counted from
submission (vjob's reading of a trace), the buffer must also cover the wait in the queue. In the
paper's PanDA set-up the job is pulled by a pilot already running on a node, so its clock may
well start there: then the buffer covers only the virtualisation overhead. Both readings give
the same allowance (deadline − submit); they differ in when it starts to run out.

The live agent gets absolute deadlines from the RMS and needs no reading; the replay calls
`counted_deadline` for every x it computes, so a reading changes the deadline and nothing else.
"""

from __future__ import annotations

import math

from vjob.errors import InputError

READINGS = ("submit", "start")


def check_reading(reading: str) -> str:
    """`reading` itself, or an error naming the value and the choices."""
    if reading not in READINGS:
        raise InputError(f"deadline_from = {reading!r}: must be one of {', '.join(READINGS)}")
    return reading


def counted_deadline(
    reading: str, *, submit_s: float, deadline_s: float, started_s: float | None, now_s: float
) -> float:
    """The deadline in force at `now_s` for a job submitted at `submit_s` whose submission-reading
    deadline is `deadline_s`.

    `start`: the same allowance counted from `started_s`, its first start on a node (a
    checkpointed job keeps the deadline of its first start: the pilot had it). Not started
    yet: counted from `now_s`, as if it started now — what admission and a waiting job's x ask."""
    check_reading(reading)
    if reading == "submit":
        return deadline_s
    for name, value in (("submit_s", submit_s), ("deadline_s", deadline_s), ("now_s", now_s)):
        if not math.isfinite(value):
            raise InputError(f"counted_deadline: {name} = {value!r}: must be finite")
    return (now_s if started_s is None else started_s) + (deadline_s - submit_s)
