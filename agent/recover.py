"""Recover: finish or undo the context switches a previous agent of this RMS left open.

Why only this RMS's switches, and only while holding the cluster's lease: a second agent (a
standby on an HA pair, or an agent of another RMS sharing the store) must never withdraw the
live agent's checkpoint requests or roll its switch back under it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.act import finish_checkpoint
from agent.observe import Observation
from agent.pilot_performer import EXECUTOR_TAG
from agent.ports import Ports
from agent.remap_whole import record_moves, recovery_performer
from preemption.executor import ExecutionReport, Executor, KeyedPerformer
from preemption.planner.plan import Plan
from vjob.errors import CommandError, VjobError
from vjob.model import ClusterView, Job, JobState
from vjob.pilot_files import PilotState
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store


def recover(ports: Ports) -> list[int]:
    """Finish or undo the switches a previous agent left open; returns their ids.

    An action whose pilot saved the VM is finished (requeue-hold if the job still runs, Pn
    recorded once); an action whose VM was not saved is undone (its request withdrawn; a pilot
    caught mid-save restores by itself). No VM is lost either way: it is running, or saved on
    disk behind a held job. A live switch (control loop, remapping) is carried on; a vjob of
    several VMs it moves whole is resumed with every VM's node (agent.remap_whole.journalled_moves)
    and recorded there, as the step that planned it would have.
    """
    store = ports.store()
    try:
        rms_jobs: tuple[Job, ...] | None = tuple(ports.adapter.jobs())
    except CommandError:
        rms_jobs = None  # the live switches wait on the pilots' claims alone; asked again below

    moved: dict[int, tuple[Mapping[str, tuple[str, ...]], Observation]] = {}

    def performer_for(sw: journal.JournalSwitch) -> KeyedPerformer:
        obs = _observation(ports, sw, rms_jobs or ())
        performer, moves = recovery_performer(ports, obs, Plan.from_dict(sw.plan, source=f"switch {sw.id}"))
        moved[sw.id] = (moves, obs)  # a vjob of several VMs resumes whole, every VM's node named
        return performer

    reports: list[ExecutionReport] = []
    if ports.lease.held():  # else they are the lease holder's to finish
        reports = finish_live_switches(store, ports.rms, performer_for, ports.log, still_ours=ports.lease.valid)
    handled = [r.switch_id for r in reports]
    listed = rms_jobs if rms_jobs is not None else tuple(ports.adapter.jobs())
    for r in reports:
        moves, obs = moved.get(r.switch_id, ({}, None))
        if moves and obs is not None:
            record_moves(ports, r, moves, {j.id: j for j in listed}, obs.pilots)
    states = {j.id: j.state for j in listed}
    finished: set[str] = set()
    """Jobs whose checkpoint this recovery finished: a vjob of several VMs has one action per VM
    and one save of them all, requeue-held and counted (Pn) once."""
    for sw in journal.open_switches(store, rms=ports.rms):
        if sw.plan.get("executor") == EXECUTOR_TAG:
            continue  # a live switch left open by finish_live_switches (failed to journal its end)
        all_done = True
        for action in sw.actions:
            if action.state not in journal.OPEN_ACTION_STATES:
                all_done = all_done and action.state == "done"
                continue
            job_id = action.rms_job_id
            pdir = ports.pilot_dir(job_id)
            try:
                st = pdir.read_state()
            except VjobError as exc:
                ports.log.warning("pilot state unreadable during recovery", jobs=[job_id], error=str(exc))
                st = None
            saved = action.state == "running" and st is not None and st.state is PilotState.SAVED
            saved = saved and st is not None and bool(st.request_id) and st.memory_saved
            state = states.get(job_id)
            try:
                if saved and job_id in finished:
                    journal.set_action(store, action.id, "done")
                    continue
                if saved and state in (JobState.RUNNING, JobState.SUSPENDED):  # suspended: a pause-first one
                    finish_checkpoint(ports, job_id)
                    finished.add(job_id)
                    journal.set_action(store, action.id, "done")
                    continue
                if saved and state in (JobState.PENDING, JobState.HELD):
                    store_jobs.record_preemption(store, ports.rms, job_id)
                    finished.add(job_id)
                    journal.set_action(store, action.id, "done")
                    continue
            except CommandError as exc:
                journal.set_action(store, action.id, "failed", str(exc))
                all_done = False
                continue
            pdir.withdraw_request()
            if state is JobState.SUSPENDED and ports.adapter.abilities.suspend:
                _resume_paused(ports, job_id)  # a pause-first checkpoint cut short: its pilot runs the VM again
            journal.set_action(store, action.id, "undone", "agent restarted before the checkpoint")
            all_done = False
        journal.set_switch(store, sw.id, "done" if all_done else "rolled_back")
        ports.log.info("recovered switch", switch=sw.id, outcome="done" if all_done else "rolled_back")
        handled.append(sw.id)
    return handled


def _resume_paused(ports: Ports, job_id: str) -> None:
    """Resume in the RMS a job an earlier agent suspended for a pause-first checkpoint
    (agent.pause_checkpoint): its stopped pilot then sees the request withdrawn."""
    try:
        ports.adapter.resume(job_id)
    except CommandError as exc:
        ports.log.error("could not resume a suspended victim during recovery", jobs=[job_id], error=str(exc))


def _observation(ports: Ports, sw: journal.JournalSwitch, rms_jobs: tuple[Job, ...]) -> Observation:
    """What the save timeout of a recovered switch's actions is computed from, before the
    agent's first observation: the RMS's jobs (their allocations bound a pilot's memory claim)
    and the state of the pilot of each vjob the switch's plan names (agent.pilot_performer.checkpoint_timeout_for,
    the preemption switch's own rule)."""
    pilots = {}
    for vjob in sorted({a.vjob for a in Plan.from_dict(sw.plan, source=f"switch {sw.id}").actions}):
        try:
            pilots[vjob] = ports.pilot_dir(vjob).read_state()
        except VjobError:
            continue  # unreadable: the RMS's allocation alone, else the floor
    view = ClusterView(now=time.time(), jobs=rms_jobs)
    return Observation(view=view, pilots=pilots, sleeping={}, store_ok=True)


def finish_live_switches(
    store: Store,
    rms: str,
    performer_for: Callable[[journal.JournalSwitch], KeyedPerformer],
    logger: Any,
    *,
    still_ours: Callable[[], bool] | None = None,
) -> list[ExecutionReport]:
    """Finish the live switches (every action through the pilots) a killed agent left open.

    Why roll forward: every action of such a plan is a request the pilot answers once, under a
    key stable across agents; the pools before the crash freed the room the next ones need,
    so carrying on is what keeps every node viable. An action that cannot be done now stops
    the switch as the executor would (`failed`, the rest `planned`): each VM is then running
    or asleep on disk where its pilot says, never lost, and the next decision starts from there.
    `still_ours` (the agent's lease): once it turns False the switch is left, abandoned, to the
    lease's new holder, as a live switch would be.
    """
    reports: list[ExecutionReport] = []
    for sw in journal.open_switches(store, rms=rms):
        if sw.plan.get("executor") != EXECUTOR_TAG:
            continue
        executor = Executor(performer_for(sw), store, pipeline_interval_s=0.0, tag=EXECUTOR_TAG, still_ours=still_ours)
        report = executor.finish(sw)
        logger.info("recovered live switch", switch=sw.id, outcome=report.state, summary=report.summary())
        reports.append(report)
    return reports


__all__ = ["finish_live_switches", "recover"]
