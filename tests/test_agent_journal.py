"""The agent's journal of context switches (vjob.agent_journal), on SQLite and PostgreSQL."""

from __future__ import annotations

from vjob import agent_journal as journal


def _actions(*jobs: str) -> list[dict]:
    return [
        {"action": "suspend", "vm_name": f"vjob-slurm-{j}", "job_key": f"slurm:{j}", "source": f"node{j}"} for j in jobs
    ]


def test_a_switch_is_recorded_planned_with_its_actions_before_anything_runs(store):
    sw = journal.begin(store, "interactive 100", {"interactive": "100"}, _actions("1", "2"))
    assert sw.state == "planned"
    assert [a.state for a in sw.actions] == ["planned", "planned"]
    assert [a.rms_job_id for a in sw.actions] == ["1", "2"]
    assert sw.plan == {"interactive": "100"}
    assert [s.id for s in journal.open_switches(store)] == [sw.id]


def test_finished_switches_are_no_longer_open_and_times_are_stamped(store):
    sw = journal.begin(store, "r", {}, _actions("1"))
    journal.set_switch(store, sw.id, "running")
    (action,) = sw.actions
    journal.set_action(store, action.id, "running")
    journal.set_action(store, action.id, "failed", "scontrol requeuehold 1 exited 1")
    journal.set_switch(store, sw.id, "rolled_back")
    assert journal.open_switches(store) == []
    started, finished, error = journal.action_times(store, sw.id)[action.id]
    assert started is not None and finished is not None and finished >= started
    assert "requeuehold" in error
    (recent,) = journal.recent(store)
    assert recent.state == "rolled_back"
    assert recent.actions[0].state == "failed"
