"""Recover: finish or undo the context switches a previous agent of this RMS left open.

Why only this RMS's switches, and only while holding the cluster's lease: a second agent (a
standby on an HA pair, or an agent of another RMS sharing the store) must never withdraw the
live agent's checkpoint requests or roll its switch back under it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.act import finish_checkpoint
from vjob.errors import CommandError, VjobError
from vjob.model import JobState
from vjob.pilot_files import PilotState
from vjob.store import jobs as store_jobs
from vjob.store import journal

if TYPE_CHECKING:
    from agent.loop import Agent


def recover(agent: Agent) -> list[int]:
    """Finish or undo the switches a previous agent left open; returns their ids.

    An action whose pilot saved the VM is finished (requeue-hold if the job still runs, Pn
    recorded once); an action whose VM was not saved is undone (its request withdrawn; a pilot
    caught mid-save restores by itself). No VM is lost either way: it is running, or saved on
    disk behind a held job.
    """
    store = agent.store()
    states = {j.id: j.state for j in agent.adapter.jobs()}
    handled = []
    for sw in journal.open_switches(store, rms=agent.rms):
        all_done = True
        for action in sw.actions:
            if action.state not in journal.OPEN_ACTION_STATES:
                all_done = all_done and action.state == "done"
                continue
            job_id = action.rms_job_id
            pdir = agent.pilot_dir(job_id)
            try:
                st = pdir.read_state()
            except VjobError as exc:
                agent.log.warning("pilot state unreadable during recovery", jobs=[job_id], error=str(exc))
                st = None
            saved = action.state == "running" and st is not None and st.state is PilotState.SAVED
            saved = saved and st is not None and bool(st.request_id) and st.memory_saved
            state = states.get(job_id)
            try:
                if saved and state is JobState.RUNNING:
                    finish_checkpoint(agent, job_id)
                    journal.set_action(store, action.id, "done")
                    continue
                if saved and state in (JobState.PENDING, JobState.HELD):
                    store_jobs.record_preemption(store, agent.rms, job_id)
                    journal.set_action(store, action.id, "done")
                    continue
            except CommandError as exc:
                journal.set_action(store, action.id, "failed", str(exc))
                all_done = False
                continue
            pdir.withdraw_request()
            journal.set_action(store, action.id, "undone", "agent restarted before the checkpoint")
            all_done = False
        journal.set_switch(store, sw.id, "done" if all_done else "rolled_back")
        agent.log.info("recovered switch", switch=sw.id, outcome="done" if all_done else "rolled_back")
        handled.append(sw.id)
    return handled


__all__ = ["recover"]
