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

The scheduling pass is this module's own, not `preemption.scheduling`'s: the shared pass knows
one pool of nodes, this one several sub-clusters of different speeds. Reduced to one
sub-cluster it is the shared EASY core (`easy.reservation`, `easy.backfill`) pass for pass,
and its victims `victims.choose_victims`'s greedy phase: tests/test_remap_differential.py
holds it there, and says where the two part (jobs ending together at the shadow time).
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
from preemption.scheduling.policies import POLICIES, Order, Policy
from simulator.remap_jobs import RemapJobs
from simulator.subclusters import Farm

Remap = Literal["none", "arrive-f"]
REMAPS: tuple[str, ...] = ("none", "arrive-f")
REMAP_POLICIES: frozenset[str] = frozenset({"fcfs-easy", "vjob"})
"""The policies (names in `preemption.scheduling.policies.POLICIES`) this replay runs.
fcfs-easy: the paper's baseline (fastest free sub-cluster first); vjob: interactive jobs first,
preempting batch ones by checkpoint (module docstring)."""
BACKFILL_DEPTH = 200


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


def remap_policy(name: str) -> Policy:
    """The policy record of `name` if the heterogeneous replay runs it, else a ValueError
    naming the ones it runs (`REMAP_POLICIES`; any other is refused, not silently replaced)."""
    if name not in REMAP_POLICIES:
        raise ValueError(f"policy {name!r}: the heterogeneous replay runs {', '.join(sorted(REMAP_POLICIES))}")
    return POLICIES[name]


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
    replay = RemapReplay(
        farm,
        jobs,
        remap,
        params,
        seed=seed,
        migrate_bandwidth_mb_s=migrate_bandwidth_mb_s,
        policy=policy,
        interactive=interactive,
        checkpoint_mb_s=checkpoint_mb_s,
    )
    return replay.run(advance)


class RemapReplay:
    """The state of one replay (per-job arrays, free slots per sub-cluster, the queue) and its
    steps: `run` is the event loop; `schedule` the scheduling pass (`preempt_for_head`, then
    `easy_pass`: FCFS starts, `reserve`, backfilling); `remap_pass` ARRIVE-F's decisions.

    Why a class of steps over one function of closures: each step can be read, and held to
    the shared pass, on its own (tests/test_remap_differential.py subclasses it to compare
    every pass of a one-sub-cluster replay with `preemption.scheduling.easy`)."""

    def __init__(
        self,
        farm: Farm,
        jobs: RemapJobs,
        remap: Remap,
        params: RemapParams | None = None,
        *,
        seed: int = 1,
        migrate_bandwidth_mb_s: float = 110.0,
        policy: str = "fcfs-easy",
        interactive: np.ndarray | None = None,
        checkpoint_mb_s: float = 500.0,
    ) -> None:
        self.policy = remap_policy(policy)
        self.preempts = self.policy.preempts
        """vjob: interactive jobs checkpoint batch ones; the pass's claims bind the remapping."""
        self.interactive_first = self.policy.order in (Order.PRIVILEGED_FIRST, Order.TIERS)
        self.farm, self.jobs, self.remap = farm, jobs, remap
        self.params = params or RemapParams()
        self.subs = farm.subclusters
        self.C = len(self.subs)
        self.names = [s.name for s in self.subs]
        n = len(jobs.submit)
        self.n = n
        subs, kinds = self.subs, farm.kinds
        self.factor = np.array([[farm.runtime_factor(k, s) for s in subs] for k in kinds])  # kind × cluster
        self.thrash = np.array([[k.memory_mb_per_core > s.memory_mb_per_slot for s in subs] for k in kinds])
        acc = np.array([k.accuracy for k in kinds])
        rng = np.random.default_rng(seed)
        self.err = rng.uniform(-1.0, 1.0, size=(n, self.C, self.C)) * (1.0 - acc[jobs.kind])[:, None, None]
        self.mig_s = np.array([migration_cost_s(k.memory_mb_per_core, migrate_bandwidth_mb_s) for k in kinds])
        self.mem_slot = {s.name: s.memory_mb_per_slot for s in subs}
        self.inter = np.zeros(n, dtype=bool) if interactive is None else np.asarray(interactive, dtype=bool)
        self.ck_s = np.array([k.memory_mb_per_core / checkpoint_mb_s for k in kinds])
        self.preempted = np.zeros(n, dtype=int)
        self.saved_on = np.full(n, -1)
        self.seg = np.zeros(n)
        self.claimed: dict[str, set[str]] = {"suspending": set(), "given": set()}  # the vjob pass, this instant
        self.free = [s.slots for s in subs]
        self.cluster = np.full(n, -1)
        self.done = np.zeros(n)
        self.last = np.zeros(n)
        self.paused = np.zeros(n)
        self.on_since = np.zeros(n)
        self.start = np.full(n, math.nan)
        self.end = np.full(n, math.nan)
        self.migrations = np.zeros(n, dtype=int)
        self.running: set[int] = set()
        self.queue: list[int] = []
        self.decisions: dict[str, int] = {}
        self.busy = 0.0
        self.cache: dict[int, tuple[int, RunningJob]] = {}

    # -- one job's progress -----------------------------------------------------------------
    def rate(self, j: int, c: int) -> float:
        """The share of job j done per second on sub-cluster c."""
        return 1.0 / (self.jobs.runtime[j] * self.factor[self.jobs.kind[j], c])

    def update(self, j: int, now: float) -> None:
        """Bring job j's progress up to `now` (nothing while it migrates or resumes)."""
        eff = max(0.0, now - max(self.last[j], self.paused[j]))
        self.done[j] = min(1.0, self.done[j] + eff * self.rate(j, self.cluster[j]))
        self.last[j] = now

    def end_time(self, j: int) -> float:
        """When running job j ends where it is (estimates are exact)."""
        jobs = self.jobs
        rate = 1.0 / (jobs.runtime[j] * self.factor[jobs.kind[j], self.cluster[j]])  # `rate`, inlined: hot
        return max(self.last[j], self.paused[j]) + (1.0 - self.done[j]) / rate

    def place(self, j: int, c: int, now: float, delay: float = 0.0) -> None:
        """Start (or resume) job j on sub-cluster c, computing from `now + delay`."""
        self.cluster[j] = c
        self.free[c] -= self.jobs.slots[j]
        if self.saved_on[j] >= 0:  # a checkpointed job resumes: its state is read, twice as long elsewhere
            delay += self.ck_s[self.jobs.kind[j]] * (1.0 if self.saved_on[j] == c else 2.0)
            self.saved_on[j] = -1
        if math.isnan(self.start[j]):
            self.start[j] = now
        self.seg[j] = now
        self.last[j] = now
        self.paused[j] = now + delay
        self.on_since[j] = now + delay
        self.running.add(j)
        if self.preempts:
            self.claimed["given"].add(self.names[c])

    # -- the scheduling pass ----------------------------------------------------------------
    def schedule(self, now: float) -> int | None:
        """Start what can start; the index of the reserved sub-cluster (None: no reservation)."""
        if self.interactive_first:  # interactive first, then by submission (a checkpointed job keeps its place)
            self.order_queue()
            while self.queue and self.inter[self.queue[0]] and not self.fits_somewhere(self.queue[0]):
                if not self.preempt_for_head(now):
                    break
                self.order_queue()
        return self.easy_pass(now)

    def order_queue(self) -> None:
        """vjob: interactive jobs first, each class in submission (index) order."""
        self.queue.sort(key=lambda j: (not self.inter[j], j))

    def fits_somewhere(self, j: int) -> bool:
        return any(self.free[c] >= self.jobs.slots[j] for c in range(self.C))

    def victims(self, h: int, c: int, now: float) -> list[int] | None:
        """The batch jobs of sub-cluster c that interactive `h` checkpoints to start there: most
        recently started first (never one migrating or resuming), until enough slots are free;
        None when even all of them are not enough."""
        cands = sorted(
            (j for j in self.running if self.cluster[j] == c and not self.inter[j] and self.paused[j] <= now),
            key=lambda j: (-self.start[j], j),
        )
        victims, room = [], self.free[c]
        for j in cands:
            if room >= self.jobs.slots[h]:
                break
            victims.append(j)
            room += self.jobs.slots[j]
        return victims if room >= self.jobs.slots[h] else None

    def preempt_for_head(self, now: float) -> bool:
        """The interactive queue head fits nowhere: checkpoint batch jobs of the fastest
        sub-cluster where enough can be freed (`victims`) and start it there."""
        h = self.queue[0]
        for c in range(self.C):
            if self.subs[c].slots < self.jobs.slots[h]:
                continue
            victims = self.victims(h, c, now)
            if victims is None:
                continue
            for v in victims:
                self.update(v, now)
                self.running.discard(v)
                self.free[c] += self.jobs.slots[v]
                self.busy += (now - self.seg[v]) * self.jobs.slots[v]
                self.saved_on[v] = c
                self.preempted[v] += 1
                self.queue.append(v)
                self.claimed["suspending"].add(str(v))
            self.queue.remove(h)
            self.place(h, c, now, max((self.ck_s[self.jobs.kind[v]] for v in victims), default=0.0))
            return True
        return False

    def easy_pass(self, now: float) -> int | None:
        """FCFS-EASY over the queue as ordered: the head starts on the fastest sub-cluster with
        room while it has one; the first that fits nowhere reserves (`reserve`); later jobs
        (up to BACKFILL_DEPTH) start on the fastest sub-cluster with room that does not delay
        that reservation. Returns the reserved sub-cluster's index (None: no reservation)."""
        queue, slots = self.queue, self.jobs.slots
        while queue:
            h = queue[0]
            c = next((c for c in range(self.C) if self.free[c] >= slots[h]), None)
            if c is None:
                break
            self.place(h, c, now)
            queue.pop(0)
        if not queue:
            return None
        best = self.reserve(now, queue[0])
        if best is None:
            return None
        shadow, c_res, extra = best
        for j in list(queue[1:BACKFILL_DEPTH]):
            for c in range(self.C):
                if self.free[c] < slots[j]:
                    continue
                ends = now + self.jobs.runtime[j] * self.factor[self.jobs.kind[j], c]
                if c != c_res or ends <= shadow or slots[j] <= extra:
                    if c == c_res and ends > shadow:
                        extra -= slots[j]
                    self.place(j, c, now)
                    queue.remove(j)
                    break
        return c_res

    def reserve(self, now: float, h: int) -> tuple[float, int, int] | None:
        """EASY's reservation for job h: (shadow time, sub-cluster, extra slots) on the
        sub-cluster where it can start first (the fastest of equals); None if none is big
        enough. Running jobs free their slots in order of (end, index)."""
        best: tuple[float, int, int] | None = None
        need = self.jobs.slots[h]
        for c in range(self.C):
            if self.subs[c].slots < need:
                continue
            avail = self.free[c]
            shadow = now
            for e, j in sorted((self.end_time(j), j) for j in self.running if self.cluster[j] == c):
                if avail >= need:
                    break
                avail += self.jobs.slots[j]
                shadow = e
            if best is None or shadow < best[0]:
                best = (shadow, c, avail - need)
        return best

    # -- ARRIVE-F ---------------------------------------------------------------------------
    def remap_pass(self, now: float, c_res: int | None) -> None:
        """Offer `decide` every job profiled a whole window (not claimed by this instant's
        pass) and the free slots, the reserved sub-cluster's withheld; apply its decisions."""
        names, claimed = self.names, self.claimed
        views = []
        eligible = self.running
        if claimed["suspending"] or claimed["given"]:
            places = [
                Placement(str(j), ((str(j), names[self.cluster[j]]),), (names[self.cluster[j]],)) for j in self.running
            ]
            keep, skipped = remappable(
                places, PassClaims(frozenset(claimed["suspending"]), frozenset(claimed["given"]))
            )
            eligible = {int(p.job) for p in keep}
            self.decisions["skipped_claims"] = self.decisions.get("skipped_claims", 0) + len(skipped)
        for j in eligible:
            if now - self.on_since[j] < self.params.tau_s:
                continue  # never moved for gain, and its thrashing is not detected yet
            hit = self.cache.get(j)
            if hit is not None and hit[0] == self.migrations[j]:
                views.append(hit[1])
                continue
            views.append(self.view(j))
            self.cache[j] = (int(self.migrations[j]), views[-1])
        offer = {names[c]: (0 if c == c_res else self.free[c]) for c in range(self.C)}
        for d in decide(views, offer, self.mem_slot, self.params):
            self.apply(d, now)

    def view(self, j: int) -> RunningJob:
        """Profiled job j as the policy sees it: its gain per window towards each other
        sub-cluster (with its kind's prediction error) and whether it thrashes."""
        c = self.cluster[j]
        k = self.jobs.kind[j]
        gains = {}
        for y in range(self.C):
            if y != c:
                true = self.params.tau_s * (1.0 - self.factor[k, y] / self.factor[k, c])
                gains[self.names[y]] = true * (1.0 + self.err[j, c, y])
        return RunningJob(
            id=str(j),
            cluster=self.names[c],
            slots=int(self.jobs.slots[j]),
            memory_mb_per_slot=self.farm.kinds[k].memory_mb_per_core,
            gains=gains,
            migrations=int(self.migrations[j]),
            thrashing=bool(self.thrash[k, c]),
            migrate_s=float(self.mig_s[k]),
        )

    def apply(self, d: Decision, now: float) -> None:
        """Migrate the decision's jobs: they lose the migration's seconds and must be profiled
        a whole window again."""
        key = f"{d.kind}_{d.reason}"
        self.decisions[key] = self.decisions.get(key, 0) + 1
        index = {nm: i for i, nm in enumerate(self.names)}
        for jid, src, dst in zip(d.jobs, d.src, d.dst, strict=True):
            j = int(jid)
            self.update(j, now)
            self.free[index[src]] += self.jobs.slots[j]
            self.free[index[dst]] -= self.jobs.slots[j]
            self.cluster[j] = index[dst]
            self.paused[j] = now + self.mig_s[self.jobs.kind[j]]
            self.last[j] = now
            self.on_since[j] = self.paused[j]
            self.migrations[j] += 1

    # -- the event loop ---------------------------------------------------------------------
    def finish(self, j: int, t: float) -> None:
        self.update(j, t)
        self.running.discard(j)
        self.free[self.cluster[j]] += self.jobs.slots[j]
        self.end[j] = t
        self.busy += (t - self.seg[j]) * self.jobs.slots[j]

    def run(self, advance: Callable[[int], None] | None = None) -> RemapResult:
        """Events in time order (one job end or one arrival, or a remap tick every τ while
        jobs run), a scheduling pass after each; `advance(n)`: n jobs finished so far."""
        n, jobs, tau, end_time = self.n, self.jobs, self.params.tau_s, self.end_time
        next_arrival = finished = 0
        t = 0.0
        next_tick = math.inf
        while finished < n:
            t_arr = jobs.submit[next_arrival] if next_arrival < n else math.inf
            ends = [(end_time(j), j) for j in self.running]
            t_end, j_end = min(ends) if ends else (math.inf, -1)
            t_next = min(t_arr, t_end, next_tick)
            if t_next == math.inf:  # nothing can ever start: a bug, not a workload
                raise RuntimeError(f"remap simulation stuck at t={t}: {len(self.queue)} queued, none fits")
            t = t_next
            if t_end == t:
                self.finish(j_end, t)
                finished += 1
                if advance is not None:
                    advance(finished)
            elif t_arr == t:
                self.queue.append(next_arrival)
                next_arrival += 1
            self.claimed["suspending"].clear()
            self.claimed["given"].clear()
            c_res = self.schedule(t)
            if self.remap == "arrive-f":
                if t == next_tick:
                    for j in self.running:
                        self.update(j, t)
                    self.remap_pass(t, c_res)
                    c_res = self.schedule(t)
                if self.running and next_tick == math.inf:
                    next_tick = t + tau
                elif t == next_tick:
                    next_tick = t + tau if self.running else math.inf
        return self.result()

    def result(self) -> RemapResult:
        return RemapResult(
            remap=self.remap,
            submit=self.jobs.submit,
            start=self.start,
            end=self.end,
            migrations=self.migrations,
            decisions=self.decisions,
            busy_core_s=self.busy,
            cores=sum(s.slots for s in self.subs),
            policy=self.policy.name,
            preemptions=self.preempted,
            interactive=self.inter,
        )
