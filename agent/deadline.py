"""The agent's deadline duty each tick (docs/deadline.md): keep X, publish it for the submit
hooks, and act on running vjobs predicted to miss their deadline.

Pure decisions come from preemption.deadline; this module only holds the state between ticks
(the recent outcomes and headrooms behind an adaptive or cdf X) and performs the actions.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preemption.deadline import (
    Bounds,
    Continuation,
    VOModel,
    adaptive_threshold,
    cdf_threshold,
    continuation,
    failure_rate,
    predicted_remaining,
    refit_vo_model,
    x_factor,
)
from preemption.deadline.threshold_file import THRESHOLD_NAME, write_threshold
from vjob import log
from vjob.config import Config
from vjob.errors import VjobError
from vjob.model import ClusterView, Job, JobState
from vjob.rms import RMSAdapter
from vjob.store import vo_observations
from vjob.store.db import Store

STATUS_NAME = "deadline.json"
"""Per-vjob deadline, x and prediction, rewritten each tick for `vjob status`."""
OBSERVATIONS_KEPT = 1000
"""Newest finished-job observations the VO model is refitted from (the store keeps more)."""

_log = log.get("agent.deadline")


def threshold_path(cfg: Config, rms: str) -> Path | None:
    """Where the hook reads X: [deadline] threshold_file, else beside slurm.conf on Slurm."""
    if cfg.deadline.threshold_file:
        return Path(cfg.deadline.threshold_file)
    if rms == "slurm":
        return Path(cfg.slurm.conf or "/etc/slurm/slurm.conf").parent / THRESHOLD_NAME
    return None


@dataclass
class JobDeadline:
    job_id: str
    deadline: float
    x: float | None
    predicted_end: float | None
    decision: str


@dataclass
class DeadlineKeeper:
    cfg: Config
    rms: str
    vo: VOModel = field(default_factory=VOModel.default)
    x: float | None = None
    outcomes: deque[bool] = field(default_factory=lambda: deque(maxlen=100))
    headrooms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    seen_done: set[str] = field(default_factory=set)
    acted: set[str] = field(default_factory=set)
    prior: VOModel = field(init=False)
    """The model given (`vo`), in force until enough jobs have finished to refit it."""
    watched: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Running job → (predicted run time when first seen running, most co-located jobs seen)."""
    observations: deque[vo_observations.Observation] = field(default_factory=lambda: deque(maxlen=OBSERVATIONS_KEPT))
    loaded: bool = False

    def __post_init__(self) -> None:
        self.prior = self.vo
        d = self.cfg.deadline
        self.x = None if d.admission == "none" else d.static_x
        self.outcomes = deque(maxlen=d.window)
        self.headrooms = deque(maxlen=d.window * 20)

    @property
    def slowdown(self) -> float:
        """The hook's prediction factor for a job alone in a VM: the worst kind (it cannot tell)."""
        return max(self.vo.slowdown(k) for k in self.vo.base)

    def learn(self, view: ClusterView, finished: Sequence[Job] = ()) -> None:
        """Count finished jobs with a deadline (once each) and move X (adaptive, cdf)."""
        d = self.cfg.deadline
        for job in (*view.jobs, *finished):
            if job.deadline is None or job.id in self.seen_done or job.id in self.acted:
                continue
            if job.state is not JobState.COMPLETED or job.end_time is None:
                continue
            self.seen_done.add(job.id)
            ok = job.end_time <= job.deadline
            self.outcomes.append(ok)
            if job.start_time is not None and job.walltime:
                predicted = job.walltime * self.slowdown
                self.headrooms.append(1.0 - (job.end_time - job.start_time) / predicted if ok else -1.0)
            if d.admission == "adaptive" and self.x is not None:
                self.x = adaptive_threshold(
                    self.x,
                    target=d.target_failure,
                    measured=failure_rate(self.outcomes),
                    delta_x=d.delta_x,
                    bounds=Bounds(d.x_min, d.x_max),
                )
            elif d.admission == "cdf":
                self.x = cdf_threshold(
                    self.headrooms, probability=d.cdf_probability, bounds=Bounds(d.x_min, d.x_max), default=d.static_x
                )

    def load_observations(self, store: Store | None) -> None:
        """Once, from the store: the observations of earlier runs, so a restarted agent starts
        from the learned model rather than the prior."""
        if self.loaded or store is None:
            return
        try:
            rows = vo_observations.recent(store, OBSERVATIONS_KEPT)
        except VjobError as exc:
            _log.warning("cannot load the VO observations, retrying next tick", error=str(exc))
            return
        self.loaded = True
        self.observations.extend(reversed(rows))
        self.vo = refit_vo_model(self.prior, self.observations)

    def watch(self, view: ClusterView, store: Store | None, adapter: RMSAdapter) -> list[Job]:
        """Follow running jobs with a time limit. The view holds no finished job (adapters list
        pending to suspended), so a watched job that left it is looked up once (`adapter.job`,
        where the adapter has it: Slurm); if it completed — not cancelled, failed or acted on:
        their run time is not their work — record predicted vs actual and refit. Returns the
        finished jobs looked up, for `learn`."""
        sharing: dict[str, int] = {}
        for job in view.running:
            for node in job.allocated_nodes:
                sharing[node] = sharing.get(node, 0) + 1
        in_view = {j.id for j in view.jobs}
        for job in view.jobs:
            if job.state is JobState.RUNNING and job.walltime and job.start_time is not None:
                others = max((sharing.get(n, 1) - 1 for n in job.allocated_nodes), default=0)
                predicted, colocated = self.watched.get(job.id, (job.walltime * self.slowdown, 0))
                self.watched[job.id] = (predicted, max(colocated, others))
            else:
                self.watched.pop(job.id, None)  # requeued, suspended: this run is not a whole one
        left = sorted(set(self.watched) - in_view)
        known = _finished_jobs(adapter, left)
        finished: list[Job] = []
        learned = False
        for job_id in left:
            predicted, colocated = self.watched.pop(job_id)
            job = known.get(job_id)
            if job is None or job_id in self.acted or not job.state.finished:
                continue
            finished.append(job)
            if job.state is JobState.COMPLETED and job.start_time is not None and job.end_time is not None:
                learned |= self.observe(job, job.end_time - job.start_time, predicted, colocated, store)
        if learned:
            self.vo = refit_vo_model(self.prior, self.observations)
        return finished

    def observe(self, job: Job, actual: float, predicted: float, colocated: int, store: Store | None) -> bool:
        """One finished job's predicted vs actual, kept in memory and (store up) in the store;
        False when its figures are refused (job data: validated like any input)."""
        try:
            obs = vo_observations.validate(
                vo_observations.Observation(
                    job_id=job.id,
                    finished_at=job.end_time or 0.0,
                    kind=None,
                    colocated=colocated,
                    walltime_s=job.walltime or 0.0,
                    predicted_s=predicted,
                    actual_s=actual,
                )
            )
        except VjobError as exc:
            _log.warning("VO observation refused", job=job.id, error=str(exc))
            return False
        self.observations.append(obs)
        if store is not None:
            try:
                vo_observations.record(store, obs)
            except VjobError as exc:
                _log.warning("cannot record the VO observation", job=job.id, error=str(exc))
        return True

    def evaluate(self, job: Job, now: float) -> JobDeadline | None:
        """x of a running or pending job with a deadline and a time limit, and what to do."""
        if job.deadline is None or not job.walltime:
            return None
        done = 0.0
        if job.state is JobState.RUNNING and job.start_time is not None:
            done = max(0.0, now - job.start_time) / self.slowdown
        remaining = predicted_remaining(job.walltime, done, self.slowdown)
        x = x_factor(remaining, job.deadline - now)
        decision = Continuation.CONTINUE
        if job.state is JobState.RUNNING:
            best = x_factor(predicted_remaining(job.walltime, done, 1.0), job.deadline - now)
            decision = continuation(
                x, self.x, action=self.cfg.deadline.action, can_meet_elsewhere=self.x is not None and best < self.x
            )
        return JobDeadline(job.id, job.deadline, x, now + remaining, decision.value)

    def tick(
        self,
        view: ClusterView,
        adapter: RMSAdapter,
        *,
        act: bool,
        checkpoint: Callable[[str, str], bool] | None = None,
        store: Store | None = None,
    ) -> list[JobDeadline]:
        """Learn, publish X, evaluate every job with a deadline; act on the running ones over X:
        cancel, or (action = checkpoint) checkpoint them. `checkpoint(job_id, reason)` is the
        agent's preemption path (agent.act.checkpoint_vjob): the VM is saved by its pilot, the
        job requeue-held and released later, so it resumes where it was. It answers False for a
        job without a VM (nothing to save): that one is requeued through the RMS and restarts."""
        now = time.time()
        self.load_observations(store)
        self.learn(view, self.watch(view, store, adapter))
        path = threshold_path(self.cfg, self.rms)
        if path is not None and self.x is not None:
            try:
                write_threshold(path, self.x, self.slowdown, now, stale_after_s=self.cfg.deadline.stale_after_s)
            except OSError as exc:
                _log.warning("cannot publish the deadline threshold", path=str(path), error=str(exc))
        rows = []
        for job in view.jobs:
            row = self.evaluate(job, now)
            if row is None:
                continue
            rows.append(row)
            if not act or job.id in self.acted or row.decision == Continuation.CONTINUE.value:
                continue
            try:
                if row.decision == Continuation.CANCEL.value:
                    adapter.cancel(job.id)
                elif checkpoint is not None and checkpoint(job.id, _reason(row, self.x)):
                    pass  # saved and requeue-held; the tick's releases resume it
                elif adapter.abilities.requeue_hold:
                    adapter.requeue_hold(job.id)
                    adapter.release(job.id)
                else:
                    continue
            except VjobError as exc:
                _log.error("deadline action failed, retrying next tick", job=job.id, error=str(exc))
                continue
            self.acted.add(job.id)
            _log.info(
                "deadline: job predicted to miss", job=job.id, x=round(row.x or 0, 3), X=self.x, action=row.decision
            )
        self.write_status(rows, now)
        return rows

    def write_status(self, rows: list[JobDeadline], now: float) -> None:
        doc: dict[str, Any] = {
            "at": now,
            "X": self.x,
            "admission": self.cfg.deadline.admission,
            "failure_rate": failure_rate(self.outcomes),
            "vo_model": self.model_summary(),
            "jobs": {
                r.job_id: {"deadline": r.deadline, "x": r.x, "predicted_end": r.predicted_end, "decision": r.decision}
                for r in rows
            },
        }
        path = self.cfg.data_path / STATUS_NAME
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            _log.warning("cannot write the deadline status", path=str(path), error=str(exc))

    def model_summary(self) -> dict[str, Any]:
        """What `vjob status` shows of the VO model: where it comes from, on how many finished
        jobs, and the slowdown the hooks are given."""
        return {
            "source": self.vo.source,
            "observations": len(self.observations),
            "slowdown": round(self.slowdown, 4),
            "base": {k: round(v, 4) for k, v in self.vo.base.items()},
            "per_neighbour": {k: round(self.vo.pair[k][k], 4) for k in self.vo.pair},
            "learned": list(self.vo.meta.get("learned", [])),
        }


def _finished_jobs(adapter: RMSAdapter, job_ids: list[str]) -> dict[str, Job]:
    """The final record of jobs that left the view: one `all_jobs()` (Slurm: squeue keeps
    finished jobs for MinJobAge) where the adapter has it, else `job(id)` each; adapters with
    neither (PBS, OAR today) give nothing, so nothing is learned there."""
    if not job_ids:
        return {}
    every = getattr(adapter, "all_jobs", None)
    one = getattr(adapter, "job", None)
    found: dict[str, Job] = {}
    if callable(every):
        try:
            wanted = set(job_ids)
            return {j.id: j for j in every() if isinstance(j, Job) and j.id in wanted}
        except VjobError as exc:
            _log.info("cannot look up finished jobs", jobs=job_ids[:10], error=str(exc))
            return {}
    if callable(one):
        for job_id in job_ids:
            try:
                job = one(job_id)
            except (VjobError, LookupError):
                continue  # purged already: nothing to learn from it
            if isinstance(job, Job):
                found[job_id] = job
    return found


def _reason(row: JobDeadline, threshold: float | None) -> str:
    """The journal's reason for a deadline checkpoint (what `vjob status` shows of the switch)."""
    x, limit = row.x or 0.0, threshold or 0.0
    return f"deadline: job {row.job_id} predicted to miss its deadline (x = {x:.2f} >= X = {limit:.2f})"
