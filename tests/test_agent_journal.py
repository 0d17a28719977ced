"""Reading and closing the journal of context switches (vjob.store.journal), on SQLite and
PostgreSQL. The rows are written as preemption.executor writes them before it acts."""

from __future__ import annotations

import json

from vjob.store import journal
from vjob.store.db import Store, now
from vjob.store.schema import ActionRecord, SwitchRecord


def journal_switch(store: Store, reason: str, *jobs: str, state: str = "running") -> int:
    """A switch suspending one VM per job, journalled like the executor does (all planned)."""
    with store.session() as s:
        sw = SwitchRecord(
            reason=reason, state=state, plan_json=json.dumps({"cost": 128}), created_at=now(), updated_at=now()
        )
        s.add(sw)
        s.flush()
        for job in jobs:
            s.add(
                ActionRecord(
                    switch_id=sw.id,
                    pool=0,
                    action="suspend",
                    vm_name=f"vjob-slurm-{job}",
                    job_key=f"slurm:{job}",
                    source=f"node{job}",
                    state="planned",
                )
            )
        return sw.id


def test_an_open_switch_is_read_back_with_its_actions(store):
    sw_id = journal_switch(store, "interactive 100", "1", "2")
    (sw,) = journal.open_switches(store)
    assert (sw.id, sw.state, sw.plan) == (sw_id, "running", {"cost": 128})
    assert [a.state for a in sw.actions] == ["planned", "planned"]
    assert [a.rms_job_id for a in sw.actions] == ["1", "2"]


def test_closing_a_switch_stamps_its_actions_and_it_is_no_longer_open(store):
    sw_id = journal_switch(store, "r", "1")
    (action,) = journal.load(store, sw_id).actions
    journal.set_action(store, action.id, "running")
    journal.set_action(store, action.id, "failed", "scontrol requeuehold 1 exited 1")
    journal.set_switch(store, sw_id, "rolled_back")
    assert journal.open_switches(store) == []
    started, finished, error = journal.action_times(store, sw_id)[action.id]
    assert started is not None and finished is not None and finished >= started
    assert "requeuehold" in error
    (recent,) = journal.recent(store)
    assert recent.state == "rolled_back"
    assert recent.actions[0].state == "failed"
