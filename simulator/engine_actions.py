"""The moves of a vjob-engine replay on its state: queue a job, start it, finish it, free a
victim's spare nodes, and the bookkeeping they carry (the holds EASY reads, the interactive
cap and each interactive job's admitted wait, the usage charged).

Why a base class of its own: the scheduling pass (engine_pass.py) and the preemption
(engine_preempt.py) make these moves, the event loop (engine.py) makes them on events; the
state itself is the records of engine_state.py, built here once per replay.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable

import numpy as np

from preemption.scheduling.reserve import need_beside, reserve_nodes
from simulator.engine_state import (
    NONE_QUEUED,
    PassBook,
    build_cluster,
    build_jobs,
    build_ledger,
    build_outcome,
    build_queue,
    build_rules,
    build_scratch,
    checked_workload,
)
from simulator.node_pool import claim, free_blocks, give_back, take_indexed
from simulator.replay import ClusterModel, Result
from simulator.workload import Workload
from ubis_priority.decay import decay_factor
from ubis_priority.interactive import within_cap
from vjob.config import PriorityConfig, SchedulingConfig

NO_NODES = np.empty(0, dtype=np.int64)
END, RELEASE, REQUEUE = 0, 1, 2
"""The kinds of events: a run ends, a victim's spare nodes are free, a checkpoint is written."""
CHECKPOINTING = -2
"""`Cluster.owner` of a node whose victim's checkpoint is being written."""


class Actions:
    """One replay's state (engine_state's records) and the moves on it."""

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
        self.rules = build_rules(
            policy, model, priority or PriorityConfig(), scheduling or SchedulingConfig(), cap_mode
        )
        self.model = model
        self.progress = progress
        self.w = w = checked_workload(workload, model)
        n = len(w)
        self.ledger, share = build_ledger(w, self.rules.prio_cfg)
        self.jobs = build_jobs(w, model, share)
        self.out = build_outcome(n)
        self.cluster = build_cluster(model)
        self.queue = build_queue(n, self.rules.policy, model)
        self.scratch = build_scratch(n)
        self.book = PassBook(self.rules.reserve_nodes if not self.rules.reserve_arrivals else 0)
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.result = Result(
            policy=self.rules.policy.name,
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

    def _enqueue(self, j: int, now: float) -> None:
        """Job j joins the queue at `now` (submitted, or its checkpoint written)."""
        queue = self.queue
        queue.arrived.append(j)
        n = self.jobs.need[j]
        queue.sizes[n] = queue.sizes.get(n, 0) + 1
        if n < queue.smallest:
            queue.smallest = n
        if self.jobs.inter[j]:
            queue.interactive[n] = queue.interactive.get(n, 0) + 1
            queue.waiting.setdefault(n, {})[j] = None
            if within_cap(self.cluster.held_interactive, n, self.rules.cap_nodes):
                queue.fit_since[j] = now

    def _cap_moved(self, before: int, now: float) -> None:
        """The nodes held within the cap went from `before` to `held_interactive`: the queued
        interactive jobs whose size now fits, or no longer fits, start or stop counting
        their admitted wait (`fit_wait`)."""
        after = self.cluster.held_interactive
        for n, jobs in self.queue.waiting.items():
            was, fits = within_cap(before, n, self.rules.cap_nodes), within_cap(after, n, self.rules.cap_nodes)
            if was == fits:
                continue
            for j in jobs:
                if fits:
                    self.queue.fit_since[j] = now
                else:
                    self.out.fit_wait[j] += now - self.queue.fit_since[j]
                    self.queue.fit_since[j] = math.nan

    def _started_waiting(self, j: int, alloc: float) -> None:
        """Interactive job j leaves the queue, running from `alloc` (after its victims'
        checkpoints when it preempted): its admitted wait stops there."""
        n = self.jobs.need[j]
        jobs = self.queue.waiting[n]
        del jobs[j]
        if not jobs:
            del self.queue.waiting[n]
        since = self.queue.fit_since[j]
        if not math.isnan(since):
            self.out.fit_wait[j] += alloc - since
            self.queue.fit_since[j] = math.nan

    def _dequeued(self, j: int) -> None:
        """Job j, started by a pass, leaves the queue's size counts."""
        queue = self.queue
        n = self.jobs.need[j]
        left = queue.sizes[n] - 1
        if left:
            queue.sizes[n] = left
        else:
            del queue.sizes[n]
            if n == queue.smallest:
                queue.smallest = min(queue.sizes, default=NONE_QUEUED)
        if self.jobs.inter[j]:
            left = queue.interactive[n] - 1
            if left:
                queue.interactive[n] = left
            else:
                del queue.interactive[n]

    def _may_start(self) -> bool:
        """Whether a pass could start anything: some queued job fits the free nodes, or a
        queued interactive job within the cap could get its nodes by preemption (it fits in
        the free nodes plus those of running batch jobs). A pass that cannot start anything
        changes nothing, so it is skipped (this is what makes long replays fast)."""
        cluster, queue = self.cluster, self.queue
        if cluster.free >= queue.smallest:
            return True
        if not (self.rules.policy.preempts and queue.interactive):
            return False
        room = cluster.free + cluster.batch_running_nodes
        held, cap = cluster.held_interactive, self.rules.cap_nodes
        return any(size <= room and within_cap(held, size, cap) for size in queue.interactive)

    def _reserve(self) -> int:
        """The free nodes kept for interactive arrivals now (`reserve.reserve_nodes`)."""
        if not self.book.reserve_asked:
            return 0
        return reserve_nodes(self.book.reserve_asked, self.rules.cap_nodes, self.cluster.held_interactive)

    def _fits_beside(self, n: int) -> bool:
        """Whether a job of n nodes that is not a privileged interactive job starts on the
        free nodes and leaves the reserve free (`reserve.need_beside`)."""
        if not self.book.reserve_asked:  # the default: no call in the pass's hot loop
            return n <= self.cluster.free
        return need_beside(n, self._reserve(), self.model.nodes) <= self.cluster.free

    def _hold(self, key: tuple[int, int], end: float, nodes: int) -> None:
        """`key` holds `nodes` nodes until `end` (estimated), as EASY's reservation reads it."""
        cluster = self.cluster
        cluster.holds[key] = (end, nodes)
        bisect.insort(cluster.held, (end, nodes))

    def _unhold(self, key: tuple[int, int]) -> None:
        """`key` holds nothing any more (its run ended or was checkpointed, its write ended)."""
        cluster = self.cluster
        value = cluster.holds.pop(key)
        del cluster.held[bisect.bisect_left(cluster.held, value)]

    def _push(self, t: float, kind: int, j: int, tok: int = 0) -> None:
        """An event at `t`; `seq` keeps events of one instant in the order they were pushed."""
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, j, tok))

    def _decay(self, now: float) -> None:
        """Usage decayed to `now` (the half-life), before anything rates jobs by it."""
        if now > self.ledger.usage_t:
            factor = decay_factor(now - self.ledger.usage_t, self.ledger.half_life)
            if self.ledger.usage.shape[0] == 1:  # the same multiplication, without a ufunc call
                self.ledger.usage[0] = float(self.ledger.usage[0]) * factor
            else:
                self.ledger.usage *= factor
            self.ledger.usage_t = now

    def _take_nodes(self, j: int, count: int) -> tuple[np.ndarray, bool, int]:
        """Free nodes for job j, switched to its image (node_pool.take_indexed: its previous
        nodes when all are free, else nodes already on its OS first). Returns (nodes, resumed
        locally, OS swaps)."""
        prev = self.jobs.prev_nodes[j]
        cluster = self.cluster
        if cluster.free_blk.shape[1] == 0:  # the index, from the nodes as they are now
            cluster.free_blk = free_blocks(cluster.owner, cluster.node_os, self.model.os_count)
        nodes, local, swaps = take_indexed(
            cluster.owner,
            cluster.node_os,
            cluster.free_by_os,
            cluster.free_blk,
            j,
            self.jobs.os[j],
            count,
            NO_NODES if prev is None else prev,
        )
        self.cluster.free -= count
        return nodes, local, swaps

    def _start(self, j: int, now: float, privileged: bool, nodes: list[int] | None = None, ready: float = 0.0) -> None:
        """Job j starts at `now` on free nodes (`nodes` when the preemption chose them), its
        run from `ready` (its victims' checkpoints written) plus its resume and OS swaps."""
        jobs, cluster, out, result = self.jobs, self.cluster, self.out, self.result
        n = jobs.need[j]
        local = False
        if nodes is None:
            nodes, local, swaps = self._take_nodes(j, n)
        else:  # the free nodes among them leave the free counts here
            swaps = claim(cluster.owner, cluster.node_os, cluster.free_by_os, cluster.free_blk, nodes, j, jobs.os[j])
        alloc = max(now, ready)
        overhead = self.model.os_swap_s if swaps else 0.0
        if jobs.prev_nodes[j] is not None:  # a resume: read the checkpoint back
            overhead += jobs.ckpt_s[j] * (1.0 if local else 2.0)
            if not local:
                result.remote_resumes += 1
        result.os_swaps += swaps
        out.overhead[j] += overhead
        since = float(jobs.since_a[j])
        if not math.isnan(since):
            jobs.pt_a[j] += alloc - since
            jobs.since_a[j] = math.nan
        run_start = alloc + overhead
        if math.isnan(out.first_start[j]):
            out.first_start[j] = alloc
            if jobs.inter[j]:
                self._started_waiting(j, alloc)
        cluster.running[j] = (alloc, run_start, nodes)
        if self.book.anchors:
            self.book.anchors.pop(j, None)
        if not jobs.inter[j]:
            cluster.batch_running_nodes += n
        self._hold((0, j), run_start + jobs.est_left[j], n)
        if privileged:
            out.privileged[j] = True
            cluster.held_interactive += n
            result.max_interactive_held = max(result.max_interactive_held, cluster.held_interactive)
            self._cap_moved(cluster.held_interactive - n, now)
        jobs.token[j] += 1
        self._push(run_start + jobs.remaining[j], END, j, jobs.token[j])

    def _finish(self, j: int, now: float) -> None:
        """Job j's run ends at `now`: its nodes are free, its run charged to its user."""
        jobs, cluster = self.jobs, self.cluster
        alloc, _, nodes = cluster.running.pop(j)
        self._unhold((0, j))
        n = jobs.need[j]
        if not jobs.inter[j]:
            cluster.batch_running_nodes -= n
        self.result.segments.append((j, alloc, now, n))
        self._charge(j, now - alloc)
        give_back(cluster.owner, cluster.node_os, cluster.free_by_os, cluster.free_blk, nodes)
        cluster.free += n
        if self.out.privileged[j]:
            cluster.held_interactive -= n
            self._cap_moved(cluster.held_interactive + n, now)
        self.out.end[j] = now
        jobs.remaining[j] = 0.0

    def _charge(self, j: int, seconds: float) -> None:
        """Add a run's node-seconds to its user's usage (the Target - Usage term)."""
        self.ledger.usage[self.ledger.share_list[j]] += seconds * self.jobs.need[j]

    def _release(self, key: int, now: float) -> None:
        """A victim's checkpoint is written: the nodes its preemptor did not take are free."""
        nodes = self.cluster.pending_release.pop(key)
        self._unhold((1, key))
        cluster = self.cluster
        give_back(cluster.owner, cluster.node_os, cluster.free_by_os, cluster.free_blk, nodes)
        cluster.free += int(nodes.shape[0])
