"""Carrying out a plan: pool after pool, the actions of a pool in parallel, every step journalled.

Why journal before and after each action: a context switch touches many VMs over minutes; if
the agent dies half-way, the `switches`/`actions` tables tell what was planned, what had
started and what had finished, so the next agent can finish or undo it instead of guessing.

Why pipelined suspends and resumes: the VMs of one vjob must be paused and woken close
together, always in the same order, or its distributed application times out. As in the
Entropy paper (section 4.1), the suspends (and the resumes) of one vjob are started one per
`pipeline_interval_s`, sorted by host name, so the pauses are sequential while most of the
writing to disk overlaps.

Why stop at the first failed pool: the next pool's actions were planned on the room this pool
frees; starting them after a failure could overload a node. What was done is reported.

Why `finish`: a switch cut short by a crash is carried on from the journal by the next agent
(agent.recover), skipping what was done; a KeyedPerformer gets each action's stable journal
key, so an action that was under way when the agent died is recognised, not done twice.

Why `still_ours`: the switch is the lease holder's (agent.loop keeps the lease while it
acts). An executor whose holder lost the lease starts nothing more and writes nothing more to
the journal — the switch is now the new holder's to finish or undo (agent.recover), and two
writers would fight over its rows. It ends `abandoned`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from preemption.planner.plan import Plan, PlanAction
from vjob import log
from vjob.errors import VjobError
from vjob.model import Action
from vjob.store import journal
from vjob.store.db import Store


class ActionPerformer(Protocol):
    """What the executor needs from a VM driver; each method raises when the action fails."""

    def run(self, vm: str, node: str) -> None: ...

    def stop(self, vm: str, node: str) -> None: ...

    def suspend(self, vm: str, node: str) -> None: ...

    def resume(self, vm: str, node: str, source: str | None) -> None: ...

    def migrate(self, vm: str, source: str, destination: str) -> None: ...


@runtime_checkable
class KeyedPerformer(Protocol):
    """A performer that needs each action's journal key (e.g. the pilots': the key is the
    request id, so an action repeated after a crash is recognised and never done twice)."""

    def perform(self, action: PlanAction, key: str) -> None: ...


@runtime_checkable
class JobPerformer(Protocol):
    """A performer that checkpoints a multi-VM job as one consistent cut: every VM paused
    before any is saved, all restored paused before any runs (provisioning.coordinated).
    The executor hands it the suspends (or resumes) of one vjob in a pool together."""

    def suspend_job(self, actions: Sequence[PlanAction]) -> None: ...

    def resume_job(self, actions: Sequence[PlanAction]) -> None: ...


class Abandoned(VjobError):
    """The executor's holder lost the right to act (its lease) mid-switch: nothing more is done
    or journalled by it; a performer waiting for an answer raises it to stop waiting."""


def action_key(switch_id: int, action_id: int) -> str:
    """The stable name of one journalled action (switch id, action row id)."""
    return f"sw{switch_id}-a{action_id}"


@dataclass
class ExecutionReport:
    """What a switch did: `state` is done, failed or abandoned (the lease lost: the journal is
    left to its new holder); `failed` pairs each action with its error."""

    switch_id: int
    state: str
    pools_done: int
    done: list[PlanAction] = field(default_factory=list)
    failed: list[tuple[PlanAction, str]] = field(default_factory=list)
    not_started: list[PlanAction] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        text = f"switch {self.switch_id} {self.state}: {self.pools_done} pool(s) done, {len(self.done)} action(s) done"
        if self.failed:
            text += (
                f", {len(self.failed)} failed ("
                + "; ".join(f"{a.kind.value} {a.vm}: {e}" for a, e in self.failed)
                + ")"
            )
        if self.not_started:
            text += f", {len(self.not_started)} not started"
        return text


def start_offsets(pool: tuple[PlanAction, ...], interval_s: float) -> list[tuple[float, PlanAction]]:
    """When each action of a pool starts, relative to the pool's start (pure, for tests and the simulator).

    Suspends and resumes of one vjob are sorted by host name and started `interval_s` apart;
    every other action starts at once.
    """
    out: list[tuple[float, PlanAction]] = []
    groups: dict[tuple[str, Action], list[PlanAction]] = {}
    for a in pool:
        if a.kind in (Action.SUSPEND, Action.RESUME):
            groups.setdefault((a.vjob or a.vm, a.kind), []).append(a)
        else:
            out.append((0.0, a))
    for members in groups.values():
        for i, a in enumerate(sorted(members, key=lambda x: (x.node or "", x.vm))):
            out.append((i * interval_s, a))
    out.sort(key=lambda pair: (pair[0], pair[1].node or "", pair[1].vm))
    return out


class Executor:
    """Runs plans through an ActionPerformer and journals them in the store."""

    def __init__(
        self,
        performer: ActionPerformer,
        store: Store,
        *,
        pipeline_interval_s: float = 1.0,
        max_parallel: int = 16,
        job_key: Callable[[PlanAction], str] | None = None,
        tag: str = "",
        still_ours: Callable[[], bool] | None = None,
    ) -> None:
        """`still_ours`: whether this executor may still act and journal (the agent's lease is
        held); asked before every pool and action and after every failure."""
        self.performer = performer
        self.still_ours = still_ours or (lambda: True)
        self.store = store
        self.pipeline_interval_s = pipeline_interval_s
        self.max_parallel = max(1, max_parallel)
        self.job_key = job_key or (lambda a: a.vjob)
        self.tag = tag
        """Journalled with the plan (`executor`), so a restarted agent knows which performer
        can finish the switch (agent.recover)."""
        self._switch_id = 0

    def execute(self, plan: Plan, *, reason: str = "") -> ExecutionReport:
        """Journal `plan` as a new switch, then run it pool by pool (see `_run`)."""
        started = time.monotonic()
        switch_id, ids = self._journal_plan(plan, reason)
        logger = log.get("executor").bind(switch=switch_id)
        logger.info("switch_start", pools=len(plan.pools), cost=plan.cost, reason=reason, jobs=_jobs(plan.actions))
        return self._run(plan, switch_id, ids, set(), started)

    def finish(self, switch: journal.JournalSwitch) -> ExecutionReport:
        """Carry on a journalled switch a previous agent left open: the actions already done
        are skipped, the others run again pool by pool (a keyed performer recognises an action
        its VM already answered). The switch ends done, or failed where execute would stop."""
        started = time.monotonic()
        plan = Plan.from_dict(switch.plan, source=f"switch {switch.id}")
        if len(switch.actions) != len(plan.actions):
            raise ValueError(
                f"switch {switch.id}: the journal holds {len(switch.actions)} actions, its plan {len(plan.actions)}"
            )
        rows = iter(switch.actions)  # journalled in plan order (ids ascending)
        ids, done = {}, set()
        for i, pool in enumerate(plan.pools):
            for k in range(len(pool)):
                row = next(rows)
                ids[(i, k)] = row.id
                if row.state == "done":
                    done.add(row.id)
        journal.set_switch(self.store, switch.id, "running")
        log.get("executor").bind(switch=switch.id).info("switch_finish", skipped=len(done), reason=switch.reason)
        return self._run(plan, switch.id, ids, done, started)

    def _run(
        self, plan: Plan, switch_id: int, ids: dict[tuple[int, int], int], done: set[int], started: float
    ) -> ExecutionReport:
        """The pools in order, skipping the actions in `done`: a failed pool stops the switch, and
        a lost lease abandons it to the new holder without journalling its end."""
        logger = log.get("executor").bind(switch=switch_id)
        self._switch_id = switch_id
        report = ExecutionReport(switch_id=switch_id, state="done", pools_done=0)
        for index, pool in enumerate(plan.pools):
            if not self.still_ours():
                report.state = "abandoned"
                report.not_started = [a for later in plan.pools[index:] for a in later]
                break
            todo = [(a, ids[(index, k)]) for k, a in enumerate(pool) if ids[(index, k)] not in done]
            report.done.extend(a for k, a in enumerate(pool) if ids[(index, k)] in done)
            failed = self._run_pool(tuple(a for a, _ in todo), [rid for _, rid in todo], report)
            if failed:
                report.state = "failed" if self.still_ours() else "abandoned"
                report.not_started = [a for later in plan.pools[index + 1 :] for a in later]
                break
            report.pools_done += 1
        if report.state == "abandoned":
            logger.error(
                "switch_abandoned",
                summary=report.summary(),
                jobs=_jobs(plan.actions),
                why="the lease was lost: the switch is left to its new holder",
            )
            report.seconds = round(time.monotonic() - started, 3)
            return report
        self._set_switch(switch_id, report.state)
        report.seconds = round(time.monotonic() - started, 3)
        log_fn = logger.info if report.state == "done" else logger.error
        log_fn("switch_end", state=report.state, summary=report.summary(), jobs=_jobs(plan.actions))
        return report

    # -- one pool -------------------------------------------------------------------------
    def _run_pool(self, pool: tuple[PlanAction, ...], record_ids: list[int], report: ExecutionReport) -> bool:
        """One pool's actions in parallel (each multi-VM vjob's cut as one call, the others at their
        pipelined start offsets); every outcome goes into `report`; whether any failed."""
        ids = {id(a): rid for a, rid in zip(pool, record_ids, strict=True)}
        jobs, pool = _job_groups(pool) if isinstance(self.performer, JobPerformer) else ([], pool)
        schedule = start_offsets(pool, self.pipeline_interval_s)
        t0 = time.monotonic()
        futures: list[tuple[PlanAction, Future[None]]] = []
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, max(1, len(pool) + len(jobs)))) as workers:
            for group in jobs:  # a multi-VM job's cut: one call for all its VMs
                fut = workers.submit(self._perform_job, group, [ids[id(a)] for a in group])
                futures.extend((a, fut) for a in group)
            for offset, action in schedule:
                delay = t0 + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append((action, workers.submit(self._perform, action, ids[id(action)])))
        any_failed = False
        for action, fut in futures:
            error = fut.exception()
            if error is None:
                report.done.append(action)
            else:
                any_failed = True
                report.failed.append((action, str(error) or type(error).__name__))
        return any_failed

    def _perform(self, action: PlanAction, record_id: int) -> None:
        """One action through the performer, journalled running then done or failed, while the lease is ours."""
        if not self.still_ours():
            raise Abandoned(f"{action.kind.value} {action.vm}: not started, the lease was lost")
        journal.set_action(self.store, record_id, "running")
        try:
            if isinstance(self.performer, KeyedPerformer):
                self.performer.perform(action, action_key(self._switch_id, record_id))
            else:
                _dispatch(self.performer, action)
        except Exception as exc:  # any driver failure: journal it, then let the pool report it
            if isinstance(exc, Abandoned) or not self.still_ours():
                raise Abandoned(f"{action.kind.value} {action.vm}: left to the lease's new holder ({exc})") from exc
            journal.set_action(self.store, record_id, "failed", str(exc) or type(exc).__name__)
            log.get("executor").error("action_failed", action=action.kind.value, vm=action.vm, error=str(exc))
            raise
        if self.still_ours():  # else the new holder's recovery finds it running, and its pilot's answer
            journal.set_action(self.store, record_id, "done")

    def _perform_job(self, group: list[PlanAction], record_ids: list[int]) -> None:
        """The suspends or resumes of one multi-VM vjob, through the performer's coordinated
        path; each action is journalled as usual (all done, or all failed with the error)."""
        assert isinstance(self.performer, JobPerformer)
        if not self.still_ours():
            raise Abandoned(f"{group[0].kind.value} of {group[0].vjob}: not started, the lease was lost")
        for rid in record_ids:
            journal.set_action(self.store, rid, "running")
        try:
            if group[0].kind is Action.SUSPEND:
                self.performer.suspend_job(group)
            else:
                self.performer.resume_job(group)
        except Exception as exc:  # the cut failed (it rolled itself back): journal every action
            if isinstance(exc, Abandoned) or not self.still_ours():
                raise Abandoned(f"{group[0].vjob}: left to the lease's new holder ({exc})") from exc
            for rid in record_ids:
                journal.set_action(self.store, rid, "failed", str(exc) or type(exc).__name__)
            log.get("executor").error(
                "job_action_failed",
                action=group[0].kind.value,
                vjob=group[0].vjob,
                vms=[a.vm for a in group],
                error=str(exc),
            )
            raise
        if self.still_ours():
            for rid in record_ids:
                journal.set_action(self.store, rid, "done")

    # -- journal --------------------------------------------------------------------------
    def _journal_plan(self, plan: Plan, reason: str) -> tuple[int, dict[tuple[int, int], int]]:
        """Open the switch in the journal before any action: its id, and each (pool, position)'s action id."""
        keys = [(i, k) for i, pool in enumerate(plan.pools) for k in range(len(pool))]
        planned = [
            journal.PlannedAction(i, a.kind.value, a.vm, self.job_key(a), a.src, a.dst)
            for i, pool in enumerate(plan.pools)
            for a in pool
        ]
        recorded = plan.to_dict() | ({"executor": self.tag} if self.tag else {})
        switch_id, ids = journal.open_switch(self.store, reason, recorded, planned)
        return switch_id, dict(zip(keys, ids, strict=True))

    def _set_switch(self, switch_id: int, state: str) -> None:
        """Journal the switch's end state."""
        journal.set_switch(self.store, switch_id, state)


def _dispatch(performer: ActionPerformer, a: PlanAction) -> None:
    """The performer's method for the action's kind, with the nodes it needs."""
    if a.kind is Action.RUN:
        performer.run(a.vm, _node(a.dst, a))
    elif a.kind is Action.STOP:
        performer.stop(a.vm, _node(a.src, a))
    elif a.kind is Action.SUSPEND:
        performer.suspend(a.vm, _node(a.src, a))
    elif a.kind is Action.RESUME:
        performer.resume(a.vm, _node(a.dst, a), a.src)
    else:
        performer.migrate(a.vm, _node(a.src, a), _node(a.dst, a))


def _job_groups(pool: tuple[PlanAction, ...]) -> tuple[list[list[PlanAction]], tuple[PlanAction, ...]]:
    """The suspends (resumes) of each vjob with several VMs in the pool, and the other actions."""
    groups: dict[tuple[str, Action], list[PlanAction]] = {}
    for a in pool:
        if a.kind in (Action.SUSPEND, Action.RESUME) and a.vjob:
            groups.setdefault((a.vjob, a.kind), []).append(a)
    jobs = [sorted(g, key=lambda x: (x.node or "", x.vm)) for g in groups.values() if len(g) > 1]
    grouped = {id(a) for g in jobs for a in g}
    return jobs, tuple(a for a in pool if id(a) not in grouped)


def _node(value: str | None, a: PlanAction) -> str:
    """A node the action needs; ValueError naming the action when the plan gives none."""
    if value is None:
        raise ValueError(f"{a.kind.value} {a.vm}: the plan gives no node")
    return value


def _jobs(actions: list[PlanAction]) -> list[str]:
    """The vjobs a switch touches, for its log lines."""
    return sorted({a.vjob for a in actions if a.vjob})
