"""The deadline replay: jobs in VMs on nodes whose virtualisation overhead depends on what else
runs there; admission and continuation by the x-factor (preemption.deadline, the same pure
functions the agent and the Slurm hook's threshold use).

A separate engine from simulator/engine.py on purpose: the paper's model is per node (VMs share
a node and slow each other down) while the main engine's compiled path is per whole node and
knows no overhead; folding this in would change its hot path for everyone.

Time advances in ticks of `tick_s` (the paper's scheduler frequency). Each tick: arrivals are
admitted or refused, waiting jobs start where they fit, running jobs progress at 1/slowdown, a
job reaching its deadline unfinished is killed (the RMS's walltime), and — with VO management —
running jobs whose x-factor is at or over X are cancelled or checkpointed. The deadline is the
job's own, counted from its submission, or (`deadline_from = "start"`) the same allowance counted
from its first start on a node (preemption.deadline.clock; docs/deadline.md, two readings).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    predicted_remaining,
    resume_x,
    x_factor,
)
from preemption.deadline.clock import check_reading, counted_deadline
from simulator.deadline_workload import DJob
from vjob.errors import InputError

ADMISSIONS = ("none", "static", "adaptive", "cdf")


@dataclass(frozen=True, slots=True)
class DeadlineSetup:
    """One configuration (alg_1..alg_5, or a site's)."""

    name: str = "run"
    physical: bool = False
    """No virtualisation: slowdown 1 everywhere (alg_1)."""
    vo_managed: bool = True
    """Predict with the VO model: VO-aware placement and x-factor decisions (alg_3..5)."""
    admission: str = "static"
    action: str = "cancel"
    """Over the threshold while running: cancel, or checkpoint and resume where it can finish."""
    static_x: float = 0.1
    delta_x: float = 0.05
    target: float = 0.15
    x_min: float = 0.1
    x_max: float = 0.9
    probability: float = 0.8
    window: int = 100
    """Outcomes in the measured failure rate and the headroom history (jobs). The failure rate
    counts the jobs let run to their end that missed; a job the policy cancelled is its own
    decision, not a measurement (counting it closes a loop: lower X, more cancels, lower X)."""
    checkpoint_s: float = 120.0
    """Wall seconds a checkpoint and its resume cost a job (save, copy, restore)."""
    noise: float = 0.04
    """Per-job spread of the true overhead around the model (log-normal sigma)."""
    tick_s: float = 300.0
    seed: int = 1
    deadline_from: str = "submit"
    """Where the deadline clock starts (preemption.deadline.clock): `submit`, or `start` on a node."""
    trace_x: bool = False
    """Keep every update of X and what drove it (`DeadlineResult.updates`; costs a sort per cdf update)."""

    def __post_init__(self) -> None:
        if self.admission not in ADMISSIONS:
            raise InputError(f"--admission = {self.admission!r}: must be one of {', '.join(ADMISSIONS)}")
        if self.action not in ("cancel", "checkpoint"):
            raise InputError(f"deadline action = {self.action!r}: must be cancel or checkpoint")
        if self.tick_s <= 0 or self.window < 1:
            raise InputError(f"tick_s = {self.tick_s}, window = {self.window}: must be > 0 and >= 1")
        Bounds(self.x_min, self.x_max)
        check_reading(self.deadline_from)


@dataclass(frozen=True, slots=True)
class Cluster:
    """The replayed machine: identical nodes, each VM of a job taking its cores and memory on one."""

    nodes: int
    cores: int = 4
    mem_gb: float = 8.0


@dataclass
class _Run:
    """A job admitted to the replay: its progress, where it runs, and its x at each check."""

    job: DJob
    done: float = 0.0  # bare seconds of work done
    nodes: list[int] = field(default_factory=list)
    pause: float = 0.0  # seconds of no progress left (a resume)
    slow: float = 1.0  # true slowdown now
    checkpoints: int = 0
    started: float | None = None  # first start on a node
    deadline: float | None = None  # fixed once its clock runs (submit: at once; start: at first start)
    checks: list[tuple[float, float, float]] = field(default_factory=list)  # (t, predicted remaining, x)


@dataclass
class DeadlineResult:
    """The outcome counts of one replay (every job ends in exactly one) and X over time."""

    setup: DeadlineSetup
    total: int = 0
    succeeded: int = 0
    missed: int = 0  # killed at the deadline, or expired waiting
    rejected: int = 0
    cancelled: int = 0
    checkpointed: int = 0  # checkpoint events
    resumed_ok: int = 0  # jobs checkpointed at least once that then met their deadline
    series: list[tuple[float, float, float]] = field(default_factory=list)  # (hours, X, failure rate)
    updates: list[tuple[float, float, float, bool, float]] = field(default_factory=list)
    """With `trace_x`: each update of X as (hours, X before, X after, the outcome that triggered it,
    its driver: the measured failure rate (adaptive) or the unclipped headroom quantile (cdf))."""
    busy_core_s: float = 0.0
    wasted_core_s: float = 0.0  # core-seconds of jobs that did not succeed
    span_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        n = max(1, self.total)
        xs = [x for _, x, _ in self.series]
        return {
            "config": self.setup.name,
            "jobs": self.total,
            "success_rate": self.succeeded / n,
            "miss_rate": (self.missed + self.cancelled) / n,
            "rejected": self.rejected,
            "cancelled": self.cancelled,
            "missed": self.missed,
            "checkpointed": self.checkpointed,
            "checkpointed_then_met": self.resumed_ok,
            "rejected_rate": self.rejected / n,
            "wasted_core_hours": self.wasted_core_s / 3600,
            "busy_core_hours": self.busy_core_s / 3600,
            "span_hours": self.span_s / 3600,
            "x_final": xs[-1] if xs else None,
            "x_mean": sum(xs) / len(xs) if xs else None,
        }


class _Threshold:
    """X over time for one setup: static, adaptive (eq. 2) or from the headroom CDF."""

    def __init__(self, s: DeadlineSetup) -> None:
        self.s = s
        self.bounds = Bounds(s.x_min, s.x_max)
        self.outcomes: deque[bool] = deque(maxlen=s.window)
        self.headrooms: deque[float] = deque(maxlen=s.window * 20)
        self.x: float | None = None if s.admission == "none" else s.static_x
        self.updates: list[tuple[float, float, float, bool, float]] | None = [] if s.trace_x else None
        self.hours = 0.0  # the replay's clock, for `updates`

    def record(self, ok: bool, headrooms: list[float]) -> None:
        self.outcomes.append(ok)
        self.headrooms.extend(headrooms)
        s, before, driver = self.s, self.x, math.nan
        if s.admission == "adaptive" and self.x is not None:
            driver = failure_rate(self.outcomes)
            self.x = adaptive_threshold(self.x, target=s.target, measured=driver, delta_x=s.delta_x, bounds=self.bounds)
        elif s.admission == "cdf":
            self.x = cdf_threshold(self.headrooms, probability=s.probability, bounds=self.bounds, default=s.static_x)
            if self.updates is not None:  # where X would be without the bounds
                wide = Bounds(-1e9, 1e9)
                driver = cdf_threshold(self.headrooms, probability=s.probability, bounds=wide, default=s.static_x)
        if self.updates is not None and before is not None and self.x is not None and s.admission != "static":
            self.updates.append((self.hours, before, self.x, ok, driver))


def simulate_deadline(
    jobs: list[DJob],
    cluster: Cluster,
    setup: DeadlineSetup,
    vo: VOModel,
    progress: Callable[[int], None] | None = None,
) -> DeadlineResult:
    """Replay `jobs` (sorted by submit) and count successes, misses, refusals, cancellations."""
    return _Replay(jobs, cluster, setup, vo, progress).run()


class _Replay:
    """The state of one deadline replay (free cores and memory per node, the VMs' kinds per
    node, running and waiting jobs, X) and the four steps of a tick (module docstring).

    Every admission and continuation decision is a call to `preemption.deadline` (`admit`,
    `held_verdict`, `continuation`, `resume_x`, `predicted_remaining`, `x_factor`; X moves by
    `adaptive_threshold` / `cdf_threshold` over `failure_rate`), the functions the agent's
    deadline duty (agent/deadline.py) calls: there is no second copy of a rule to drift, which
    tests/test_deadline_simulate.py checks by name and by counting the calls of a replay."""

    def __init__(
        self,
        jobs: list[DJob],
        cluster: Cluster,
        setup: DeadlineSetup,
        vo: VOModel,
        progress: Callable[[int], None] | None,
    ) -> None:
        s = self.s = setup
        self.cluster, self.vo, self.progress = cluster, vo, progress
        self.true_vo = VOModel.physical() if s.physical else vo
        rng = random.Random(s.seed)
        self.noise = {j.id: rng.lognormvariate(0.0, s.noise) if s.noise > 0 and not s.physical else 1.0 for j in jobs}
        self.managed = s.vo_managed and not s.physical
        self.thr = _Threshold(s) if self.managed else None
        self.res = DeadlineResult(setup=s, total=len(jobs))
        self.free_cores = [cluster.cores] * cluster.nodes
        self.free_mem = [cluster.mem_gb] * cluster.nodes
        self.kinds_on: list[list[tuple[int, str]]] = [[] for _ in range(cluster.nodes)]  # (job id, kind) per VM
        self.running: dict[int, _Run] = {}
        self.waiting: list[_Run] = []
        self.dirty: set[int] = set()
        self.used: dict[int, float] = {}
        fits = [j for j in jobs if j.vms * j.cores <= cluster.nodes * cluster.cores and j.cores <= cluster.cores]
        self.res.rejected += len(jobs) - len(fits)  # can never run here
        self.arrivals = deque(sorted(fits, key=lambda j: j.submit))

    # -- the model --------------------------------------------------------------------------
    def neighbours(self, node: int, job_id: int) -> list[str]:
        out = [k for (_, k) in self.kinds_on[node]]
        # a job's own other VMs on the node count as neighbours; the VM itself does not
        for i, (jid, _) in enumerate(self.kinds_on[node]):
            if jid == job_id:
                del out[i]
                break
        return out

    def slowdown(self, model: VOModel, job: DJob, nodes: list[int]) -> float:
        return max(model.slowdown(job.kind, self.neighbours(n, job.id)) for n in set(nodes))

    def place(self, job: DJob) -> list[int] | None:
        """Nodes for each VM: first fit, or (VO-managed) least predicted harm."""
        cluster, vo, kinds_on = self.cluster, self.vo, self.kinds_on
        cores, mem = list(self.free_cores), list(self.free_mem)
        extra: dict[int, list[str]] = {}
        chosen: list[int] = []
        for _ in range(job.vms):
            best, best_cost = -1, math.inf
            for n in range(cluster.nodes):
                if cores[n] < job.cores or mem[n] < job.mem_gb - 1e-9:
                    continue
                if not self.managed:
                    best = n
                    break
                here = [k for _, k in kinds_on[n]] + extra.get(n, [])
                cost = vo.slowdown(job.kind, here) + sum(vo.pair[k][job.kind] for k in here)
                cost += 1e-3 * (cluster.cores - cores[n])  # then prefer the emptier node
                if cost < best_cost:
                    best, best_cost = n, cost
            if best < 0:
                return None
            cores[best] -= job.cores
            mem[best] -= job.mem_gb
            extra.setdefault(best, []).append(job.kind)
            chosen.append(best)
        return chosen

    def deadline(self, r: _Run, now: float) -> float:
        """The deadline in force at `now` under the setup's reading (fixed once the clock runs)."""
        if r.deadline is not None:
            return r.deadline
        j = r.job
        return counted_deadline(
            self.s.deadline_from, submit_s=j.submit, deadline_s=j.deadline, started_s=r.started, now_s=now
        )

    def predicted_x(self, r: _Run, now: float, nodes: list[int] | None, pending: bool) -> float:
        vo = self.vo
        if nodes is None:  # not placed: as if alone
            sd = 1.0 + vo.base[r.job.kind]
        elif pending:  # predicted on the nodes it would get, itself not yet there
            sd = max(
                vo.slowdown(r.job.kind, [k for _, k in self.kinds_on[n]] + [r.job.kind] * (nodes.count(n) - 1))
                for n in set(nodes)
            )
        else:
            sd = self.slowdown(vo, r.job, nodes)
        return resume_x(r.job.estimate, r.done, sd, self.deadline(r, now) - now, pause_s=r.pause)

    def start(self, r: _Run, nodes: list[int]) -> None:
        for n in nodes:
            self.free_cores[n] -= r.job.cores
            self.free_mem[n] -= r.job.mem_gb
            self.kinds_on[n].append((r.job.id, r.job.kind))
            self.dirty.add(n)
        r.nodes = nodes
        self.running[r.job.id] = r

    def stop(self, r: _Run) -> None:
        for n in r.nodes:
            self.free_cores[n] += r.job.cores
            self.free_mem[n] += r.job.mem_gb
            self.kinds_on[n].remove((r.job.id, r.job.kind))
            self.dirty.add(n)
        self.running.pop(r.job.id, None)
        r.nodes = []

    def finish(self, r: _Run, ok: bool, end: float | None, used_s: float, cancelled: bool = False) -> None:
        """Count the outcome; a job that ran to its end gives the threshold its headrooms: at each
        check, the largest x at which it would still have made it (a success: 1 − actual /
        predicted remaining; a miss: below the x it had, recorded as that bound)."""
        res = self.res
        core_s = used_s * r.job.vms * r.job.cores
        if ok:
            res.succeeded += 1
            if r.checkpoints:
                res.resumed_ok += 1
        else:
            res.wasted_core_s += core_s
        if self.thr is not None and not cancelled:
            if ok and end is not None:
                hs = [1.0 - (end - tc) / max(rp, 1.0) for tc, rp, _ in r.checks]
            else:
                hs = [xc for _, _, xc in r.checks]
            self.thr.record(ok, hs)
        if self.progress is not None:
            self.progress(1)

    # -- the steps of a tick ----------------------------------------------------------------
    def arrive(self, t: float) -> None:
        """1. Arrivals: admission at submission (x on the placement it would get now)."""
        thr = self.thr
        while self.arrivals and self.arrivals[0].submit <= t:
            job = self.arrivals.popleft()
            r = _Run(job=job)
            if self.s.deadline_from == "submit":
                r.deadline = job.deadline
            if thr is not None and thr.x is not None:
                x = self.predicted_x(r, job.submit, self.place(job), pending=True)
                if not admit(x, thr.x):
                    self.res.rejected += 1
                    if self.progress is not None:
                        self.progress(1)
                    continue
            self.waiting.append(r)

    def serve_waiting(self, t: float) -> None:
        """2. Waiting jobs: expire, cancel when hopeless, start where they fit."""
        res, thr, vo, used = self.res, self.thr, self.vo, self.used
        still: list[_Run] = []
        for r in self.waiting:
            if t >= self.deadline(r, t):
                res.missed += 1
                self.finish(r, False, None, used.get(r.job.id, 0.0))
                continue
            limit = thr.x if thr is not None else None
            left = self.deadline(r, t) - t
            x_alone = resume_x(r.job.estimate, r.done, 1.0 + vo.base[r.job.kind], left, pause_s=r.pause)
            if limit is not None and held_verdict(x_alone, None, limit) is Held.CANCEL:  # hopeless anywhere
                res.cancelled += 1
                self.finish(r, False, None, used.get(r.job.id, 0.0), cancelled=True)
                continue
            nodes = self.place(r.job)
            if nodes is None:
                still.append(r)
                continue
            x = self.predicted_x(r, t, nodes, pending=True)
            if r.checkpoints and held_verdict(x_alone, x, limit) is not Held.RELEASE:
                still.append(r)  # a checkpointed job resumes only where it can make it (the agent's rule too)
                continue
            sd = max(vo.slowdown(r.job.kind, [k for _, k in self.kinds_on[n]]) for n in set(nodes))
            predicted = predicted_remaining(r.job.estimate, r.done, sd) + r.pause  # at (re)start
            r.checks.append((t, predicted, x))
            if r.started is None:  # its clock starts here under the start reading
                r.started = t
                r.deadline = self.deadline(r, t)
            self.start(r, nodes)
        self.waiting = still

    def advance(self, t: float) -> float:
        """3. Progress over one tick at the true slowdown; finish, or kill at the deadline.
        Returns the next tick's time."""
        res, used, s = self.res, self.used, self.s
        for n in self.dirty:
            for jid, _ in self.kinds_on[n]:
                rr = self.running[jid]
                rr.slow = self.slowdown(self.true_vo, rr.job, rr.nodes) * self.noise[jid]
        self.dirty.clear()
        nxt = t + s.tick_s
        for jid in list(self.running):
            r = self.running[jid]
            deadline = self.deadline(r, t)
            dt = s.tick_s
            pause = min(r.pause, dt)
            r.pause -= pause
            work = (dt - pause) / r.slow
            if r.done + work >= r.job.duration:
                end = t + pause + (r.job.duration - r.done) * r.slow
                used[jid] = used.get(jid, 0.0) + (end - t)
                res.busy_core_s += (end - t) * r.job.vms * r.job.cores
                ok = end <= deadline
                end_at = min(end, deadline)
                self.stop(r)
                if ok:
                    self.finish(r, True, end, used[jid])
                else:
                    res.missed += 1
                    self.finish(r, False, None, used[jid] - (end - end_at))
                continue
            if nxt >= deadline:
                used[jid] = used.get(jid, 0.0) + (deadline - t)
                res.busy_core_s += (deadline - t) * r.job.vms * r.job.cores
                self.stop(r)
                res.missed += 1
                self.finish(r, False, None, used[jid])
                continue
            r.done += work
            used[jid] = used.get(jid, 0.0) + dt
            res.busy_core_s += dt * r.job.vms * r.job.cores
        return nxt

    def continue_or_stop(self, t: float, x_limit: float) -> None:
        """4. Continuation: each running job's x now against X; cancel or checkpoint it."""
        s, vo = self.s, self.vo
        for jid in list(self.running):
            r = self.running[jid]
            sd_now = self.slowdown(vo, r.job, r.nodes)
            rem = predicted_remaining(r.job.estimate, r.done, sd_now) + r.pause
            left = self.deadline(r, t) - t
            x = x_factor(rem, left)
            r.checks.append((t, rem, x))
            alone = resume_x(r.job.estimate, r.done, 1.0 + vo.base[r.job.kind], left, pause_s=s.checkpoint_s)
            c = continuation(x, x_limit, action=s.action, can_meet_elsewhere=admit(alone, x_limit))
            if c is Continuation.CANCEL:
                self.stop(r)
                self.res.cancelled += 1
                self.finish(r, False, None, self.used.get(jid, 0.0), cancelled=True)
            elif c is Continuation.CHECKPOINT:
                self.stop(r)
                self.res.checkpointed += 1
                r.checkpoints += 1
                r.pause += s.checkpoint_s
                self.waiting.insert(0, r)

    def run(self) -> DeadlineResult:
        """Ticks until every job has an outcome; X and the failure rate sampled every 10 h."""
        res, thr = self.res, self.thr
        t = self.arrivals[0].submit if self.arrivals else 0.0
        t0 = next_series = t
        while self.arrivals or self.running or self.waiting:
            if thr is not None:
                thr.hours = (t - t0) / 3600
            self.arrive(t)
            self.serve_waiting(t)
            t = self.advance(t)
            if thr is not None and thr.x is not None:
                self.continue_or_stop(t, thr.x)
            if t >= next_series:
                fr = failure_rate(thr.outcomes) if thr is not None else 0.0
                res.series.append(
                    ((t - t0) / 3600, thr.x if thr is not None and thr.x is not None else float("nan"), fr)
                )
                next_series = t + 10 * 3600
            if not self.running and not self.waiting and self.arrivals and self.arrivals[0].submit > t:
                t = self.arrivals[0].submit  # idle: jump to the next arrival
        res.span_s = t - t0
        if thr is not None and thr.updates is not None:
            res.updates = thr.updates
        return res
