"""The agent's deadline duty each tick (docs/deadline.md): keep X, publish it for the submit
hooks, and act on running vjobs predicted to miss their deadline.

Pure decisions come from preemption.deadline; this module only holds the state between ticks
(the recent outcomes and headrooms behind an adaptive or cdf X) and proposes the actions
(`DeadlineKeeper.propose`); the arbiter (agent.arbiter) refuses some, and agent.deadline_actions
carries the rest out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.deadline_threshold import publish_problem, threshold_path, unwritable
from agent.metrics import AgentMetrics
from agent.status_file import write_status_file
from preemption.deadline import (
    Bounds,
    Continuation,
    Held,
    VOModel,
    adaptive_threshold,
    admit,
    cdf_threshold,
    continuation,
    failure_rate,
    held_verdict,
    job_kind,
    predicted_remaining,
    refit_vo_model,
    resume_x,
)
from preemption.deadline.threshold_file import write_threshold
from preemption.scheduling.tick import Release
from vjob import log
from vjob.config import Config
from vjob.errors import InputError, VjobError
from vjob.model import ClusterView, Job, JobState
from vjob.rms import RMSAdapter
from vjob.store import vo_observations
from vjob.store.db import Store

STATUS_NAME = "deadline.json"
"""Per-vjob deadline, x and prediction, rewritten each tick for `vjob status`."""

_log = log.get("agent.deadline")


@dataclass
class JobDeadline:
    job_id: str
    deadline: float
    x: float | None
    predicted_end: float | None
    decision: str
    done_s: float = 0.0
    """Bare seconds of its work done (run time / slowdown): kept when it is checkpointed."""


class Step(StrEnum):
    """What the duty proposes to do to one job this tick."""

    CANCEL_PARKED = "cancel_parked"
    """A job it checkpointed for its deadline that cannot make it even alone: cancel it."""
    CANCEL = "cancel"
    CHECKPOINT = "checkpoint"
    """Checkpoint its VM (the preemption path), or requeue it where it has none."""


@dataclass(frozen=True)
class DeadlineAction:
    job_id: str
    step: Step
    row: JobDeadline


@dataclass(frozen=True)
class DeadlineProposal:
    """What the duty proposes this tick: every evaluated job (its status) and the actions on
    them, in the view's order; the arbiter (agent.arbiter.deadline_checkpoints) refuses some."""

    rows: tuple[JobDeadline, ...]
    actions: tuple[DeadlineAction, ...]
    now: float
    refused: Mapping[str, str] = field(default_factory=dict)
    """job → why the arbiter refuses its checkpoint this tick (RULE_CLAIMS)."""

    @property
    def checkpoints(self) -> tuple[str, ...]:
        """The jobs it proposes to checkpoint."""
        return tuple(a.job_id for a in self.actions if a.step is Step.CHECKPOINT)


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
    observations: deque[vo_observations.Observation] = field(default_factory=deque)
    loaded: bool = False
    parked: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Jobs whose VM this agent checkpointed for their deadline → (bare seconds of work done,
    when): held until a placement with x < X exists (`releases`), cancelled when none can (in
    memory: a restarted agent releases them by the ordinary rule)."""
    given_up: set[str] = field(default_factory=set)
    """Parked jobs cancelled because no placement could save them: never released."""
    kinds: dict[str, str | None] = field(default_factory=dict)
    """Job → the VO model's kind it declares (`--comment=vjob:kind=cpu`), None: none or a
    bad one (then the worst kind is assumed); looked up once per job with a deadline."""
    metrics: AgentMetrics | None = None
    """Where a failed publication of X is counted (`vjob_agent_errors_total{kind="deadline_threshold"}`)."""
    publish_error: str = ""
    """Why X could not be published the last time ("" : it was): logged as an error when it changes."""

    def __post_init__(self) -> None:
        self.prior = self.vo
        d = self.cfg.deadline
        self.x = None if d.admission == "none" else d.static_x
        self.outcomes = deque(maxlen=d.window)
        self.headrooms = deque(maxlen=d.window * 20)
        self.observations = deque(self.observations, maxlen=d.vo_observations)

    @property
    def slowdown(self) -> float:
        """The hook's prediction factor for a job alone in a VM: the worst kind (it cannot tell)."""
        return self.vo.worst(0)

    def refit(self) -> VOModel:
        d = self.cfg.deadline
        return refit_vo_model(
            self.prior, self.observations, min_samples=d.vo_min_samples, max_slowdown=d.vo_max_slowdown
        )

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
                predicted = job.walltime * self.vo.worst(0, self.kinds.get(job.id))
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
            rows = vo_observations.recent(store, self.cfg.deadline.vo_observations)
        except VjobError as exc:
            _log.warning("cannot load the VO observations, retrying next tick", error=str(exc))
            return
        self.loaded = True
        self.observations.extend(reversed(rows))
        self.vo = self.refit()

    def learn_kinds(self, view: ClusterView, adapter: RMSAdapter) -> None:
        """The kind each job with a deadline declares in its comment, once per job, where the
        adapter shows the RMS's own fields (`job_fields`: Slurm's Comment). Why only those
        jobs: one RMS query each, and only their x depends on it (their finished runs then
        teach the VO model per kind)."""
        fields = getattr(adapter, "job_fields", None)
        present = {j.id for j in view.jobs}
        for job_id in [j for j in self.kinds if j not in present and j not in self.watched]:
            del self.kinds[job_id]
        if not callable(fields):
            return
        for job in view.jobs:
            if job.deadline is None or job.id in self.kinds:
                continue
            try:
                comment = fields(job.id).get("Comment", "")
            except (VjobError, LookupError) as exc:
                _log.info("cannot read the job's comment, retrying next tick", job=job.id, error=str(exc))
                continue
            try:
                self.kinds[job.id] = job_kind(comment if isinstance(comment, str) else "")
            except InputError as exc:
                _log.warning("job kind refused, assuming the worst kind", job=job.id, error=str(exc))
                self.kinds[job.id] = None

    def watch(self, view: ClusterView, store: Store | None, adapter: RMSAdapter) -> list[Job]:
        """Follow running jobs with a time limit. The view holds no finished job (adapters list
        pending to suspended), so a watched job that left it is looked up once (`adapter.job`,
        where the adapter has it: Slurm); if it completed — not cancelled, failed or acted on:
        their run time is not their work — record predicted vs actual and refit. Returns the
        finished jobs looked up, for `learn`."""
        sharing = _sharing(view)
        in_view = {j.id for j in view.jobs}
        for job in view.jobs:
            if job.state is JobState.RUNNING and job.walltime and job.start_time is not None:
                others = max((sharing.get(n, 1) - 1 for n in job.allocated_nodes), default=0)
                alone = self.vo.worst(0, self.kinds.get(job.id))
                predicted, colocated = self.watched.get(job.id, (job.walltime * alone, 0))
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
            self.vo = self.refit()
        return finished

    def observe(self, job: Job, actual: float, predicted: float, colocated: int, store: Store | None) -> bool:
        """One finished job's predicted vs actual, kept in memory and (store up) in the store;
        False when its figures are refused (job data: validated like any input)."""
        try:
            obs = vo_observations.validate(
                vo_observations.Observation(
                    job_id=job.id,
                    finished_at=job.end_time or 0.0,
                    kind=self.kinds.get(job.id),
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

    def evaluate(self, job: Job, now: float, neighbours: int = 0) -> JobDeadline | None:
        """x of a job with a deadline and a time limit, and what to do with it.

        A running job is judged at the slowdown of where it runs (`neighbours`: the most other
        jobs on one of its nodes); over X it is checkpointed only if it could make it in a VM
        alone, the checkpoint and restore (`checkpoint_s`) included — the simulator's rule, so
        a checkpoint is never taken for a job no placement can save. A job this agent
        checkpointed for its deadline (`parked`) is judged as it would resume alone: hold, or
        cancel when even that misses."""
        if job.deadline is None or not job.walltime:
            return None
        d = self.cfg.deadline
        left = job.deadline - now
        kind = self.kinds.get(job.id)
        solo = self.vo.worst(0, kind)
        if job.id in self.parked:
            done = self.parked[job.id][0]
            x = resume_x(job.walltime, done, solo, left, pause_s=d.checkpoint_s)
            verdict = held_verdict(x, None, self.x)
            remaining = predicted_remaining(job.walltime, done, solo) + d.checkpoint_s
            return JobDeadline(job.id, job.deadline, x, now + remaining, verdict.value, done)
        here = self.vo.worst(neighbours, kind)
        done = 0.0
        if job.state is JobState.RUNNING and job.start_time is not None:
            done = max(0.0, now - job.start_time) / here
        remaining = predicted_remaining(job.walltime, done, here)
        x = resume_x(job.walltime, done, here, left)
        decision = Continuation.CONTINUE
        if job.state is JobState.RUNNING:
            alone = resume_x(job.walltime, done, solo, left, pause_s=d.checkpoint_s)
            decision = continuation(
                x, self.x, action=d.action, can_meet_elsewhere=self.x is not None and admit(alone, self.x)
            )
        return JobDeadline(job.id, job.deadline, x, now + remaining, decision.value, done)

    def releases(self, view: ClusterView, offered: Sequence[Release], now: float | None = None) -> list[Release]:
        """The tick's releases, with each job this agent checkpointed for its deadline let go
        only onto a placement where x < X (held_verdict, the simulator's rule), pinned there.

        The placement: the nodes the pass resumes it on (its saved ones) when it names them,
        else the least busy usable nodes — the RMS, left to choose, may put it back beside the
        neighbours it was stopped for. Busy means running jobs on the node, as the RMS
        reports them (a node shared by several jobs slows each)."""
        offered = [rel for rel in offered if rel.job_id not in self.given_up]
        if not self.parked:
            return offered
        now = time.time() if now is None else now
        busy = _sharing(view)
        usable = sorted((n.name for n in view.nodes if n.state.usable), key=lambda n: (busy.get(n, 0), n))
        out: list[Release] = []
        for rel in offered:
            job = next((j for j in view.jobs if j.id == rel.job_id), None)
            if rel.job_id not in self.parked or job is None or job.deadline is None or not job.walltime:
                out.append(rel)  # not held for its deadline: the ordinary rule
                continue
            nodes = tuple(rel.preferred_nodes) or tuple(usable[: job.nodes])
            if len(nodes) < job.nodes:
                continue
            done, left = self.parked[job.id][0], job.deadline - now
            pause, kind = self.cfg.deadline.checkpoint_s, self.kinds.get(job.id)
            alone = resume_x(job.walltime, done, self.vo.worst(0, kind), left, pause_s=pause)
            neighbours = max(busy.get(n, 0) for n in nodes)
            here = resume_x(job.walltime, done, self.vo.worst(neighbours, kind), left, pause_s=pause)
            verdict = held_verdict(alone, here, self.x)
            _log.info(
                "deadline: checkpointed job offered a release",
                job=job.id,
                nodes=list(nodes),
                x=round(here, 3),
                X=self.x,
                verdict=verdict.value,
            )
            if verdict is Held.RELEASE:
                out.append(Release(job.id, nodes))
                for n in nodes:  # a second job released this tick counts the first as a neighbour
                    busy[n] = busy.get(n, 0) + 1
                usable.sort(key=lambda n: (busy.get(n, 0), n))
        return out

    def propose(
        self, view: ClusterView, adapter: RMSAdapter, *, act: bool, store: Store | None = None
    ) -> DeadlineProposal:
        """Learn, publish X, evaluate every job with a deadline; propose (`act`: the store up)
        to act on the running ones over X — cancel, or (action = checkpoint) checkpoint them —
        and to cancel a job it holds for its deadline that can no longer make it. Acting is
        agent.deadline_actions.carry_out's, after the arbiter."""
        now = time.time()
        self.load_observations(store)
        self.learn_kinds(view, adapter)
        self.learn(view, self.watch(view, store, adapter))
        path = threshold_path(self.cfg, self.rms)
        if path is not None and self.x is not None:
            try:
                write_threshold(path, self.x, self.slowdown, now, stale_after_s=self.cfg.deadline.stale_after_s)
            except OSError as exc:
                self.publish_failed(unwritable(path, exc))
            else:
                if self.publish_error:
                    _log.info("the deadline threshold is published again", path=str(path))
                self.publish_error = ""
        rows = []
        actions = []
        busy = _sharing(view)
        self.unpark(view)
        for job in view.jobs:
            running = job.state is JobState.RUNNING
            neighbours = max((busy.get(n, 1) - 1 for n in job.allocated_nodes), default=0) if running else 0
            row = self.evaluate(job, now, neighbours)
            if row is None:
                continue
            rows.append(row)
            if act and job.id in self.parked and row.decision == Held.CANCEL.value:
                actions.append(DeadlineAction(job.id, Step.CANCEL_PARKED, row))
            if not act or job.id in self.acted or row.decision == Continuation.CONTINUE.value:
                continue
            step = Step.CANCEL if row.decision == Continuation.CANCEL.value else Step.CHECKPOINT
            actions.append(DeadlineAction(job.id, step, row))
        return DeadlineProposal(tuple(rows), tuple(actions), now)

    def publish_failed(self, why: str) -> None:
        """Admission the operator turned on is off in fact: counted every time, logged as an
        error when it starts (or the reason changes), never silently."""
        if self.metrics is not None:
            self.metrics.errors.labels(kind="deadline_threshold").inc()
        if why != self.publish_error:
            _log.error("cannot publish the deadline threshold", error=why)
        self.publish_error = why

    def check_publishable(self) -> str:
        """At startup: publish_problem, reported like a failed publication."""
        why = publish_problem(self.cfg, self.rms)
        if why:
            self.publish_failed(why)
        return why

    def unpark(self, view: ClusterView) -> None:
        """Forget the parked jobs that left the view or run again (a run started after their
        checkpoint): from then on they are judged as any running job."""
        jobs = {j.id: j for j in view.jobs}
        self.given_up &= jobs.keys()
        for job_id, (_, at) in list(self.parked.items()):
            job = jobs.get(job_id)
            if job is None or (job.state is JobState.RUNNING and (job.start_time or 0) > at):
                del self.parked[job_id]

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
            write_status_file(path, doc)
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


def _sharing(view: ClusterView) -> dict[str, int]:
    """Running jobs per node, as the RMS reports them (a node shared by several slows each)."""
    sharing: dict[str, int] = {}
    for job in view.running:
        for node in job.allocated_nodes:
            sharing[node] = sharing.get(node, 0) + 1
    return sharing
