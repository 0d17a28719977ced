"""Usage and targets in the state store: decayed node-seconds per user and per account.

Why in the store: usage is history the RMS forgets (a finished job disappears from squeue),
and the agent must survive its own restarts without handing everybody a clean slate.

Decay: usage halves every `usage_half_life_s` (`ubis_priority.decay`, the rule the simulator
uses too). Each row holds the value at `decayed_at`; readers decay it to their
own instant, writers decay it to now before adding.

Charging: `charge(store, view, cfg)` adds, for every running job and every finished job in
the view, nodes × the part of its run time that lies after the previous charge (the common
`decayed_at` of the rows, which every charge moves to `view.now`). Calling it twice for the
same view charges nothing the second time; the first charge ever counts run time from each
job's start. The amount of one interval is added undecayed at its end, which is exact enough
while the agent's interval is much shorter than the half-life.

This module is not a policy (it reads and writes the store); the priority kernel only sees
the numbers it returns, through ClusterView.usage and ClusterView.targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from sqlalchemy import bindparam, delete, insert, select, text, update

from ubis_priority.decay import decayed
from ubis_priority.job_columns import STATE_CODE, columns
from vjob.config import PriorityConfig
from vjob.model import ClusterView, Job, JobState
from vjob.store.db import Store
from vjob.store.schema import TargetRecord, UsageRecord

USER = "user"
ACCOUNT = "account"


def _consumed(view: ClusterView, since: float | None) -> dict[tuple[str, str], float]:
    """Node-seconds each user and account consumed after `since` (from the start if None).

    The loop's names are bound once and each key built once per job: at a site's size it runs
    over 20,000 running jobs at every tick (12 -> 9 ms); the arithmetic, and the order in which
    each sum is made, are the plain rule's (tests/test_usage_consumed_columns.py, to the bit)."""
    amounts: dict[tuple[str, str], float] = {}
    get = amounts.get
    now, running = view.now, JobState.RUNNING
    for job in _charged(view.jobs):
        start = job.start_time
        if start is None:
            continue
        if job.state is running:
            end = now
        elif job.state.finished and job.end_time is not None:
            end = min(job.end_time, now)
        else:
            continue
        begin = start if since is None else max(start, since)
        if end <= begin:
            continue
        node_seconds = float(len(job.allocated_nodes) or job.nodes) * (end - begin)
        key = (USER, job.user)
        amounts[key] = get(key, 0.0) + node_seconds
        if job.account:
            key = (ACCOUNT, job.account)
            amounts[key] = get(key, 0.0) + node_seconds
    return amounts


_CHARGED = np.array([STATE_CODE[s] for s in JobState if s is JobState.RUNNING or s.finished], dtype=np.int64)
"""The state codes (job_columns) of the jobs `_consumed` charges: running and finished."""


def _charged(jobs: Sequence[Job]) -> Sequence[Job]:
    """The running and finished ones of `jobs`, in their order, found in the jobs' columns:
    at a site's size the 100,000 pending jobs need not be looked at one by one."""
    if not isinstance(jobs, tuple):
        return jobs
    cols = columns(jobs)
    return cols.pick(np.flatnonzero(np.isin(cols.state, _CHARGED)))


_USAGE = UsageRecord.__table__
_MOVE = (
    update(_USAGE)
    .where(_USAGE.c.entity_kind == bindparam("b_kind"), _USAGE.c.name == bindparam("b_name"))
    .values(node_seconds=bindparam("b_ns"), decayed_at=bindparam("b_at"))
)
"""One row's decayed-and-charged value by its key, run for every row in one executemany."""


def charge(store: Store, view: ClusterView, cfg: PriorityConfig) -> dict[tuple[str, str], float]:
    """Add the usage of the view's running and finished jobs; returns what was charged.

    Plain rows and one executemany UPDATE, not ORM objects: every row moves at every charge
    (its decay and the common marker), and the ORM's per-object flush of ~800 rows cost
    several times what this does. The figures stay those the ORM path wrote, bit for bit: the
    same `decayed(...) + amount` in Python, stored as is (tests/test_usage_charge_bulk.py)."""
    with store.session() as s:
        if store.dialect == "postgresql":
            # Two agents charging at once would both read the old marker and charge twice;
            # this lock serialises chargers and leaves readers alone.
            s.execute(text("LOCK TABLE usage IN SHARE ROW EXCLUSIVE MODE"))
        rows = s.execute(select(_USAGE.c.entity_kind, _USAGE.c.name, _USAGE.c.node_seconds, _USAGE.c.decayed_at)).all()
        last = max((when for _kind, _name, _ns, when in rows), default=None)
        if last is not None and view.now <= last:
            return {}
        amounts = _consumed(view, last)
        charged = dict(amounts)
        now, half_life = view.now, cfg.usage_half_life_s
        moved = [
            {
                "b_ns": decayed(ns, now - when, half_life) + amounts.pop((kind, name), 0.0),
                "b_at": now,
                "b_kind": kind,
                "b_name": name,
            }
            for kind, name, ns, when in rows
        ]
        if moved:
            s.execute(_MOVE, moved)
        if amounts:
            s.execute(
                insert(_USAGE),
                [
                    {"entity_kind": kind, "name": name, "node_seconds": ns, "decayed_at": now}
                    for (kind, name), ns in sorted(amounts.items())
                ],
            )
    return charged


def load_usage(store: Store, at: float, cfg: PriorityConfig, *, kind: str = USER) -> dict[str, float]:
    """Decayed node-seconds per user (or account) as of `at`."""
    with store.session() as s:
        rows = s.execute(
            select(UsageRecord.name, UsageRecord.node_seconds, UsageRecord.decayed_at).where(
                UsageRecord.entity_kind == kind
            )
        ).all()
    return {name: decayed(ns, at - when, cfg.usage_half_life_s) for name, ns, when in rows}


def sync_targets(store: Store, cfg: PriorityConfig) -> None:
    """Make the store's targets table hold exactly the configuration's targets."""
    with store.session() as s:
        s.execute(delete(TargetRecord))
        for name, share in sorted(cfg.targets.items()):
            s.add(TargetRecord(entity_kind=USER, name=name, share=share))
        for name, share in sorted(cfg.account_targets.items()):
            s.add(TargetRecord(entity_kind=ACCOUNT, name=name, share=share))


def load_targets(store: Store, *, kind: str = USER) -> dict[str, float]:
    with store.session() as s:
        rows = s.execute(select(TargetRecord.name, TargetRecord.share).where(TargetRecord.entity_kind == kind)).all()
    return {name: share for name, share in rows}


def with_history(view: ClusterView, store: Store, cfg: PriorityConfig) -> ClusterView:
    """`view` with the store's decayed user usage and user targets filled in."""
    return replace(view, usage=load_usage(store, view.now, cfg), targets=load_targets(store))


__all__ = [
    "ACCOUNT",
    "USER",
    "charge",
    "decayed",
    "load_targets",
    "load_usage",
    "sync_targets",
    "with_history",
]
