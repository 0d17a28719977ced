"""The scheduling pass of a vjob-engine replay: `tick.decide` written over the replay's
arrays, with compiled hot paths (the UBIS kernel and queue order, `ubis_priority.compiled`;
EASY, `easy.backfill_arrays` and `backfill_leading`; the vjob order and backfill window,
`vjob_order`; the node choice, `node_pool.take_indexed`; the queue buffer, `queue_rows`).

Why over arrays: 100,000 jobs on 1,056 nodes must replay in seconds.
tests/test_decision_differential.py holds this pass equal to `tick.decide` on random cluster
states. What still differs between live and simulated: docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from preemption.scheduling.easy import backfill_arrays, backfill_leading, reservation
from preemption.scheduling.policies import Order, mms_order, ubis_order, vjob_order
from preemption.scheduling.reserve import need_beside, recent_interactive, reserve_asked
from simulator.engine_actions import NO_NODES
from simulator.engine_preempt import Preempting
from simulator.queue_rows import queue_append, queue_remove
from simulator.vjob_order import AHEAD_OFF, AHEAD_QUEUE, backfill_tiers, vjob_queue_order
from ubis_priority.compiled import queue_priorities, ubis_leading
from ubis_priority.interactive import within_cap

FULL_RANK_ABOVE = 2000
"""Exact ubis: queues longer than this are ranked whole at a pass (same order, same
schedule) instead of through `ubis_leading`, which pays per candidate."""


class SchedulingPass(Preempting):
    """The replay's moves and preemption, and the pass that makes them."""

    def _schedule(self, now: float) -> None:
        """One pass at `now`: the queue in the policy's order, jobs started until the head,
        then EASY backfilling behind it."""
        book, queue = self.book, self.queue
        book.returning = []
        book.covered = []
        arrived = np.array(queue.arrived, dtype=np.int64) if queue.arrived else NO_NODES
        if arrived.shape[0]:
            queue.length = queue_append(queue.jobs, queue.rows, queue.length, self.jobs.cols, arrived)
            queue.arrived = []
        rules = self.rules
        if rules.reserve_nodes and rules.reserve_arrivals:  # the adaptive reserve: what tick's PassState sees
            qa = queue.jobs[: queue.length]
            seen = [*qa[self.jobs.inter_a[qa]].tolist(), *(j for j in self.cluster.running if self.jobs.inter[j])]
            recent = recent_interactive((self.jobs.submit[j] for j in seen), now, rules.reserve_window_s)
            book.reserve_asked = reserve_asked(rules.reserve_nodes, rules.reserve_arrivals, recent)
        order, ranking = self._order(queue.jobs[: queue.length], now, arrived)
        started, head, head_at, head_priv = self._walk(order, ranking, now)
        if head >= 0 and self.cluster.free > 0 and not (rules.policy.blocks_behind_interactive and head_priv):
            late = self._backfill(now, order, ranking, head, head_at, head_priv)
            for j in late.tolist():
                priv = self.jobs.inter[j] and within_cap(
                    self.cluster.held_interactive, self.jobs.need[j], rules.cap_nodes
                )
                self._start(j, now, priv)
                started.append(j)
        if started:
            done = np.array(started, dtype=np.int64)
            mark = self.scratch.mark[2:]
            queue.length = queue_remove(queue.jobs, queue.rows, queue.length, done, mark)
            if queue.ranked.shape[0]:
                mark[done] = True
                queue.ranked = queue.ranked[~mark[queue.ranked]]
                mark[done] = False
            for j in started:
                self._dequeued(j)

    def _walk(
        self, order: np.ndarray, ranking: tuple[np.ndarray, np.ndarray] | None, now: float
    ) -> tuple[list[int], int, int, bool]:
        """The queue in `order` until the head: each job that fits starts, an interactive job
        within the cap that does not fit preempts (when the policy lets it), and the first
        that can do neither is the head. Returns (started, head or -1, its position in
        `order`, whether it is a privileged interactive job)."""
        jobs, cluster, rules = self.jobs, self.cluster, self.rules
        need, inter, cap_nodes = jobs.need, jobs.inter, rules.cap_nodes
        started: list[int] = []
        for pos, j in enumerate(_leading(order) if ranking is None else order.tolist()):
            n = need[j]
            priv = inter[j] and within_cap(cluster.held_interactive, n, cap_nodes)
            if rules.hard_cap and inter[j] and not priv:
                continue  # beyond the cap: it waits, and is not the head either
            if rules.guarded and inter[j] and not priv:  # vjob: beyond the cap, never the head
                if self._fits_beside(n) and (self.book.guard < 0 or self._keeps_guard(j, now, [], n)):
                    self._start(j, now, False)
                    started.append(j)
                continue
            if (n <= cluster.free) if priv else self._fits_beside(n):
                self._start(j, now, priv)
                started.append(j)
                continue
            if priv and rules.policy.preempts and self._preempt_for(j, now):
                started.append(j)
                continue
            return started, j, pos, priv
        return started, -1, 0, False

    def _backfill(
        self,
        now: float,
        order: np.ndarray,
        ranking: tuple[np.ndarray, np.ndarray] | None,
        head: int,
        head_at: int,
        head_priv: bool,
    ) -> np.ndarray:
        """The jobs behind the head (at `head_at` of `order`) EASY starts without delaying
        its reservation, the reserve for interactive arrivals kept free beside it."""
        jobs, rules, free = self.jobs, self.rules, self.cluster.free
        kept = self._reserve()
        need_head = jobs.need[head] if head_priv else need_beside(jobs.need[head], kept, self.model.nodes)
        shadow, extra = reservation(now, free, need_head, self.cluster.held)
        bf_free = max(0, free - kept)
        depth = self.model.backfill_depth
        if ranking is None and rules.policy.order is Order.TIERS and not rules.full_sort_vjob:
            return backfill_tiers(
                now,
                bf_free,
                shadow,
                extra,
                order,
                head_at + 1,
                jobs.inter_a,
                jobs.need_a,
                jobs.est_a,
                rules.ahead == "backfill",
                -1 if depth is None else depth,
                rules.hard_cap,
                self.scratch.vrest,
            )
        if ranking is None:
            rest = order[head_at + 1 :]
            if rules.by_cost and rules.ahead == "backfill":  # interactive jobs looked at first
                inter = jobs.inter_a[rest]
                rest = np.concatenate((rest[inter], rest[~inter]))
            if depth is not None:
                rest = rest[:depth]
            if rules.hard_cap:
                rest = rest[~jobs.inter_a[rest]]
            return backfill_arrays(now, bf_free, shadow, extra, rest, jobs.need_a[rest], jobs.est_a[rest], -1)
        # `order` is only the part of the queue order a pass can act on
        entries, prio = ranking
        count = backfill_leading(
            now,
            free,
            shadow,
            extra,
            order,
            entries,
            prio,
            self.queue.rows,
            head_at,
            jobs.need_a,
            jobs.est_a,
            -1 if depth is None else depth,
            self.scratch.late,
        )
        return self.scratch.late[:count]

    def _order(
        self, qa: np.ndarray, now: float, arrived: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The queue `qa` in the policy's order (job indices), or for exact ubis the part of
        that order a pass can act on, with its entries in `qa` and every queued job's
        priority (`ubis_leading`); `arrived`: queued since the last pass."""
        order = self.rules.policy.order
        if order is Order.UBIS and self.model.priority_refresh_s > 0:
            return self._ranked_order(qa, now, arrived), None
        if order is Order.SUBMIT or qa.shape[0] == 1:
            self.book.guard = int(qa[0]) if self.rules.by_cost and not self.jobs.inter[int(qa[0])] else -1
            return qa, None
        if order is Order.TIERS:
            return self._vjob_order(qa, now), None
        if order is Order.PRIVILEGED_FIRST:
            priv = self._privileged(qa)
            if not priv.any():
                return qa, None
            return qa[mms_order(self.jobs.submit_a[qa], priv)], None
        if qa.shape[0] > FULL_RANK_ABOVE or self.rules.hard_cap:
            # a queue this long is mostly jobs that fit (a backlog of small jobs): sorting
            # all of it once costs less than placing the candidates one by one
            return qa[ubis_order(self._priorities(qa, now), self.jobs.submit_a[qa])], None
        m = ubis_leading(
            self.queue.rows,
            qa,
            *self._rating(now),
            self.rules.policy.preempts,
            self.scratch.lead_jobs,
            self.scratch.lead_entries,
            self.scratch.lead_prio,
        )
        return self.scratch.lead_jobs[:m], (self.scratch.lead_entries[:m], self.scratch.lead_prio[: qa.shape[0]])

    def _vjob_order(self, qa: np.ndarray, now: float) -> np.ndarray:
        """The queue `qa` in vjob's order (tiers, then the UBIS priority at `now`, then
        submission, then job index) and the guard set (its first batch job): compiled, or
        with `full_sort_vjob` by `policies.vjob_order` (the job index is the id's rank)."""
        jobs = self.jobs
        # submission order inside the tiers: equal priorities leave (submission, job) to decide
        prio = self._priorities(qa, now) if self.rules.ubis_tiers else np.zeros(qa.shape[0])
        if self.rules.ubis_interactive:  # only the interactive jobs within the cap are rated
            priv = self._privileged(qa)
            if priv.any():
                prio[priv] = self._priorities(qa[priv], now)
        ahead = self.rules.ahead in ("queue", "guarded")
        if not self.rules.full_sort_vjob:
            self.book.guard = vjob_queue_order(
                qa,
                jobs.inter_a,
                jobs.need_a,
                jobs.pc_a,
                jobs.submit_a,
                prio,
                self.cluster.held_interactive,
                float(self.rules.cap_nodes),
                AHEAD_QUEUE if ahead else AHEAD_OFF,
                self.scratch.vorder,
                self.scratch.vtier,
                self.scratch.vprio,
            )
            return self.scratch.vorder[: qa.shape[0]]
        inter = jobs.inter_a[qa]
        by = vjob_order(jobs.submit_a[qa], self._privileged(qa), jobs.pc_a[qa] > 0, inter if ahead else None, prio, qa)
        batch = np.flatnonzero(~inter[by])
        self.book.guard = int(qa[by[batch[0]]]) if batch.shape[0] else -1
        return qa[by]

    def _privileged(self, qa: np.ndarray) -> np.ndarray:
        """Which of the jobs `qa` are interactive jobs within the cap now."""
        return self.jobs.inter_a[qa] & within_cap(
            self.cluster.held_interactive, self.jobs.need_a[qa], self.rules.cap_nodes
        )

    def _priorities(self, qa: np.ndarray, now: float) -> np.ndarray:
        """UBIS priorities of the jobs `qa` at `now` (the compiled kernel, which gives
        `compute_arrays`'s priorities to the last bit)."""
        return queue_priorities(self.jobs.cols, qa, *self._rating(now), False)

    def _rating(self, now: float) -> tuple[float, int, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
        """The cluster state the compiled kernel rates queued jobs with at `now` (usage
        decayed first): now, free nodes, free nodes per image, nodes held by interactive jobs,
        targets, usage, the configuration's scalars."""
        self._decay(now)
        return (
            now,
            self.cluster.free,
            self.cluster.free_by_os,
            self.cluster.held_interactive,
            self.ledger.target,
            self.ledger.usage,
            self.rules.conf,
        )

    def _ranked_order(self, qa: np.ndarray, now: float, arrived: np.ndarray) -> np.ndarray:
        """ubis with `priority_refresh_s`: every job of `qa` ranked afresh once the last
        ranking is that old; in between the ranking is kept, jobs that left the queue drop
        out of it (`_schedule`), and jobs queued since are rated now and placed by their
        priority, after the jobs already ranked with an equal one."""
        if now - self.queue.rated_at >= self.model.priority_refresh_s:
            self.queue.rated_at = now
            prio = self._priorities(qa, now)
            self.queue.prio[qa] = prio
            self.queue.ranked = qa[ubis_order(prio, self.jobs.submit_a[qa])]
        elif arrived.shape[0]:
            prio = self._priorities(arrived, now)
            self.queue.prio[arrived] = prio
            new = arrived[ubis_order(prio, self.jobs.submit_a[arrived])]
            at = np.searchsorted(-self.queue.prio[self.queue.ranked], -self.queue.prio[new], side="right")
            self.queue.ranked = np.insert(self.queue.ranked, at, new)
        return self.queue.ranked


def _leading(order: np.ndarray) -> Iterator[int]:
    """The entries of `order` as ints, converted a few at a time: a pass usually stops at
    one of the first few jobs, and converting the whole queue (hundreds of jobs) at every
    pass was a measurable share of it."""
    at, size = 0, 8
    while at < order.shape[0]:
        yield from order[at : at + size].tolist()
        at += size
        size *= 4
