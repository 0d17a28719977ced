"""The preemption of a vjob-engine replay: an interactive job within the cap that does not
fit checkpoints running batch jobs (the lowest UBIS priority; under vjob the cheapest, only
while the guard's reservation holds) and starts once their checkpoints are written.

Why its own module: it is the simulator's copy of `tick`'s `PassState.preempt_for` and the
guard's bookkeeping (`harm`, `keeps_guard`, `guard_holds`), written over the replay's arrays;
tests/test_decision_differential.py holds the two equal.
"""

from __future__ import annotations

import math

import numpy as np

from preemption.scheduling.easy import reservation
from preemption.scheduling.guard import HARMFUL, harmful, keeps_reservation, returning
from preemption.scheduling.victims import Candidate, choose_victims
from simulator.engine_actions import CHECKPOINTING, RELEASE, REQUEUE, Actions
from simulator.node_pool import victim_tally
from ubis_priority.compiled import queue_priorities


class Preempting(Actions):
    """The replay's moves, and checkpointing victims for an interactive job."""

    def _preempt_for(self, j: int, now: float) -> bool:
        """Checkpoint the lowest-priority batch jobs so interactive job j gets its nodes."""
        want = self.jobs.need[j] - self.cluster.free
        if self.rules.by_cost:
            pc, bound = self.jobs.pc_a, self.rules.max_preemptions
            cands = [v for v in self.cluster.running if not self.jobs.inter[v] and pc[v] < bound]
        else:
            cands = [v for v in self.cluster.running if not self.jobs.inter[v]]
        extra = sum(self.jobs.need[v] for v in cands)
        if extra < want:
            return False
        image = self.jobs.os[j]
        va = np.array(cands, dtype=np.int64)
        # per candidate its nodes on j's image; all their nodes per image; the free nodes
        on_image_a, extra_by_os, free_nodes = victim_tally(
            self.cluster.owner,
            self.cluster.node_os,
            va,
            image,
            self.model.os_count,
            self.scratch.mark[2:],
            self.scratch.rank,
        )
        on_image = on_image_a.tolist()
        if self.rules.by_cost:  # cost first: a job preempted fewer times is the cheaper victim
            prio = self.jobs.pc_a[va].copy()
            if self.rules.harmless_first and self.book.guard >= 0:
                prio += HARMFUL * np.array(self._harm(j, now, cands), dtype=np.float64)
        else:
            self._decay(now)
            prio = queue_priorities(
                self.jobs.cols,
                va,
                now,
                self.cluster.free + extra,
                self.cluster.free_by_os + extra_by_os,
                self.cluster.held_interactive,
                self.ledger.target,
                self.ledger.usage,
                self.rules.conf,
                True,
            )
        victims = self._victims(want, cands, va, prio, on_image)
        if victims is None:
            return False
        # Nodes for j: free ones on its OS, victims' on its OS, then the rest (stable order).
        if self.rules.by_cost and self.book.guard >= 0 and not self._keeps_guard_with(j, now, victims, free_nodes):
            if not self.rules.fallback:
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
            done_at = now + self.jobs.ckpt_s[v]
            ready = max(ready, done_at)
            freed.append((self._checkpoint(v, now), done_at))
        pool = np.concatenate([free_nodes, *(nodes for nodes, _ in freed)])
        first = np.argsort(self.cluster.node_os[pool] != image, kind="stable")
        take = pool[first[: self.jobs.need[j]]]
        in_take = np.zeros(self.model.nodes, dtype=bool)
        in_take[take] = True
        taken_free = free_nodes[in_take[free_nodes]]
        self.cluster.free -= int(taken_free.shape[0])  # free_by_os: when _start claims them
        # Victims' nodes j does not need go back to the free pool when their checkpoint ends.
        for nodes, done_at in freed:
            rest = nodes[~in_take[nodes]]
            if rest.shape[0] == 0:
                continue
            self.seq += 1
            key = self.seq
            self.cluster.pending_release[key] = rest
            self._hold((1, key), done_at, int(rest.shape[0]))
            self._push(done_at, RELEASE, key)
            if self.rules.by_cost and self.book.guard >= 0:
                self.book.covered.append((done_at, int(rest.shape[0])))
        self._start(j, now, True, nodes=take, ready=ready)
        if self.rules.by_cost and self.book.guard >= 0:  # its nodes are the victims' (their return)
            self.book.covered.append(self.cluster.holds[(0, j)])
        return True

    def _victims(
        self, want: int, cands: list[int], va: np.ndarray, prio: np.ndarray, on_image: list[float]
    ) -> list[int] | None:
        """`choose_victims` over `cands` (`va` as an array) by `prio`; None: not enough."""
        # Only candidates up to the priority at which the lowest-priority ones free enough
        # nodes can be chosen (choose_victims takes them in priority order, all of that
        # priority included): the others are left out before building Candidates.
        # In plain lists: a preemption is tried with a few dozen candidates at most (ten on
        # average at 10,000 nodes), where NumPy's per-call cost outweighs its loops; the same
        # steps as a stable argsort, a cumulative sum and its first entry reaching `want`.
        p = prio.tolist()
        need = self.jobs.need
        cut = math.inf
        freed = 0
        for k in sorted(range(len(p)), key=p.__getitem__):
            freed += need[cands[k]]
            if freed >= want:
                cut = p[k]
                break
        chosen = choose_victims(
            want,
            (
                Candidate(str(cands[k]), p[k], need[cands[k]], int(on_image[k]), self.jobs.mem_bytes[cands[k]])
                for k in range(len(p))
                if p[k] <= cut
            ),
        )
        return None if chosen is None else [int(c.job_id) for c in chosen]

    def _keeps_guard_with(self, j: int, now: float, victims: list[int], free_nodes: np.ndarray) -> bool:
        """`_keeps_guard` for j on the nodes it would take: free ones on its OS, the victims'
        on its OS, then the rest (as `_preempt_for` takes them). Of that order only how many
        of j's nodes are free ones matters, which the counts on its OS tell without sorting:
        all the free ones on it up to j's size, then free ones off it once the victims' nodes
        on it are used up."""
        image, need, node_os = self.jobs.os[j], self.jobs.need[j], self.cluster.node_os
        free_on = int(np.count_nonzero(node_os[free_nodes] == image))
        victims_on = sum(int(np.count_nonzero(node_os[self.cluster.running[v][2]] == image)) for v in victims)
        free_off = int(free_nodes.shape[0]) - free_on
        taken_free = min(need, free_on) + max(0, min(need - free_on - victims_on, free_off))
        return self._keeps_guard(j, now, victims, taken_free)

    def _guard_holds(self) -> list[tuple[float, int]]:
        """What holds nodes as the guard's reservation counts it (`pass_state.PassState.guard_holds`)."""
        held = list(self.cluster.held)
        for hold in self.book.covered:
            held.remove(hold)
        return [*held, *self.book.returning]

    def _harm(self, j: int, now: float, cands: list[int]) -> list[bool]:
        """Which of `cands` would move the guard's reserved start if j preempted them
        (`guard.harmful`, with the holds `_keeps_guard` reads; `PassState.harm`)."""
        start, _ = reservation(now, self.cluster.free, self.jobs.need[self.book.guard], self._guard_holds())
        return harmful(
            now, start, [(self.cluster.holds[(0, v)][0], self.jobs.ckpt_s[v]) for v in cands], self.jobs.est_left[j]
        )

    def _keeps_guard(self, j: int, now: float, victims: list[int], taken_free: int) -> bool:
        """Whether starting j on `taken_free` free nodes and the nodes of `victims` (none: a
        plain start) keeps the guard's reservation within the slack (`guard.keeps_reservation`,
        with the numbers `tick.decide` uses)."""
        ready = now
        for v in victims:
            ready = max(ready, now + self.jobs.ckpt_s[v])
        gone = [(*self.cluster.holds[(0, v)], self.jobs.ckpt_s[v]) for v in victims]
        ok, now_reserved = keeps_reservation(
            now,
            self.cluster.free,
            self.jobs.need[self.book.guard],
            self._guard_holds(),
            gone,
            taken_free,
            ready + self.jobs.est_left[j],
            self.rules.head_slack_s,
            self.book.anchors.get(self.book.guard),
        )
        self.book.anchors.setdefault(self.book.guard, now_reserved)
        if ok and victims:
            self.book.returning += returning(now, gone, ready + self.jobs.est_left[j])
            if taken_free:
                self.book.returning.append((ready + self.jobs.est_left[j], taken_free))
        return ok

    def _checkpoint(self, v: int, now: float) -> np.ndarray:
        """Suspend running batch job v to disk; its nodes stay busy until the write ends."""
        alloc, run_start, nodes = self.cluster.running.pop(v)
        self._unhold((0, v))
        self.cluster.batch_running_nodes -= self.jobs.need[v]
        ckpt = self.jobs.ckpt_s[v]
        self.jobs.token[v] += 1
        progress = max(0.0, now - run_start)
        if now < run_start:  # caught while still resuming or swapping OS: that part is void
            self.out.overhead[v] -= run_start - now
        self.jobs.remaining[v] = max(0.0, self.jobs.remaining[v] - progress)
        self.jobs.est_left[v] = max(self.jobs.est_left[v] - progress, self.jobs.remaining[v])
        self.jobs.est_a[v] = self.jobs.est_left[v]
        self.result.segments.append((v, alloc, now + ckpt, self.jobs.need[v]))
        self._charge(v, now - alloc)
        self.out.overhead[v] += ckpt
        self.jobs.pc_a[v] += 1
        self.jobs.since_a[v] = now
        self.jobs.prev_nodes[v] = nodes
        self.cluster.owner[nodes] = CHECKPOINTING
        self.result.preemptions += 1
        self.result.checkpoint_bytes += self.jobs.mem_bytes[v]
        self._push(now + ckpt, REQUEUE, v)
        return nodes
