"""The discrete-event engine: replays a workload on a cluster model under one policy.

Why an event loop over plain lists: 100,000 jobs on 1,056 nodes must replay in seconds, so
per-job state lives in Python lists (fast scalar access) and NumPy is used where the work is
vectorisable (UBIS priorities of the whole queue). The decisions themselves come from
`preemption.scheduling` (queue orders, EASY reservation and backfilling, victim choice) and
`ubis_priority` (the priority kernel, the interactive cap, targets, usage decay). One pass
(`_schedule`, `_preempt_for`, `_start`) is the scheduling pass the live agent runs,
`preemption.scheduling.tick.decide`, written over arrays with compiled hot paths (the UBIS
kernel and queue order, `ubis_priority.compiled`; EASY, `easy.backfill_arrays` and
`backfill_leading`; the node choice, `node_pool.take_nodes`; the queue buffer,
`queue_rows`): tests/test_decision_differential.py holds it equal to `tick.decide` on random
cluster states. What still differs between live and simulated: docs/simulator.md.

Cluster model (Entropy cost model, section 4.2 of the Entropy paper): a checkpoint writes each
VM's memory (all VMs of a job in parallel, so it takes memory-per-node / bandwidth seconds);
a resume reads it back, locally in the same time, remotely (other nodes) in twice that; a node
switching its OS image costs `os_swap_s` before the job can start. While a checkpoint is being
written the victim still holds its nodes; the interactive job starts once the last of its
victims' checkpoints is written.

Scheduling passes run after all events of one instant, and only when something happened that
can let a job start (nodes freed, a checkpointed job queued again, a new job that fits the
free nodes, or an interactive job that may preempt).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from preemption.scheduling.easy import backfill_arrays, backfill_leading, reservation
from preemption.scheduling.guard import HARMFUL, harmful, keeps_reservation, returning
from preemption.scheduling.policies import (
    blocks_behind_interactive,
    check_cap_mode,
    check_policy,
    mms_order,
    preempts,
    ubis_order,
    vjob_tiers,
)
from preemption.scheduling.reserve import need_beside, recent_interactive, reserve_asked, reserve_nodes
from preemption.scheduling.victims import Candidate, choose_victims
from simulator.node_pool import FREE, take_nodes
from simulator.queue_rows import queue_append, queue_remove
from simulator.vjob_order import AHEAD_OFF, AHEAD_QUEUE, backfill_window, vjob_queue_order
from simulator.workload import Workload
from ubis_priority.compiled import (
    COLUMNS,
    INTERACTIVE,
    NODES,
    OS,
    PREEMPT_COUNT,
    PREEMPTED_S,
    SHARE,
    SINCE,
    SUBMIT,
    queue_priorities,
    scalars,
    ubis_leading,
)
from ubis_priority.decay import decay_factor
from ubis_priority.interactive import cap_limit, within_cap
from ubis_priority.shares import target_shares
from vjob.config import PriorityConfig, SchedulingConfig
from vjob.errors import InputError

MIB = 1024 * 1024
_NO_NODES = np.empty(0, dtype=np.int64)
_NONE_QUEUED = 1 << 62
FULL_RANK_ABOVE = 2000
"""Exact ubis: queues longer than this are ranked whole at a pass (same order, same
schedule) instead of through `ubis_leading`, which pays per candidate."""
END, RELEASE, REQUEUE = 0, 1, 2
CHECKPOINTING = -2


@dataclass(frozen=True)
class ClusterModel:
    """The simulated machine and the costs of moving work around on it."""

    nodes: int
    os_count: int = 2
    os_swap_s: float = 300.0
    """Provisioning time for a node to switch OS image (boot the other image's VM)."""
    bandwidth_mb_s: float = 500.0
    """Disk bandwidth per node for writing or reading a checkpoint (MB/s)."""
    memory_mb_per_node: int = 4096
    """Memory of a job's VM on each node when the trace does not say."""
    backfill_depth: int | None = 500
    """Queued jobs examined for backfilling per pass (like Slurm's bf_max_job_test)."""
    priority_refresh_s: float = 0.0
    """ubis only: seconds of simulated time a job's priority is reused before it is
    computed again (like Slurm's PriorityCalcPeriod). 0 = every pass, the exact replay; > 0
    is an approximation that trades fidelity for speed (docs/simulator.md, Speed)."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise InputError(f"--nodes = {self.nodes}: must be >= 1")
        if self.os_count < 1:
            raise InputError(f"--os-count = {self.os_count}: must be >= 1")
        if self.os_swap_s < 0 or self.bandwidth_mb_s <= 0 or self.memory_mb_per_node < 0:
            raise InputError("cluster model: os_swap_s >= 0, bandwidth_mb_s > 0 and memory_mb_per_node >= 0 needed")
        if self.backfill_depth is not None and self.backfill_depth < 0:
            raise InputError(f"--backfill-depth = {self.backfill_depth}: must be >= 0")
        if not (self.priority_refresh_s >= 0 and math.isfinite(self.priority_refresh_s)):
            raise InputError(f"--priority-refresh = {self.priority_refresh_s}: must be a finite number >= 0")


@dataclass
class Result:
    """Everything a run produced; metrics.py turns it into summary.json, CSVs and plots."""

    policy: str
    model: ClusterModel
    workload: Workload
    first_start: np.ndarray
    end: np.ndarray
    preempt_count: np.ndarray
    overhead_s: np.ndarray
    """Per job: checkpoint + restart + OS-swap seconds spent holding nodes without computing."""
    ran_privileged: np.ndarray
    """Per job: ran as an interactive job within the cap (counted against it)."""
    fit_wait: np.ndarray
    """Per interactive job: the seconds it was queued while it fitted under the cap (the cap
    had room for it), up to its first start, the victims' checkpoints included: an admitted
    job's wait (metrics, `admitted`). Time it waited for room under the cap is left out,
    also after it fitted once and then lost the room to another interactive job."""
    segments: list[tuple[int, float, float, int]]
    """(job index, start, end, nodes) of every run segment, in the order they closed."""
    preemptions: int = 0
    checkpoint_bytes: float = 0.0
    os_swaps: int = 0
    remote_resumes: int = 0
    events: int = 0
    passes: int = 0
    max_interactive_held: int = 0


class Simulation:
    """One replay; construct, then `run()`."""

    def __init__(
        self,
        workload: Workload,
        model: ClusterModel,
        policy: str,
        priority: PriorityConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
        scheduling: SchedulingConfig | None = None,
        cap_mode: str = "preempt",
    ) -> None:
        self.policy = check_policy(policy)
        sched = scheduling or SchedulingConfig()
        self.by_cost = policy == "vjob"
        """vjob: victims by cost, bounded preemptions, the guard's reservation kept (tick.decide)."""
        self.max_preemptions = sched.max_preemptions
        self.head_slack_s = sched.head_slack_s
        self.ahead = sched.interactive_ahead
        self.guarded = self.by_cost and self.ahead == "guarded"
        self.harmless_first = sched.victims == "guard"
        self.fallback = sched.victims == "fallback"
        self.reserve_nodes = sched.interactive_reserve_nodes if self.by_cost else 0
        """vjob: `[scheduling] interactive_reserve_nodes` (preemption/scheduling/reserve.py)."""
        self.reserve_arrivals = sched.interactive_reserve_arrivals
        self.reserve_window_s = sched.interactive_reserve_window_s
        self.reserve_asked = self.reserve_nodes if not self.reserve_arrivals else 0
        """The reserve held in the current pass (`_schedule` sets it when it adapts)."""
        self.hard_cap = check_cap_mode(cap_mode) == "hard"
        self._guard = -1
        self._anchors: dict[int, float] = {}
        self._returning: list[tuple[float, int]] = []
        """vjob: this pass's victims as they will hold nodes again (guard.returning)."""
        self._covered: list[tuple[float, int]] = []
        """vjob: the holds those returns stand for (tick._Pass.covered)."""
        """vjob: each guarded job's reserved start when first checked (guard.keeps_reservation)."""
        """vjob: the first job of the pass's order that is not a privileged interactive job."""
        self.blocking = blocks_behind_interactive(policy)
        self.model = model
        self.prio_cfg = priority or PriorityConfig()
        self.conf = scalars(self.prio_cfg, model.nodes)
        self.preempts = preempts(policy)
        self.progress = progress
        w = workload.sorted_by_submit()
        if len(w) and int(w.nodes.max()) > model.nodes:
            big = int(np.flatnonzero(w.nodes > model.nodes)[0])
            raise InputError(
                f"job {int(w.job_id[big])} asks for {int(w.nodes[big])} nodes, the machine has {model.nodes}"
            )
        if len(w) and (int(w.os.max()) >= model.os_count):
            raise InputError(f"a job asks for OS image {int(w.os.max())}, the model has {model.os_count} images")
        self.w = w
        n = len(w)
        self.submit = w.submit.tolist()
        self.need = w.nodes.astype(np.int64).tolist()
        self.os = np.maximum(w.os, 0).astype(np.int64).tolist()
        self.inter = w.interactive.tolist()
        mem = np.where(w.memory_mb > 0, w.memory_mb, model.memory_mb_per_node).astype(np.float64)
        self.ckpt_s = (mem / model.bandwidth_mb_s).tolist()
        self.mem_bytes = (mem * MIB * w.nodes).tolist()
        self.remaining = w.runtime.astype(np.float64).tolist()
        self.est_left = w.walltime.astype(np.float64).tolist()
        self.est_a = w.walltime.astype(np.float64)
        users, share = np.unique(np.where(w.user >= 0, w.user, -1), return_inverse=True)
        self.share_list = share.tolist()
        self.usage = np.zeros(len(users))
        self.usage_t = 0.0
        self._half_life = self.prio_cfg.usage_half_life_s
        self.target = user_targets(w, users, share, self.prio_cfg)
        # numpy mirrors for the queue orders and backfilling
        self.submit_a = w.submit.astype(np.float64)
        self.need_a = w.nodes.astype(np.int64)
        self.inter_a = w.interactive.astype(bool)
        # the columns the compiled UBIS kernel reads, one row per job (a job's columns share
        # a cache line); Pn, Pt and the open preemption's start are updated in place
        self.cols = np.empty((n, len(COLUMNS)), dtype=np.float64)
        self.cols[:, SUBMIT] = w.submit
        self.cols[:, NODES] = w.nodes
        self.cols[:, OS] = np.maximum(w.os, 0)
        self.cols[:, PREEMPT_COUNT] = 0.0
        self.cols[:, PREEMPTED_S] = 0.0
        self.cols[:, SINCE] = np.nan
        self.cols[:, INTERACTIVE] = w.interactive
        self.cols[:, SHARE] = share
        self.pc_a = self.cols[:, PREEMPT_COUNT]
        self.pt_a = self.cols[:, PREEMPTED_S]
        self.since_a = self.cols[:, SINCE]
        # per-job outcome
        self.first_start = [math.nan] * n
        self.end = [math.nan] * n
        self.overhead = [0.0] * n
        self.privileged = [False] * n
        self.fit_wait = [0.0] * n
        self._fit_since = [math.nan] * n
        """Per queued interactive job: since when it fits under the cap (nan: it does not)."""
        self._waiting: dict[int, dict[int, None]] = {}
        """Queued interactive jobs that never started, by size (`_cap_moved` walks them)."""
        self.prev_nodes: list[np.ndarray | None] = [None] * n
        # running state: job -> (alloc time, run start, nodes); token invalidates stale ENDs
        self.running: dict[int, tuple[float, float, np.ndarray]] = {}
        self.token = [0] * n
        self.holds: dict[tuple[int, int], tuple[float, int]] = {}
        """What holds nodes (running jobs, checkpoints being written): key -> (estimated end,
        nodes); `_held` has the same values kept sorted, as EASY's reservation reads them."""
        self._held: list[tuple[float, int]] = []
        # Nodes start with the images in turn (50/50 for two); owner is the job index on the
        # node, FREE, or CHECKPOINTING while a victim's memory is being written.
        self.node_os = np.arange(model.nodes, dtype=np.int64) % model.os_count
        self.owner = np.full(model.nodes, FREE, dtype=np.int64)
        self.free = model.nodes
        self.free_by_os = np.bincount(self.node_os, minlength=model.os_count)
        """Free nodes per current OS image, kept up to date as nodes are taken and freed."""
        exact_ubis = policy == "ubis" and model.priority_refresh_s == 0
        self._qjobs = np.empty(n, dtype=np.int64)
        self._qrows = np.empty((n if exact_ubis else 0, len(COLUMNS)), dtype=np.float64)
        self._qlen = 0
        """The queue as of the last pass (queue_rows: job indices, and for exact ubis their
        rows); `arrived` holds the jobs queued since."""
        self.arrived: list[int] = []
        # output buffers of the compiled ubis pass (ubis_leading, backfill_leading)
        self._lead_jobs = np.empty(n, dtype=np.int64)
        self._lead_entries = np.empty(n, dtype=np.int64)
        self._lead_prio = np.empty(n, dtype=np.float64)
        self._late = np.empty(n, dtype=np.int64)
        # scratch arrays, so a pass allocates nothing of the workload's size
        self._mark = np.zeros(n + 2, dtype=bool)
        self._rank = np.zeros(n, dtype=np.int64)
        self.full_sort_vjob = False
        """vjob: rank the queue with `np.lexsort` at every pass (the former path, the same
        order as `vjob_order.vjob_queue_order`; bench/simulate.py's baseline)."""
        self._vorder = np.empty(n, dtype=np.int64)
        self._vtier = np.empty(n, dtype=np.int64)
        self._vrest = np.empty(n, dtype=np.int64)
        # priority_refresh_s > 0: each job's last priority, the queue ranked by them, and when
        # the whole queue was last rated
        self._prio = np.zeros(n, dtype=np.float64)
        self._ranked = np.empty(0, dtype=np.int64)
        self._rated_at = -math.inf
        self.queued_sizes: dict[int, int] = {}
        self._smallest = _NONE_QUEUED
        """The smallest size in `queued_sizes`."""
        self.queued_interactive: dict[int, int] = {}
        """Sizes of the queued interactive jobs (size -> count), for `_may_start`."""
        self.batch_running_nodes = 0
        self.held_interactive = 0
        self.cap_nodes = cap_limit(self.prio_cfg.interactive_cap, model.nodes)
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self._pending_release: dict[int, np.ndarray] = {}
        self.result = Result(
            policy=policy,
            model=model,
            workload=w,
            first_start=np.array([]),
            end=np.array([]),
            preempt_count=np.array([]),
            overhead_s=np.array([]),
            ran_privileged=np.array([]),
            fit_wait=np.array([]),
            segments=[],
        )

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> Result:
        n = len(self.submit)
        nxt = 0
        done = 0
        res = self.result
        report_every = max(1, n // 200)
        while nxt < n or self.events:
            t_submit = self.submit[nxt] if nxt < n else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            now = min(t_submit, t_event)
            dirty = False
            while self.events and self.events[0][0] <= now:
                _, kind, _, j, tok = heapq.heappop(self.events)
                res.events += 1
                if kind == END:
                    if tok != self.token[j]:
                        continue
                    self._finish(j, now)
                    done += 1
                    dirty = True
                    if self.progress and done % report_every == 0:
                        self.progress(done, n)
                elif kind == RELEASE:
                    self._release(j, now)
                    dirty = True
                else:  # REQUEUE: the checkpoint is written, the job may resume
                    self._enqueue(j, now)
                    dirty = True
            while nxt < n and self.submit[nxt] <= now:
                j = nxt
                nxt += 1
                res.events += 1
                self._enqueue(j, now)
                if self.need[j] <= self.free or (self.inter[j] and preempts(self.policy)):
                    dirty = True
            if dirty and self.queued_sizes and self._may_start():
                res.passes += 1
                self._schedule(now)
        if self.progress:
            self.progress(n, n)
        res.first_start = np.array(self.first_start)
        res.end = np.array(self.end)
        self._check_all_finished(res.end)
        res.preempt_count = self.pc_a.astype(np.int64)
        res.overhead_s = np.array(self.overhead)
        res.ran_privileged = np.array(self.privileged, dtype=bool)
        res.fit_wait = np.array(self.fit_wait)
        return res

    def _check_all_finished(self, end: np.ndarray) -> None:
        """Every job that could ever run has finished: a replay whose passes stop waking up
        (a prototype of the interactive reserve left 18,000 of 28,571 jobs queued) would
        otherwise report the means of the jobs that happened to finish. The only jobs that
        may not run are interactive jobs larger than a hard cap."""
        left = np.isnan(end)
        if self.hard_cap:
            left &= ~(self.inter_a & (self.need_a > self.cap_nodes))
        if left.any():
            first = int(np.flatnonzero(left)[0])
            raise RuntimeError(
                f"replay ended with {int(left.sum())} of {left.shape[0]} jobs unfinished "
                f"(first: job {int(self.w.job_id[first])}, {self.need[first]} nodes): a pass stopped waking up"
            )

    def _enqueue(self, j: int, now: float) -> None:
        self.arrived.append(j)
        n = self.need[j]
        self.queued_sizes[n] = self.queued_sizes.get(n, 0) + 1
        if n < self._smallest:
            self._smallest = n
        if self.inter[j]:
            self.queued_interactive[n] = self.queued_interactive.get(n, 0) + 1
            self._waiting.setdefault(n, {})[j] = None
            if within_cap(self.held_interactive, n, self.cap_nodes):
                self._fit_since[j] = now

    def _cap_moved(self, before: int, now: float) -> None:
        """The nodes held within the cap went from `before` to `held_interactive`: the queued
        interactive jobs whose size now fits, or no longer fits, start or stop counting
        their admitted wait (`fit_wait`)."""
        after = self.held_interactive
        for n, jobs in self._waiting.items():
            was, fits = within_cap(before, n, self.cap_nodes), within_cap(after, n, self.cap_nodes)
            if was == fits:
                continue
            for j in jobs:
                if fits:
                    self._fit_since[j] = now
                else:
                    self.fit_wait[j] += now - self._fit_since[j]
                    self._fit_since[j] = math.nan

    def _started_waiting(self, j: int, alloc: float) -> None:
        """Interactive job j leaves the queue, running from `alloc` (after its victims'
        checkpoints when it preempted): its admitted wait stops there."""
        n = self.need[j]
        jobs = self._waiting[n]
        del jobs[j]
        if not jobs:
            del self._waiting[n]
        since = self._fit_since[j]
        if not math.isnan(since):
            self.fit_wait[j] += alloc - since
            self._fit_since[j] = math.nan

    def _dequeued(self, j: int) -> None:
        n = self.need[j]
        left = self.queued_sizes[n] - 1
        if left:
            self.queued_sizes[n] = left
        else:
            del self.queued_sizes[n]
            if n == self._smallest:
                self._smallest = min(self.queued_sizes, default=_NONE_QUEUED)
        if self.inter[j]:
            left = self.queued_interactive[n] - 1
            if left:
                self.queued_interactive[n] = left
            else:
                del self.queued_interactive[n]

    def _may_start(self) -> bool:
        """Whether a pass could start anything: some queued job fits the free nodes, or a
        queued interactive job within the cap could get its nodes by preemption (it fits in
        the free nodes plus those of running batch jobs). A pass that cannot start anything
        changes nothing, so it is skipped (this is what makes long replays fast)."""
        if self.free >= self._smallest:
            return True
        if not (self.preempts and self.queued_interactive):
            return False
        room = self.free + self.batch_running_nodes
        return any(
            size <= room and within_cap(self.held_interactive, size, self.cap_nodes) for size in self.queued_interactive
        )

    def _reserve(self) -> int:
        """The free nodes kept for interactive arrivals now (`reserve.reserve_nodes`)."""
        if not self.reserve_asked:
            return 0
        return reserve_nodes(self.reserve_asked, self.cap_nodes, self.held_interactive)

    def _fits_beside(self, n: int) -> bool:
        """Whether a job of n nodes that is not a privileged interactive job starts on the
        free nodes and leaves the reserve free (`reserve.need_beside`)."""
        if not self.reserve_asked:  # the default: no call in the pass's hot loop
            return n <= self.free
        return need_beside(n, self._reserve(), self.model.nodes) <= self.free

    def _hold(self, key: tuple[int, int], end: float, nodes: int) -> None:
        self.holds[key] = (end, nodes)
        bisect.insort(self._held, (end, nodes))

    def _unhold(self, key: tuple[int, int]) -> None:
        value = self.holds.pop(key)
        del self._held[bisect.bisect_left(self._held, value)]

    def _push(self, t: float, kind: int, j: int, tok: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, j, tok))

    # -- one scheduling pass ----------------------------------------------------------------
    def _schedule(self, now: float) -> None:
        self._returning = []
        self._covered = []
        arrived = np.array(self.arrived, dtype=np.int64) if self.arrived else _NO_NODES
        if arrived.shape[0]:
            self._qlen = queue_append(self._qjobs, self._qrows, self._qlen, self.cols, arrived)
            self.arrived = []
        if self.reserve_nodes and self.reserve_arrivals:  # the adaptive reserve: what tick._Pass sees
            qa = self._qjobs[: self._qlen]
            seen = [*qa[self.inter_a[qa]].tolist(), *(j for j in self.running if self.inter[j])]
            recent = recent_interactive((self.submit[j] for j in seen), now, self.reserve_window_s)
            self.reserve_asked = reserve_asked(self.reserve_nodes, self.reserve_arrivals, recent)
        order, ranking = self._order(self._qjobs[: self._qlen], now, arrived)
        head = -1
        head_at = 0
        head_priv = False
        started: list[int] = []
        for pos, j in enumerate(_leading(order) if ranking is None else order.tolist()):
            n = self.need[j]
            priv = self.inter[j] and within_cap(self.held_interactive, n, self.cap_nodes)
            if self.hard_cap and self.inter[j] and not priv:
                continue  # beyond the cap: it waits, and is not the head either
            if self.guarded and self.inter[j] and not priv:  # vjob: beyond the cap, never the head
                if self._fits_beside(n) and (self._guard < 0 or self._keeps_guard(j, now, [], n)):
                    self._start(j, now, False)
                    started.append(j)
                continue
            if (n <= self.free) if priv else self._fits_beside(n):
                self._start(j, now, priv)
                started.append(j)
                continue
            if priv and self.preempts and self._preempt_for(j, now):
                started.append(j)
                continue
            head, head_at, head_priv = j, pos, priv
            break
        if head >= 0 and self.free > 0 and not (self.blocking and head_priv):
            kept = self._reserve()
            need_head = self.need[head] if head_priv else need_beside(self.need[head], kept, self.model.nodes)
            shadow, extra = reservation(now, self.free, need_head, self._held)
            bf_free = max(0, self.free - kept)
            depth = self.model.backfill_depth
            if ranking is None and self.by_cost and not self.full_sort_vjob:
                count = backfill_window(
                    order,
                    head_at + 1,
                    self.inter_a,
                    self.ahead == "backfill",
                    -1 if depth is None else depth,
                    self.hard_cap,
                    self._vrest,
                )
                rest = self._vrest[:count]
                need, est = self.need_a[rest], self.est_a[rest]
                late = backfill_arrays(now, bf_free, shadow, extra, rest, need, est, -1)
            elif ranking is None:
                rest = order[head_at + 1 :]
                if self.by_cost and self.ahead == "backfill":  # interactive jobs looked at first
                    inter = self.inter_a[rest]
                    rest = np.concatenate((rest[inter], rest[~inter]))
                if depth is not None:
                    rest = rest[:depth]
                if self.hard_cap:
                    rest = rest[~self.inter_a[rest]]
                need, est = self.need_a[rest], self.est_a[rest]
                late = backfill_arrays(now, bf_free, shadow, extra, rest, need, est, -1)
            else:  # `order` is only the part of the queue order a pass can act on
                entries, prio = ranking
                count = backfill_leading(
                    now,
                    self.free,
                    shadow,
                    extra,
                    order,
                    entries,
                    prio,
                    self._qrows,
                    head_at,
                    self.need_a,
                    self.est_a,
                    -1 if depth is None else depth,
                    self._late,
                )
                late = self._late[:count]
            for j in late.tolist():
                self._start(j, now, self.inter[j] and within_cap(self.held_interactive, self.need[j], self.cap_nodes))
                started.append(j)
        if started:
            done = np.array(started, dtype=np.int64)
            self._qlen = queue_remove(self._qjobs, self._qrows, self._qlen, done, self._mark[2:])
            if self._ranked.shape[0]:
                mark = self._mark[2:]
                mark[done] = True
                self._ranked = self._ranked[~mark[self._ranked]]
                mark[done] = False
            for j in started:
                self._dequeued(j)

    def _order(
        self, qa: np.ndarray, now: float, arrived: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The queue `qa` in the policy's order (job indices), or for exact ubis the part of
        that order a pass can act on, with its entries in `qa` and every queued job's
        priority (`ubis_leading`); `arrived`: queued since the last pass."""
        if self.policy == "ubis" and self.model.priority_refresh_s > 0:
            return self._ranked_order(qa, now, arrived), None
        if self.policy == "fcfs-easy" or qa.shape[0] == 1:
            self._guard = int(qa[0]) if self.by_cost and not self.inter[int(qa[0])] else -1
            return qa, None
        if self.by_cost and not self.full_sort_vjob:
            count = qa.shape[0]
            self._guard = vjob_queue_order(
                qa,
                self.inter_a,
                self.need_a,
                self.pc_a,
                self.submit_a,
                self.held_interactive,
                float(self.cap_nodes),
                AHEAD_QUEUE if self.ahead in ("queue", "guarded") else AHEAD_OFF,
                self._vorder,
                self._vtier,
            )
            return self._vorder[:count], None
        if self.by_cost:
            tiers = vjob_tiers(
                self._privileged(qa),
                self.pc_a[qa] > 0,
                self.inter_a[qa] if self.ahead in ("queue", "guarded") else None,
            )
            by = np.lexsort((self.submit_a[qa], tiers))
            batch = np.flatnonzero(~self.inter_a[qa[by]])
            self._guard = int(qa[by[batch[0]]]) if batch.shape[0] else -1
            return qa[by], None
        if self.policy in ("mms", "mms-block"):
            priv = self._privileged(qa)
            if not priv.any():
                return qa, None
            return qa[mms_order(self.submit_a[qa], priv)], None
        if qa.shape[0] > FULL_RANK_ABOVE or self.hard_cap:
            # a queue this long is mostly jobs that fit (a backlog of small jobs): sorting
            # all of it once costs less than placing the candidates one by one
            return qa[ubis_order(self._priorities(qa, now), self.submit_a[qa])], None
        m = ubis_leading(
            self._qrows, qa, *self._rating(now), self.preempts, self._lead_jobs, self._lead_entries, self._lead_prio
        )
        return self._lead_jobs[:m], (self._lead_entries[:m], self._lead_prio[: qa.shape[0]])

    def _privileged(self, qa: np.ndarray) -> np.ndarray:
        """Which of the jobs `qa` are interactive jobs within the cap now."""
        return self.inter_a[qa] & within_cap(self.held_interactive, self.need_a[qa], self.cap_nodes)

    def _priorities(self, qa: np.ndarray, now: float) -> np.ndarray:
        """UBIS priorities of the jobs `qa` at `now` (the compiled kernel, which gives
        `compute_arrays`'s priorities to the last bit)."""
        return queue_priorities(self.cols, qa, *self._rating(now), False)

    def _rating(self, now: float) -> tuple[float, int, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
        """The cluster state the compiled kernel rates queued jobs with at `now` (usage
        decayed first): now, free nodes, free nodes per image, nodes held by interactive jobs,
        targets, usage, the configuration's scalars."""
        self._decay(now)
        return (now, self.free, self.free_by_os, self.held_interactive, self.target, self.usage, self.conf)

    def _ranked_order(self, qa: np.ndarray, now: float, arrived: np.ndarray) -> np.ndarray:
        """ubis with `priority_refresh_s`: every job of `qa` ranked afresh once the last
        ranking is that old; in between the ranking is kept, jobs that left the queue drop
        out of it (`_schedule`), and jobs queued since are rated now and placed by their
        priority, after the jobs already ranked with an equal one."""
        if now - self._rated_at >= self.model.priority_refresh_s:
            self._rated_at = now
            prio = self._priorities(qa, now)
            self._prio[qa] = prio
            self._ranked = qa[ubis_order(prio, self.submit_a[qa])]
        elif arrived.shape[0]:
            prio = self._priorities(arrived, now)
            self._prio[arrived] = prio
            new = arrived[ubis_order(prio, self.submit_a[arrived])]
            at = np.searchsorted(-self._prio[self._ranked], -self._prio[new], side="right")
            self._ranked = np.insert(self._ranked, at, new)
        return self._ranked

    def _decay(self, now: float) -> None:
        if now > self.usage_t:
            factor = decay_factor(now - self.usage_t, self._half_life)
            if self.usage.shape[0] == 1:  # the same multiplication, without a ufunc call
                self.usage[0] = float(self.usage[0]) * factor
            else:
                self.usage *= factor
            self.usage_t = now

    # -- actions ------------------------------------------------------------------------------
    def _take_nodes(self, j: int, count: int) -> tuple[np.ndarray, bool, int]:
        """Free nodes for job j, switched to its image (node_pool.take_nodes: its previous
        nodes when all are free, else nodes already on its OS first). Returns (nodes, resumed
        locally, OS swaps)."""
        prev = self.prev_nodes[j]
        nodes, local, swaps = take_nodes(
            self.owner, self.node_os, self.free_by_os, j, self.os[j], count, _NO_NODES if prev is None else prev
        )
        self.free -= count
        return nodes, local, swaps

    def _start(self, j: int, now: float, privileged: bool, nodes: list[int] | None = None, ready: float = 0.0) -> None:
        n = self.need[j]
        local = False
        if nodes is None:
            nodes, local, swaps = self._take_nodes(j, n)
        else:
            self.owner[nodes] = j
            swaps = int((self.node_os[nodes] != self.os[j]).sum())
            if swaps:
                self.node_os[nodes] = self.os[j]
        alloc = max(now, ready)
        overhead = self.model.os_swap_s if swaps else 0.0
        if self.prev_nodes[j] is not None:  # a resume: read the checkpoint back
            overhead += self.ckpt_s[j] * (1.0 if local else 2.0)
            if not local:
                self.result.remote_resumes += 1
        self.result.os_swaps += swaps
        self.overhead[j] += overhead
        since = float(self.since_a[j])
        if not math.isnan(since):
            self.pt_a[j] += alloc - since
            self.since_a[j] = math.nan
        run_start = alloc + overhead
        if math.isnan(self.first_start[j]):
            self.first_start[j] = alloc
            if self.inter[j]:
                self._started_waiting(j, alloc)
        self.running[j] = (alloc, run_start, nodes)
        if self._anchors:
            self._anchors.pop(j, None)
        if not self.inter[j]:
            self.batch_running_nodes += n
        self._hold((0, j), run_start + self.est_left[j], n)
        if privileged:
            self.privileged[j] = True
            self.held_interactive += n
            self.result.max_interactive_held = max(self.result.max_interactive_held, self.held_interactive)
            self._cap_moved(self.held_interactive - n, now)
        self.token[j] += 1
        self._push(run_start + self.remaining[j], END, j, self.token[j])

    def _finish(self, j: int, now: float) -> None:
        alloc, _, nodes = self.running.pop(j)
        self._unhold((0, j))
        n = self.need[j]
        if not self.inter[j]:
            self.batch_running_nodes -= n
        self.result.segments.append((j, alloc, now, n))
        self._charge(j, now - alloc)
        self.owner[nodes] = FREE
        self.free += n
        self.free_by_os[self.os[j]] += n  # _start put every node of j on j's image
        if self.privileged[j]:
            self.held_interactive -= n
            self._cap_moved(self.held_interactive + n, now)
        self.end[j] = now
        self.remaining[j] = 0.0

    def _charge(self, j: int, seconds: float) -> None:
        """Add a run's node-seconds to its user's usage (the Target - Usage term)."""
        self.usage[self.share_list[j]] += seconds * self.need[j]

    def _release(self, key: int, now: float) -> None:
        nodes = self._pending_release.pop(key)
        self._unhold((1, key))
        self.owner[nodes] = FREE
        self.free += int(nodes.shape[0])
        self.free_by_os += np.bincount(self.node_os[nodes], minlength=self.model.os_count)

    def _preempt_for(self, j: int, now: float) -> bool:
        """Checkpoint the lowest-priority batch jobs so interactive job j gets its nodes."""
        want = self.need[j] - self.free
        if self.by_cost:
            pc, bound = self.pc_a, self.max_preemptions
            cands = [v for v in self.running if not self.inter[v] and pc[v] < bound]
        else:
            cands = [v for v in self.running if not self.inter[v]]
        if sum(self.need[v] for v in cands) < want:
            return False
        image = self.os[j]
        va = np.array(cands, dtype=np.int64)
        mark = self._mark[2:]  # mark[-2], mark[-1] (CHECKPOINTING, FREE) stay False
        mark[va] = True
        victim_nodes = self._mark[self.owner + 2]
        mark[va] = False
        self._rank[va] = np.arange(va.shape[0])
        victim_os = self.node_os[victim_nodes]
        on_image = np.bincount(
            self._rank[self.owner[victim_nodes]], weights=victim_os == image, minlength=va.shape[0]
        ).tolist()
        extra_by_os = np.bincount(victim_os, minlength=self.model.os_count)
        extra = int(self.need_a[va].sum())
        if self.by_cost:  # cost first: a job preempted fewer times is the cheaper victim
            prio = self.pc_a[va].copy()
            if self.harmless_first and self._guard >= 0:
                prio += HARMFUL * np.array(self._harm(j, now, cands), dtype=np.float64)
        else:
            self._decay(now)
            prio = queue_priorities(
                self.cols,
                va,
                now,
                self.free + extra,
                self.free_by_os + extra_by_os,
                self.held_interactive,
                self.target,
                self.usage,
                self.conf,
                True,
            )
        victims = self._victims(want, cands, va, prio, on_image)
        if victims is None:
            return False
        # Nodes for j: free ones on its OS, victims' on its OS, then the rest (stable order).
        free_nodes = np.flatnonzero(self.owner == FREE)
        if self.by_cost and self._guard >= 0 and not self._keeps_guard_with(j, now, victims, free_nodes):
            if not self.fallback:
                return False
            # The guard refused the cheapest victims: once more, harmless ones first (tick).
            prio = prio + HARMFUL * np.array(self._harm(j, now, cands), dtype=np.float64)
            again = self._victims(want, cands, va, prio, on_image)
            if again is None or again == victims or not self._keeps_guard_with(j, now, again, free_nodes):
                return False
            victims = again
        ready = now
        freed: list[tuple[np.ndarray, float]] = []
        for v in victims:
            done_at = now + self.ckpt_s[v]
            ready = max(ready, done_at)
            freed.append((self._checkpoint(v, now), done_at))
        pool = np.concatenate([free_nodes, *(nodes for nodes, _ in freed)])
        first = np.argsort(self.node_os[pool] != image, kind="stable")
        take = pool[first[: self.need[j]]]
        in_take = np.zeros(self.model.nodes, dtype=bool)
        in_take[take] = True
        taken_free = free_nodes[in_take[free_nodes]]
        self.free -= int(taken_free.shape[0])
        self.free_by_os -= np.bincount(self.node_os[taken_free], minlength=self.model.os_count)
        # Victims' nodes j does not need go back to the free pool when their checkpoint ends.
        for nodes, done_at in freed:
            rest = nodes[~in_take[nodes]]
            if rest.shape[0] == 0:
                continue
            self.seq += 1
            key = self.seq
            self._pending_release[key] = rest
            self._hold((1, key), done_at, int(rest.shape[0]))
            self._push(done_at, RELEASE, key)
            if self.by_cost and self._guard >= 0:
                self._covered.append((done_at, int(rest.shape[0])))
        self._start(j, now, True, nodes=take, ready=ready)
        if self.by_cost and self._guard >= 0:  # its nodes are the victims' (their return)
            self._covered.append(self.holds[(0, j)])
        return True

    def _victims(
        self, want: int, cands: list[int], va: np.ndarray, prio: np.ndarray, on_image: list[float]
    ) -> list[int] | None:
        """`choose_victims` over `cands` (`va` as an array) by `prio`; None: not enough."""
        # Only candidates up to the priority at which the lowest-priority ones free enough
        # nodes can be chosen (choose_victims takes them in priority order, all of that
        # priority included): the others are left out before building Candidates.
        by_prio = np.argsort(prio, kind="stable")
        enough = int(np.searchsorted(np.cumsum(self.need_a[va][by_prio]), want))
        within = np.flatnonzero(prio <= prio[by_prio[enough]]).tolist()
        chosen = choose_victims(
            want,
            (
                Candidate(
                    str(cands[k]), float(prio[k]), self.need[cands[k]], int(on_image[k]), self.mem_bytes[cands[k]]
                )
                for k in within
            ),
        )
        return None if chosen is None else [int(c.job_id) for c in chosen]

    def _keeps_guard_with(self, j: int, now: float, victims: list[int], free_nodes: np.ndarray) -> bool:
        """`_keeps_guard` for j on the nodes it would take: free ones on its OS, the victims'
        on its OS, then the rest (as `_preempt_for` takes them)."""
        pool = np.concatenate([free_nodes, *(self.running[v][2] for v in victims)])
        first = np.argsort(self.node_os[pool] != self.os[j], kind="stable")[: self.need[j]]
        return self._keeps_guard(j, now, victims, int((first < free_nodes.shape[0]).sum()))

    def _guard_holds(self) -> list[tuple[float, int]]:
        """What holds nodes as the guard's reservation counts it (`tick._Pass.guard_holds`)."""
        held = list(self._held)
        for hold in self._covered:
            held.remove(hold)
        return [*held, *self._returning]

    def _harm(self, j: int, now: float, cands: list[int]) -> list[bool]:
        """Which of `cands` would move the guard's reserved start if j preempted them
        (`guard.harmful`, with the holds `_keeps_guard` reads; `tick._Pass.harm`)."""
        start, _ = reservation(now, self.free, self.need[self._guard], self._guard_holds())
        return harmful(now, start, [(self.holds[(0, v)][0], self.ckpt_s[v]) for v in cands], self.est_left[j])

    def _keeps_guard(self, j: int, now: float, victims: list[int], taken_free: int) -> bool:
        """Whether starting j on `taken_free` free nodes and the nodes of `victims` (none: a
        plain start) keeps the guard's reservation within the slack (`guard.keeps_reservation`,
        with the numbers `tick.decide` uses)."""
        ready = now
        for v in victims:
            ready = max(ready, now + self.ckpt_s[v])
        gone = [(*self.holds[(0, v)], self.ckpt_s[v]) for v in victims]
        ok, now_reserved = keeps_reservation(
            now,
            self.free,
            self.need[self._guard],
            self._guard_holds(),
            gone,
            taken_free,
            ready + self.est_left[j],
            self.head_slack_s,
            self._anchors.get(self._guard),
        )
        self._anchors.setdefault(self._guard, now_reserved)
        if ok and victims:
            self._returning += returning(now, gone, ready + self.est_left[j])
            if taken_free:
                self._returning.append((ready + self.est_left[j], taken_free))
        return ok

    def _checkpoint(self, v: int, now: float) -> np.ndarray:
        """Suspend running batch job v to disk; its nodes stay busy until the write ends."""
        alloc, run_start, nodes = self.running.pop(v)
        self._unhold((0, v))
        self.batch_running_nodes -= self.need[v]
        ckpt = self.ckpt_s[v]
        self.token[v] += 1
        progress = max(0.0, now - run_start)
        if now < run_start:  # caught while still resuming or swapping OS: that part is void
            self.overhead[v] -= run_start - now
        self.remaining[v] = max(0.0, self.remaining[v] - progress)
        self.est_left[v] = max(self.est_left[v] - progress, self.remaining[v])
        self.est_a[v] = self.est_left[v]
        self.result.segments.append((v, alloc, now + ckpt, self.need[v]))
        self._charge(v, now - alloc)
        self.overhead[v] += ckpt
        self.pc_a[v] += 1
        self.since_a[v] = now
        self.prev_nodes[v] = nodes
        self.owner[nodes] = CHECKPOINTING
        self.result.preemptions += 1
        self.result.checkpoint_bytes += self.mem_bytes[v]
        self._push(now + ckpt, REQUEUE, v)
        return nodes


def user_names(users: np.ndarray) -> list[str]:
    """The names the configuration's `[priority] targets` use for a trace's integer user ids:
    the id in decimal ("42"; "-1" for the unknown user)."""
    return [str(int(u)) for u in users]


def user_targets(w: Workload, users: np.ndarray, share: np.ndarray, cfg: PriorityConfig) -> np.ndarray:
    """Each user's target share (0..1), by the live rule (`ubis_priority.shares`): the user's
    own `[priority] targets` entry, else the user's account's `account_targets` share split
    between the account's users, else an equal part of what is left over. A user's account is
    the one of their first job in the trace (`Workload.account`, the SWF group; none when the
    trace has none); a trace gives each job one user and each user one account here, so the
    usage the simulator charges per user is the usage of that (user, account) entity.
    With no targets configured every user gets 1/n, as before targets were honoured."""
    names = user_names(users)
    account = [""] * len(names)
    if w.account is not None:
        seen = [False] * len(names)
        for k, acct in zip(share.tolist(), w.account.tolist(), strict=True):
            if not seen[k]:
                seen[k] = True
                account[k] = str(acct) if acct >= 0 else ""
    entities = list(zip(names, account, strict=True))
    shares = target_shares(entities, {}, cfg)
    return np.array([shares[e] for e in entities], dtype=np.float64)


def _leading(order: np.ndarray) -> Iterator[int]:
    """The entries of `order` as ints, converted a few at a time: a pass usually stops at
    one of the first few jobs, and converting the whole queue (hundreds of jobs) at every
    pass was a measurable share of it."""
    at, size = 0, 8
    while at < order.shape[0]:
        yield from order[at : at + size].tolist()
        at += size
        size *= 4


def simulate(
    workload: Workload,
    model: ClusterModel,
    policy: str,
    priority: PriorityConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    scheduling: SchedulingConfig | None = None,
    cap_mode: str = "preempt",
) -> Result:
    """Replay `workload` on `model` under `policy`; see Simulation."""
    return Simulation(workload, model, policy, priority, progress, scheduling, cap_mode).run()
