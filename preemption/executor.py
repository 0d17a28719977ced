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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from preemption.planner.plan import Plan, PlanAction
from vjob import log
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


@dataclass
class ExecutionReport:
    """What a switch did: `state` is done or failed; `failed` pairs each action with its error."""

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
    ) -> None:
        self.performer = performer
        self.store = store
        self.pipeline_interval_s = pipeline_interval_s
        self.max_parallel = max(1, max_parallel)
        self.job_key = job_key or (lambda a: a.vjob)

    def execute(self, plan: Plan, *, reason: str = "") -> ExecutionReport:
        started = time.monotonic()
        switch_id, ids = self._journal_plan(plan, reason)
        logger = log.get("executor").bind(switch=switch_id)
        logger.info("switch_start", pools=len(plan.pools), cost=plan.cost, reason=reason, jobs=_jobs(plan.actions))
        report = ExecutionReport(switch_id=switch_id, state="done", pools_done=0)
        for index, pool in enumerate(plan.pools):
            failed = self._run_pool(pool, [ids[(index, k)] for k in range(len(pool))], report)
            if failed:
                report.state = "failed"
                report.not_started = [a for later in plan.pools[index + 1 :] for a in later]
                break
            report.pools_done += 1
        self._set_switch(switch_id, report.state)
        report.seconds = round(time.monotonic() - started, 3)
        log_fn = logger.info if report.state == "done" else logger.error
        log_fn("switch_end", state=report.state, summary=report.summary(), jobs=_jobs(plan.actions))
        return report

    # -- one pool -------------------------------------------------------------------------
    def _run_pool(self, pool: tuple[PlanAction, ...], record_ids: list[int], report: ExecutionReport) -> bool:
        ids = {id(a): rid for a, rid in zip(pool, record_ids, strict=True)}
        schedule = start_offsets(pool, self.pipeline_interval_s)
        t0 = time.monotonic()
        futures: list[tuple[PlanAction, Future[None]]] = []
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, max(1, len(pool)))) as workers:
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
        journal.set_action(self.store, record_id, "running")
        try:
            _dispatch(self.performer, action)
        except Exception as exc:  # any driver failure: journal it, then let the pool report it
            journal.set_action(self.store, record_id, "failed", str(exc) or type(exc).__name__)
            log.get("executor").error("action_failed", action=action.kind.value, vm=action.vm, error=str(exc))
            raise
        journal.set_action(self.store, record_id, "done")

    # -- journal --------------------------------------------------------------------------
    def _journal_plan(self, plan: Plan, reason: str) -> tuple[int, dict[tuple[int, int], int]]:
        keys = [(i, k) for i, pool in enumerate(plan.pools) for k in range(len(pool))]
        planned = [
            journal.PlannedAction(i, a.kind.value, a.vm, self.job_key(a), a.src, a.dst)
            for i, pool in enumerate(plan.pools)
            for a in pool
        ]
        switch_id, ids = journal.open_switch(self.store, reason, plan.to_dict(), planned)
        return switch_id, dict(zip(keys, ids, strict=True))

    def _set_switch(self, switch_id: int, state: str) -> None:
        journal.set_switch(self.store, switch_id, state)


def _dispatch(performer: ActionPerformer, a: PlanAction) -> None:
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


def _node(value: str | None, a: PlanAction) -> str:
    if value is None:
        raise ValueError(f"{a.kind.value} {a.vm}: the plan gives no node")
    return value


def _jobs(actions: list[PlanAction]) -> list[str]:
    return sorted({a.vjob for a in actions if a.vjob})
