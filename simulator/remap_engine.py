"""A heterogeneous replay: FCFS-EASY "fastest free sub-cluster first", with or without ARRIVE-F.

Why a separate engine (not simulator/engine.py): the vjob engine models one homogeneous
machine of interchangeable nodes; here a job runs inside one sub-cluster at that
sub-cluster's speed for its kind, and a running job can change sub-cluster. The remapping
decisions are preemption.remap.decide's, the same pure function the agent would call.

The model, stated once:
- a job has a kind, a size in cores (one VM per core, within one sub-cluster) and a
  reference run time (the trace's); on sub-cluster X it runs `Farm.runtime_factor(kind, X)`
  times that (thrashing included); progress is a fraction of the job done;
- the baseline starts the queue head on the fastest (lowest rank) sub-cluster with room, else
  reserves the sub-cluster where it can start first and backfills (EASY) the others in queue
  order, each on the fastest sub-cluster with room that does not delay the reservation; run
  time estimates are exact (the reference time × the factor);
- ARRIVE-F runs the same scheduler and, every τ, gives the policy every job that has run a
  whole window on its sub-cluster (no offline phase): its gain per window towards each other
  sub-cluster, τ × (1 − factor_Y / factor_X), perturbed once per (job, source, destination)
  by a uniform error of ±(1 − accuracy) of its kind (the paper's measured prediction
  accuracy), and whether it thrashes. Free slots of the sub-cluster reserved for the queue
  head are not offered to it, so remapping never delays the head's reservation;
- a migration costs each migrated job `migration_cost_s(memory of one VM, bandwidth)` seconds
  of lost progress (its VMs migrate in parallel); the job must then be profiled a whole
  window again before it can move again.

With `policy="vjob"` the scheduler is vjob's, reduced to what matters on a farm of kinds:
interactive jobs (`interactive`, a flag per job) go first in the queue and, when they fit
nowhere, checkpoint running batch jobs of one sub-cluster (the fastest where enough can be
freed; most recently started first, never a job migrating or resuming) and start there once
the checkpoints are written (a VM's memory / `checkpoint_mb_s`); the victims wait at the head
of the batch queue with their progress and resume anywhere (a read of their state, twice as
long on another sub-cluster). The remap pass of an instant where the pass acted obeys the
pass's claims, `preemption.remap.claims` — the agent's rule, with a sub-cluster for a node
(the simulator's slots are interchangeable within one): no decision on a job the pass
suspends, nor on a job in a sub-cluster the pass gives to a job it starts or resumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from preemption.remap.claims import PassClaims, remappable
from preemption.remap.live import Placement
from preemption.remap.models import migration_cost_s
from preemption.remap.policy import Decision, RemapParams, RunningJob, decide
from simulator.lublin import generate
from simulator.subclusters import Farm
from simulator.workload import Workload

Remap = Literal["none", "arrive-f"]
REMAPS: tuple[str, ...] = ("none", "arrive-f")
POLICIES: tuple[str, ...] = ("fcfs-easy", "vjob")
"""fcfs-easy: the paper's baseline (fastest free sub-cluster first); vjob: interactive jobs first,
preempting batch ones by checkpoint (module docstring)."""
BACKFILL_DEPTH = 200


@dataclass(frozen=True)
class RemapJobs:
    """The jobs of one replay: submit (s), size (cores), kind index, reference run time (s)."""

    submit: np.ndarray
    slots: np.ndarray
    kind: np.ndarray
    runtime: np.ndarray


def jobs_from_workload(workload: Workload, farm: Farm, seed: int) -> RemapJobs:
    """Kinds drawn by the farm's weights (seeded); sizes clipped to the largest sub-cluster."""
    rng = np.random.default_rng(seed)
    weights = np.array([k.weight for k in farm.kinds], dtype=float)
    kind = rng.choice(len(farm.kinds), size=len(workload), p=weights / weights.sum())
    biggest = max(s.slots for s in farm.subclusters)
    order = np.argsort(workload.submit, kind="stable")
    return RemapJobs(
        submit=workload.submit[order].astype(float),
        slots=np.clip(workload.nodes[order], 1, biggest).astype(int),
        kind=kind,
        runtime=np.maximum(1.0, workload.runtime[order].astype(float)),
    )


@dataclass
class RemapResult:
    """Per-job start/end and what the remapping did, plus the figures of docs/remap.md."""

    remap: str
    submit: np.ndarray
    start: np.ndarray
    end: np.ndarray
    migrations: np.ndarray
    decisions: dict[str, int] = field(default_factory=dict)
    busy_core_s: float = 0.0
    cores: int = 0
    policy: str = "fcfs-easy"
    preemptions: np.ndarray | None = None
    interactive: np.ndarray | None = None

    def summary(self) -> dict[str, float | int | str | dict[str, int]]:
        n = len(self.submit)
        makespan = float(self.end.max() - self.submit.min()) if n else 0.0
        return {
            "remap": self.remap,
            "jobs": n,
            "makespan_s": makespan,
            "throughput_jobs_h": n / (makespan / 3600.0) if makespan > 0 else 0.0,
            "mean_wait_s": float(np.mean(self.start - self.submit)) if n else 0.0,
            "mean_turnaround_s": float(np.mean(self.end - self.submit)) if n else 0.0,
            "utilisation": self.busy_core_s / (self.cores * makespan) if makespan > 0 else 0.0,
            "migrations": int(self.migrations.sum()),
            "jobs_migrated": int((self.migrations > 0).sum()),
            "decisions": dict(self.decisions),
            "policy": self.policy,
            "preemptions": int(self.preemptions.sum()) if self.preemptions is not None else 0,
            "mean_wait_interactive_s": self._wait(True),
            "mean_wait_batch_s": self._wait(False),
        }

    def _wait(self, interactive: bool) -> float:
        if self.interactive is None:
            return float(np.mean(self.start - self.submit)) if len(self.submit) and not interactive else 0.0
        sel = self.interactive == interactive
        return float(np.mean(self.start[sel] - self.submit[sel])) if sel.any() else 0.0


def simulate(
    farm: Farm,
    jobs: RemapJobs,
    remap: Remap,
    params: RemapParams | None = None,
    *,
    seed: int = 1,
    migrate_bandwidth_mb_s: float = 110.0,
    advance: Callable[[int], None] | None = None,
    policy: str = "fcfs-easy",
    interactive: np.ndarray | None = None,
    checkpoint_mb_s: float = 500.0,
) -> RemapResult:
    """Replay `jobs` on `farm`; `advance(n)` is called with the number of jobs finished so far.
    `policy` "vjob" with `interactive` (a flag per job): interactive jobs preempt (docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: the heterogeneous replay runs {', '.join(POLICIES)}")
    params = params or RemapParams()
    subs = farm.subclusters
    C = len(subs)
    names = [s.name for s in subs]
    n = len(jobs.submit)
    factor = np.array([[farm.runtime_factor(k, s) for s in subs] for k in farm.kinds])  # kind × cluster
    thrash = np.array([[k.memory_mb_per_core > s.memory_mb_per_slot for s in subs] for k in farm.kinds])
    acc = np.array([k.accuracy for k in farm.kinds])
    rng = np.random.default_rng(seed)
    err = rng.uniform(-1.0, 1.0, size=(n, C, C)) * (1.0 - acc[jobs.kind])[:, None, None]
    mig_s = np.array([migration_cost_s(k.memory_mb_per_core, migrate_bandwidth_mb_s) for k in farm.kinds])
    mem_slot = {s.name: s.memory_mb_per_slot for s in subs}
    vjob = policy == "vjob"
    inter = np.zeros(n, dtype=bool) if interactive is None else np.asarray(interactive, dtype=bool)
    ck_s = np.array([k.memory_mb_per_core / checkpoint_mb_s for k in farm.kinds])
    preempted = np.zeros(n, dtype=int)
    saved_on = np.full(n, -1)
    seg = np.zeros(n)
    claimed: dict[str, set[str]] = {"suspending": set(), "given": set()}  # the vjob pass, this instant

    free = [s.slots for s in subs]
    cluster = np.full(n, -1)
    done = np.zeros(n)
    last = np.zeros(n)
    paused = np.zeros(n)
    on_since = np.zeros(n)
    start = np.full(n, math.nan)
    end = np.full(n, math.nan)
    migrations = np.zeros(n, dtype=int)
    running: set[int] = set()
    queue: list[int] = []
    decisions: dict[str, int] = {}
    busy = 0.0
    next_arrival = 0
    finished = 0
    t = 0.0
    next_tick = math.inf

    def rate(j: int, c: int) -> float:
        return 1.0 / (jobs.runtime[j] * factor[jobs.kind[j], c])

    def update(j: int, now: float) -> None:
        eff = max(0.0, now - max(last[j], paused[j]))
        done[j] = min(1.0, done[j] + eff * rate(j, cluster[j]))
        last[j] = now

    def end_time(j: int) -> float:
        return max(last[j], paused[j]) + (1.0 - done[j]) / rate(j, cluster[j])

    def place(j: int, c: int, now: float, delay: float = 0.0) -> None:
        cluster[j] = c
        free[c] -= jobs.slots[j]
        if saved_on[j] >= 0:  # a checkpointed job resumes: its state is read, twice as long elsewhere
            delay += ck_s[jobs.kind[j]] * (1.0 if saved_on[j] == c else 2.0)
            saved_on[j] = -1
        if math.isnan(start[j]):
            start[j] = now
        seg[j] = now
        last[j] = now
        paused[j] = now + delay
        on_since[j] = now + delay
        running.add(j)
        if vjob:
            claimed["given"].add(names[c])

    def preempt(h: int, now: float) -> bool:
        """Interactive `h` fits nowhere: checkpoint batch jobs of the fastest sub-cluster where
        enough can be freed (most recent first; not one migrating or resuming) and start it there."""
        nonlocal busy
        for c in range(C):
            if subs[c].slots < jobs.slots[h]:
                continue
            cands = sorted((j for j in running if cluster[j] == c and not inter[j] and paused[j] <= now),
                           key=lambda j: (-start[j], j))  # fmt: skip
            victims, room = [], free[c]
            for j in cands:
                if room >= jobs.slots[h]:
                    break
                victims.append(j)
                room += jobs.slots[j]
            if room < jobs.slots[h]:
                continue
            for v in victims:
                update(v, now)
                running.discard(v)
                free[c] += jobs.slots[v]
                busy += (now - seg[v]) * jobs.slots[v]
                saved_on[v] = c
                preempted[v] += 1
                queue.append(v)
                claimed["suspending"].add(str(v))
            queue.remove(h)
            place(h, c, now, max((ck_s[jobs.kind[v]] for v in victims), default=0.0))
            return True
        return False

    def schedule(now: float) -> int | None:
        """Start what can start; the index of the reserved sub-cluster (None: no reservation)."""
        if vjob:  # interactive first, then by submission (a checkpointed job keeps its place)
            queue.sort(key=lambda j: (not inter[j], j))
            while queue and inter[queue[0]] and not any(free[c] >= jobs.slots[queue[0]] for c in range(C)):
                if not preempt(queue[0], now):
                    break
                queue.sort(key=lambda j: (not inter[j], j))
        while queue:
            h = queue[0]
            c = next((c for c in range(C) if free[c] >= jobs.slots[h]), None)
            if c is None:
                break
            place(h, c, now)
            queue.pop(0)
        if not queue:
            return None
        h = queue[0]
        best: tuple[float, int, int] | None = None
        for c in range(C):
            if subs[c].slots < jobs.slots[h]:
                continue
            avail = free[c]
            shadow = now
            for e, j in sorted((end_time(j), j) for j in running if cluster[j] == c):
                if avail >= jobs.slots[h]:
                    break
                avail += jobs.slots[j]
                shadow = e
            if best is None or shadow < best[0]:
                best = (shadow, c, avail - jobs.slots[h])
        if best is None:
            return None
        shadow, c_res, extra = best
        for j in list(queue[1:BACKFILL_DEPTH]):
            for c in range(C):
                if free[c] < jobs.slots[j]:
                    continue
                ends = now + jobs.runtime[j] * factor[jobs.kind[j], c]
                if c != c_res or ends <= shadow or jobs.slots[j] <= extra:
                    if c == c_res and ends > shadow:
                        extra -= jobs.slots[j]
                    place(j, c, now)
                    queue.remove(j)
                    break
        return c_res

    cache: dict[int, tuple[int, RunningJob]] = {}

    def remap_pass(now: float, c_res: int | None) -> None:
        views = []
        eligible = running
        if claimed["suspending"] or claimed["given"]:
            places = [Placement(str(j), ((str(j), names[cluster[j]]),), (names[cluster[j]],)) for j in running]
            keep, skipped = remappable(
                places, PassClaims(frozenset(claimed["suspending"]), frozenset(claimed["given"]))
            )
            eligible = {int(p.job) for p in keep}
            decisions["skipped_claims"] = decisions.get("skipped_claims", 0) + len(skipped)
        for j in eligible:
            profiled = now - on_since[j] >= params.tau_s
            if not profiled:
                continue  # never moved for gain, and its thrashing is not detected yet
            hit = cache.get(j)
            if hit is not None and hit[0] == migrations[j]:
                views.append(hit[1])
                continue
            c = cluster[j]
            k = jobs.kind[j]
            gains = {}
            if profiled:
                for y in range(C):
                    if y != c:
                        true = params.tau_s * (1.0 - factor[k, y] / factor[k, c])
                        gains[names[y]] = true * (1.0 + err[j, c, y])
            views.append(
                RunningJob(
                    id=str(j),
                    cluster=names[c],
                    slots=int(jobs.slots[j]),
                    memory_mb_per_slot=farm.kinds[k].memory_mb_per_core,
                    gains=gains,
                    migrations=int(migrations[j]),
                    thrashing=profiled and bool(thrash[k, c]),
                    migrate_s=float(mig_s[k]),
                )
            )
            cache[j] = (int(migrations[j]), views[-1])
        offer = {names[c]: (0 if c == c_res else free[c]) for c in range(C)}
        for d in decide(views, offer, mem_slot, params):
            apply(d, now)

    def apply(d: Decision, now: float) -> None:
        key = f"{d.kind}_{d.reason}"
        decisions[key] = decisions.get(key, 0) + 1
        index = {nm: i for i, nm in enumerate(names)}
        for jid, src, dst in zip(d.jobs, d.src, d.dst, strict=True):
            j = int(jid)
            update(j, now)
            free[index[src]] += jobs.slots[j]
            free[index[dst]] -= jobs.slots[j]
            cluster[j] = index[dst]
            paused[j] = now + mig_s[jobs.kind[j]]
            last[j] = now
            on_since[j] = paused[j]
            migrations[j] += 1

    while finished < n:
        t_arr = jobs.submit[next_arrival] if next_arrival < n else math.inf
        ends = [(end_time(j), j) for j in running]
        t_end, j_end = min(ends) if ends else (math.inf, -1)
        t_next = min(t_arr, t_end, next_tick)
        if t_next == math.inf:  # nothing can ever start: a bug, not a workload
            raise RuntimeError(f"remap simulation stuck at t={t}: {len(queue)} queued, none fits")
        t = t_next
        if t_end == t:
            update(j_end, t)
            running.discard(j_end)
            free[cluster[j_end]] += jobs.slots[j_end]
            end[j_end] = t
            busy += (t - seg[j_end]) * jobs.slots[j_end]
            finished += 1
            if advance is not None:
                advance(finished)
        elif t_arr == t:
            queue.append(next_arrival)
            next_arrival += 1
        claimed["suspending"].clear()
        claimed["given"].clear()
        c_res = schedule(t)
        if remap == "arrive-f":
            if t == next_tick:
                for j in running:
                    update(j, t)
                remap_pass(t, c_res)
                c_res = schedule(t)
            if running and next_tick == math.inf:
                next_tick = t + params.tau_s
            elif t == next_tick:
                next_tick = t + params.tau_s if running else math.inf
    return RemapResult(
        remap=remap,
        submit=jobs.submit,
        start=start,
        end=end,
        migrations=migrations,
        decisions=decisions,
        busy_core_s=busy,
        cores=sum(s.slots for s in subs),
        policy=policy,
        preemptions=preempted,
        interactive=inter,
    )


def at_load(jobs: RemapJobs, cores: int, load: float) -> RemapJobs:
    """The same jobs with arrivals stretched or squeezed to `load`: reference core-seconds
    asked over cores × span (the paper fed its farm a stream that kept a queue)."""
    span = float(jobs.submit.max() - jobs.submit.min())
    if span <= 0 or load <= 0:
        return jobs
    offered = float(np.sum(jobs.runtime * jobs.slots)) / (cores * span)
    submit = jobs.submit.min() + np.floor((jobs.submit - jobs.submit.min()) * offered / load)
    return RemapJobs(submit=submit, slots=jobs.slots, kind=jobs.kind, runtime=jobs.runtime)


def paper_stream(farm: Farm, jobs: int, seed: int, load: float, runtime_s: tuple[float, float]) -> RemapJobs:
    """A Lublin–Feitelson stream like the paper's: sizes up to the largest sub-cluster, run
    times clipped to `runtime_s` (its NPB kernels ran for minutes to about 1.5 h), kinds drawn
    with `seed`, arrivals at `load` of the farm's cores."""
    biggest = max(s.slots for s in farm.subclusters)
    workload = generate(biggest, jobs, seed=seed)
    workload.runtime[:] = np.clip(workload.runtime, *runtime_s)
    cores = sum(s.slots for s in farm.subclusters)
    return at_load(jobs_from_workload(workload, farm, seed), cores, load)
