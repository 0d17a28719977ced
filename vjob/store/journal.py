"""The journal of context switches (the `switches` and `actions` tables): its one writer.

Why: the agent may be killed (kill -9, a node reboot) between asking a pilot to checkpoint and
requeue-holding the job. The executor (preemption.executor) journals every switch and action
before acting; a restarted agent reads the open ones here and finishes or undoes them
(`agent.recover`) instead of leaving a VM on disk behind a "running" job, and
`vjob status` shows the recent ones.

States: a switch is planned → running → done | rolled_back | failed; an action is
planned → running → done | undone | failed. The `job_key` of an action is "<rms>:<job id>".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update

from vjob.store.db import Store, now
from vjob.store.schema import ActionRecord, SwitchRecord

OPEN_SWITCH_STATES = ("planned", "running")
OPEN_ACTION_STATES = ("planned", "running")


@dataclass(frozen=True)
class JournalAction:
    """One journalled action, as read back from the store."""

    id: int
    switch_id: int
    action: str
    vm_name: str
    job_key: str
    source: str | None
    state: str

    @property
    def rms(self) -> str:
        """The RMS of the action's job ("" for a key without one, e.g. a planner-only switch)."""
        return self.job_key.split(":", 1)[0] if ":" in self.job_key else ""

    @property
    def rms_job_id(self) -> str:
        return self.job_key.split(":", 1)[1] if ":" in self.job_key else self.job_key


@dataclass(frozen=True)
class PlannedAction:
    """One action to journal before it runs (pool index, kind, VM, job key, nodes)."""

    pool: int
    action: str
    vm_name: str
    job_key: str
    source: str | None
    destination: str | None


def open_switch(
    store: Store, reason: str, plan: dict[str, Any], actions: Sequence[PlannedAction]
) -> tuple[int, list[int]]:
    """Journal a switch as running and its actions as planned, in one transaction, before any
    action runs; returns the switch id and the action ids in the order given."""
    stamp = now()
    with store.session() as s:
        switch = SwitchRecord(
            reason=reason, state="running", plan_json=json.dumps(plan), created_at=stamp, updated_at=stamp
        )
        s.add(switch)
        s.flush()
        rows = [
            ActionRecord(
                switch_id=switch.id,
                pool=a.pool,
                action=a.action,
                vm_name=a.vm_name,
                job_key=a.job_key,
                source=a.source,
                destination=a.destination,
                state="planned",
            )
            for a in actions
        ]
        s.add_all(rows)
        s.flush()
        return switch.id, [row.id for row in rows]


@dataclass(frozen=True)
class JournalSwitch:
    id: int
    reason: str
    state: str
    plan: dict[str, Any]
    actions: tuple[JournalAction, ...]


def load(store: Store, switch_id: int) -> JournalSwitch:
    with store.session() as s:
        sw = s.get(SwitchRecord, switch_id)
        if sw is None:
            raise KeyError(switch_id)
        rows = s.scalars(select(ActionRecord).where(ActionRecord.switch_id == switch_id).order_by(ActionRecord.id))
        actions = tuple(
            JournalAction(r.id, r.switch_id, r.action, r.vm_name, r.job_key, r.source, r.state) for r in rows
        )
        return JournalSwitch(sw.id, sw.reason, sw.state, json.loads(sw.plan_json or "{}"), actions)


def set_switch(store: Store, switch_id: int, state: str) -> None:
    with store.session() as s:
        s.execute(update(SwitchRecord).where(SwitchRecord.id == switch_id).values(state=state, updated_at=now()))


def set_action(store: Store, action_id: int, state: str, error: str = "") -> None:
    """Move one action; `running` stamps its start, any end state its finish."""
    values: dict[str, Any] = {"state": state}
    if state == "running":
        values["started_at"] = now()
    elif state in ("done", "undone", "failed"):
        values["finished_at"] = now()
    if error:
        values["error"] = error[:2000]
    with store.session() as s:
        s.execute(update(ActionRecord).where(ActionRecord.id == action_id).values(**values))


def open_switches(store: Store, rms: str | None = None) -> list[JournalSwitch]:
    """Switches a previous agent left planned or running, oldest first; with `rms`, only those
    whose every action concerns that RMS's jobs (an agent never touches another RMS's switch)."""
    with store.session() as s:
        ids = list(
            s.scalars(
                select(SwitchRecord.id).where(SwitchRecord.state.in_(OPEN_SWITCH_STATES)).order_by(SwitchRecord.id)
            )
        )
    switches = [load(store, i) for i in ids]
    if rms is None:
        return switches
    return [sw for sw in switches if sw.actions and all(a.rms == rms for a in sw.actions)]


def recent(store: Store, limit: int = 20) -> list[JournalSwitch]:
    """The newest switches, newest first (for `vjob status`)."""
    with store.session() as s:
        ids = list(s.scalars(select(SwitchRecord.id).order_by(SwitchRecord.id.desc()).limit(limit)))
    return [load(store, i) for i in ids]


def action_times(store: Store, switch_id: int) -> dict[int, tuple[float | None, float | None, str]]:
    """Start, finish and error of each action of a switch (status and metrics)."""
    with store.session() as s:
        rows = s.execute(
            select(ActionRecord.id, ActionRecord.started_at, ActionRecord.finished_at, ActionRecord.error).where(
                ActionRecord.switch_id == switch_id
            )
        )
        return {r[0]: (r[1], r[2], r[3]) for r in rows}


@dataclass(frozen=True)
class Migration:
    """A live migration the journal holds as done: where root moved a job's VM, and when."""

    rms_job_id: str
    vm_name: str
    source: str
    destination: str
    finished_at: float


def migrations(store: Store, rms: str, job_ids: Sequence[str] | None = None, chunk: int = 500) -> list[Migration]:
    """The done `migrate` actions of this RMS's jobs (all, or of `job_ids`), oldest first: how
    many times each job was moved (remapping's bound) and the host each VM was last moved to —
    root's own record, where a pilot's word for its node is the user's (agent.observe)."""
    base = select(ActionRecord).where(ActionRecord.action == "migrate", ActionRecord.state == "done")
    if job_ids is None:
        queries = [base.where(ActionRecord.job_key.like(f"{rms}:%"))]
    else:
        keys = [f"{rms}:{j}" for j in job_ids]
        queries = [base.where(ActionRecord.job_key.in_(keys[i : i + chunk])) for i in range(0, len(keys), chunk)]
    rows: list[ActionRecord] = []
    with store.session() as s:
        for query in queries:
            rows.extend(s.scalars(query))
        rows.sort(key=lambda r: (r.finished_at or 0.0, r.id))
        return [
            Migration(r.job_key.split(":", 1)[1], r.vm_name, r.source or "", r.destination or "", r.finished_at or 0.0)
            for r in rows
        ]
