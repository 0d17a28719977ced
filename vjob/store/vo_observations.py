"""Finished vjobs' predicted and actual run times: the evidence the deadline agent refits its
virtualisation-overhead model from (preemption.deadline.vo_learning, docs/deadline.md).

Why here and bounded: the model must survive an agent restart (it refits from these rows at
start), and every field comes from job data the user controls (its id, its time limit, how
long it ran), so each is validated before it is written and the table keeps only the newest
MAX_ROWS rows — a flood of tiny jobs cannot grow it without bound.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from vjob.errors import InputError
from vjob.store.db import Store
from vjob.store.schema import VOObservationRecord

MAX_ROWS = 5000
"""Rows kept; older ones are deleted on insert."""
MAX_SECONDS = 1e8
"""About three years: a longer duration is corrupt job data, not a run."""
MAX_COLOCATED = 1024

_JOB_ID = re.compile(r"[A-Za-z0-9_.+\[\]-]{1,64}")
_KIND = re.compile(r"[a-z]{1,16}")


@dataclass(frozen=True, slots=True)
class Observation:
    job_id: str
    finished_at: float
    kind: str | None
    colocated: int
    walltime_s: float
    predicted_s: float
    actual_s: float


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"VO observation: {name} = {value!r}: must be a number")
    v = float(value)
    if not math.isfinite(v) or not 0 < v <= MAX_SECONDS:
        raise InputError(f"VO observation: {name} = {value!r}: must be in (0, {MAX_SECONDS:g}] seconds")
    return v


def validate(obs: Observation) -> Observation:
    """The observation with checked types and ranges, or InputError naming the field."""
    if not isinstance(obs.job_id, str) or not _JOB_ID.fullmatch(obs.job_id):
        raise InputError(f"VO observation: job_id = {obs.job_id!r}: must match {_JOB_ID.pattern}")
    if obs.kind is not None and (not isinstance(obs.kind, str) or not _KIND.fullmatch(obs.kind)):
        raise InputError(f"VO observation: kind = {obs.kind!r}: must match {_KIND.pattern} or be None")
    if isinstance(obs.colocated, bool) or not isinstance(obs.colocated, int) or not 0 <= obs.colocated <= MAX_COLOCATED:
        raise InputError(f"VO observation: colocated = {obs.colocated!r}: must be an integer in 0..{MAX_COLOCATED}")
    finished = obs.finished_at
    if isinstance(finished, bool) or not isinstance(finished, int | float) or not math.isfinite(finished):
        raise InputError(f"VO observation: finished_at = {finished!r}: must be a finite number")
    return Observation(
        job_id=obs.job_id,
        finished_at=float(finished),
        kind=obs.kind,
        colocated=obs.colocated,
        walltime_s=_seconds("walltime_s", obs.walltime_s),
        predicted_s=_seconds("predicted_s", obs.predicted_s),
        actual_s=_seconds("actual_s", obs.actual_s),
    )


def record(store: Store, obs: Observation) -> bool:
    """Insert `obs` (validated); False when the same job end is already recorded (an agent
    restarted and saw the finished job again). Trims the table to MAX_ROWS."""
    o = validate(obs)
    try:
        with store.session() as s:
            s.add(
                VOObservationRecord(
                    job_id=o.job_id,
                    finished_at=o.finished_at,
                    kind=o.kind,
                    colocated=o.colocated,
                    walltime_s=o.walltime_s,
                    predicted_s=o.predicted_s,
                    actual_s=o.actual_s,
                )
            )
    except IntegrityError:
        return False
    with store.session() as s:
        cut = s.scalar(
            select(VOObservationRecord.id).order_by(VOObservationRecord.id.desc()).offset(MAX_ROWS - 1).limit(1)
        )
        if cut is not None:
            s.execute(delete(VOObservationRecord).where(VOObservationRecord.id < cut))
    return True


def recent(store: Store, limit: int = 1000) -> list[Observation]:
    """The newest `limit` observations, newest first."""
    with store.session() as s:
        rows = s.scalars(select(VOObservationRecord).order_by(VOObservationRecord.id.desc()).limit(limit)).all()
        return [
            Observation(r.job_id, r.finished_at, r.kind, r.colocated, r.walltime_s, r.predicted_s, r.actual_s)
            for r in rows
        ]


def count(store: Store) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(VOObservationRecord)) or 0)


__all__ = ["MAX_ROWS", "Observation", "count", "recent", "record", "validate"]
