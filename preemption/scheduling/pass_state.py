"""The cluster as one scheduling pass (`tick.decide`) changes it, and what moving work costs.

Why apart from `tick.py`: `decide` is the pass's walk over the queue; this is the state it
walks over (who holds which node, which image each node runs, what holds nodes until when
for EASY, the nodes interactive jobs hold for the cap) and the two moves it makes on it
(start a job, checkpoint victims for an interactive job), with the vjob guard's bookkeeping.
The simulator keeps the same state in arrays (simulator/engine*.py) and
tests/test_decision_differential.py holds the two equal.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from types import MappingProxyType

import numpy as np

from preemption.scheduling.guard import (
    HARMFUL,
    harmful,
    keeps_reservation_sorted,
    reserved_after_sorted,
    reserved_start,
    returning,
)
from preemption.scheduling.nodes import pick_nodes, preemptor_nodes, swaps
from preemption.scheduling.policies import Policy
from preemption.scheduling.reserve import need_beside, recent_interactive, reserve_asked, reserve_nodes
from preemption.scheduling.running_base import BASES, estimate
from preemption.scheduling.victim_pool import VictimPool, vm_bytes
from preemption.scheduling.victims import Candidate, choose_victims, running_priorities
from preemption.scheduling.waiting import WaitKind, WaitReason, cap_reason
from ubis_priority import allowed, job_columns
from ubis_priority.interactive import cap_limit, held_by_interactive
from vjob.config import Config
from vjob.model import ClusterView, Job, JobClass, JobState, Node

_job_id = attrgetter("id")


@dataclass(frozen=True)
class Costs:
    """What moving work costs, for the estimated ends EASY's reservation reads (the Entropy
    cost model the simulator uses): a checkpoint writes a job's memory per node at
    `bandwidth_mb_s`, a resume reads it back (twice as long on other nodes), a node switching
    OS image takes `os_swap_s`. The default, free and instantaneous, is the live agent's: its
    RMS does the real backfilling, the pass's only predicts it."""

    os_swap_s: float = 0.0
    bandwidth_mb_s: float = math.inf

    def checkpoint_s(self, job: Job) -> float:
        return float(job.memory_mb) / self.bandwidth_mb_s


class PassState:
    """The cluster as the pass changes it: who holds which node, which image each node runs,
    what holds nodes until when (for EASY), and the nodes interactive jobs hold (the cap)."""

    def __init__(
        self,
        view: ClusterView,
        cfg: Config,
        costs: Costs,
        checkpointable: Collection[str] | None,
        sleeping: Mapping[str, tuple[str, ...]],
        bill_victims: bool,
        policy: Policy,
    ) -> None:
        self.view = view
        self.by_cost = policy.victims_by_cost
        """vjob: victims by cost, bounded preemptions, the guard's reservation kept."""
        self.max_preemptions = cfg.scheduling.max_preemptions
        self.head_slack_s = cfg.scheduling.head_slack_s
        self.interactive_ahead = cfg.scheduling.interactive_ahead
        self.ubis_tiers = cfg.scheduling.tier_order == "ubis"
        self.ubis_interactive = cfg.scheduling.tier_order == "ubis-interactive"
        """vjob: only the interactive tier (jobs within the cap) ranked by UBIS priority."""
        self.guarded = self.by_cost and self.interactive_ahead == "guarded"
        self.harmless_first = cfg.scheduling.victims == "guard"
        self.fallback = cfg.scheduling.victims == "fallback"
        sched = cfg.scheduling
        self.reserve_asked = 0
        """vjob: `[scheduling] interactive_reserve_nodes`, held in this pass (reserve.py)."""
        if self.by_cost and sched.interactive_reserve_nodes > 0:  # none asked: no arrivals to count
            recent = recent_interactive(
                (j.submit_time for j in view.jobs if j.interactive and j.state in (JobState.PENDING, JobState.RUNNING)),
                view.now,
                sched.interactive_reserve_window_s,
            )
            self.reserve_asked = reserve_asked(
                sched.interactive_reserve_nodes, sched.interactive_reserve_arrivals, recent
            )
        self.anchors: dict[str, float] = {}
        """vjob: the guard's reserved start when first checked (`guard.keeps_reservation`)."""
        self.returning: list[tuple[float, int]] = []
        """vjob: this pass's victims as they will hold nodes again (`guard.returning`), and the
        free nodes their preemptors took, until the preemptors' estimated ends."""
        self.covered: list[tuple[float, int]] = []
        """vjob: the holds the returns above stand for (preemptors' runs, victims' checkpoint
        writes), left out of the guard's reservation so that no node is counted twice."""
        self.guard: Job | None = None
        """vjob: the first batch job of the queue order (see `guard.keeps_reservation`)."""
        self.bill_victims = bill_victims
        self.usage = dict(view.usage)
        self.cfg = cfg.priority
        self.costs = costs
        self.now = view.now
        self.checkpointable = None if checkpointable is None else set(checkpointable)
        self.sleeping = sleeping
        cols = job_columns.columns(view.jobs)  # the running ones found in the jobs' columns
        is_running = cols.state == job_columns.RUNNING
        running = cols.pick(np.flatnonzero(is_running))
        most = self.max_preemptions if self.by_cost else None
        # who holds which node, the holds, the pool: the last pass's start brought up to date
        base = BASES.base(view.nodes, running, self.checkpointable, most, vm_bytes(view), self.now)
        self.node_order = base.node_order
        """The usable nodes' names, in the view's order (shared with the start: not changed)."""
        self.node_os = dict(base.node_os)
        self.owner: dict[str, str | None] = dict(base.owner)
        """Node → the job holding it (a victim while its checkpoint is written), None if free."""
        self.holds: dict[tuple[str, str], tuple[float, int]] = dict(base.holds)
        """What holds nodes, for the reservation: (kind, job id) → (estimated end, nodes)."""
        self.checkpointing: dict[str, tuple[str, ...]] = {}
        """Victims of this pass → their nodes still busy with the checkpoint."""
        self.resumed_on: dict[str, tuple[str, ...]] = {}
        """Held jobs the pass starts on the nodes they were saved on (a local resume)."""
        self.jobs: dict[str, Job] = dict(base.jobs)
        """The running jobs and those the pass starts, by id, as the pass changes them: what it
        looks up (victims, their candidates, the started), not every job of the view (120,000
        at a site's size); `_current_view` reads the others from the view."""
        self.held, self.user_held = held_by_interactive(cols.pick(np.flatnonzero(is_running & cols.interactive)))
        self._free = base.free
        self._free_list: list[str] | None = None
        self._sorted_holds: list[tuple[float, int]] | None = None
        """`guard_holds()` sorted, until the holds change (the guard reads its first few)."""
        self.pool = VictimPool(self.checkpointable, most, base.rule[2], self.node_os)
        """The running batch jobs this pass may checkpoint (victim_pool.py)."""
        self.pool.adopt(base.members, base.member_nodes, base.ranked, base.node_os, lambda im: BASES.ranked(base, im))
        self.waits: dict[str, WaitReason] = {}
        """Why `preempt_for` or the guard refused an interactive job (waiting.py)."""

    def free_nodes(self) -> list[str]:
        """The free nodes in node order (built once, then filtered at each start rather than
        found again among every node: do not change it)."""
        if self._free_list is None:
            self._free_list = [n for n in self.node_order if self.owner[n] is None]
        return self._free_list

    def free_count(self) -> int:
        return self._free

    def reserve(self) -> int:
        """The free nodes kept for interactive arrivals now (`reserve.reserve_nodes`)."""
        if not self.reserve_asked:
            return 0
        return reserve_nodes(self.reserve_asked, cap_limit(self.cfg.interactive_cap, len(self.node_order)), self.held)

    def fits_beside(self, job: Job) -> bool:
        """Whether `job`, not a privileged interactive job, starts on the free nodes and
        leaves the reserve free (`reserve.need_beside`)."""
        return need_beside(job.nodes, self.reserve(), len(self.node_order)) <= self.free_count()

    def within_caps(self, job: Job) -> bool:
        """Whether interactive `job` may start now as interactive (the one cap rule)."""
        return allowed(self.cfg, len(self.node_order), self.held, self.user_held.get(job.user, 0), job.nodes)

    def start(self, job: Job, privileged: bool, nodes: tuple[str, ...] | None = None, ready: float = 0.0) -> None:
        """`job` starts now (`nodes` chosen by `nodes.pick_nodes` unless given), once `ready`."""
        resumed = job.id in self.sleeping and job.state is JobState.HELD
        local = False
        if nodes is None:
            previous = self.sleeping.get(job.id, ()) if resumed else ()
            nodes, local = pick_nodes(self.free_nodes(), self.node_os, job.os_image, job.nodes, previous)
            if local:
                self.resumed_on[job.id] = nodes
        switched = swaps(nodes, self.node_os, job.os_image)
        for n in nodes:
            if self.owner.get(n, "") is None:
                self._free -= 1
            self.owner[n] = job.id
            if job.os_image:
                self.node_os[n] = job.os_image
        alloc = max(self.now, ready)
        overhead = self.costs.os_swap_s if switched else 0.0
        if resumed:  # read the checkpoint back: locally at full speed, remotely at half
            overhead += self.costs.checkpoint_s(job) * (1.0 if local else 2.0)
        pt, since = job.preempted_seconds, job.preempted_since
        if since is not None:
            pt += alloc - since
        self.jobs[job.id] = replace(
            job,
            state=JobState.RUNNING,
            allocated_nodes=nodes,
            start_time=alloc,
            preempted_seconds=pt,
            preempted_since=None,
        )
        self._hold(("run", job.id), (alloc + overhead + estimate(job), job.nodes))
        if self._free_list is not None:  # the nodes left free, still in node order
            taken = set(nodes)
            self._free_list = [n for n in self._free_list if n not in taken]
        self.pool.add(self.jobs[job.id], self._nodes_of(self.jobs[job.id]))
        if privileged:
            self.held += job.nodes
            self.user_held[job.user] = self.user_held.get(job.user, 0) + job.nodes

    def preempt_for(self, job: Job) -> tuple[tuple[str, ...], tuple[str, ...], float] | None:
        """Checkpoint the lowest-priority batch jobs (vjob: the cheapest) so interactive `job`
        gets its nodes now: (victims, the nodes `job` takes, the bytes the checkpoints write);
        None when it cannot (or, under vjob, must not). The candidates are the pass's victim
        pool (victim_pool.py), kept as the pass moves rather than found again each time."""
        want = job.nodes - self.free_count()
        can_free = self.pool.nodes
        if can_free < want:
            self.waits[job.id] = WaitReason(WaitKind.NO_VICTIM, limit=self.free_count() + can_free, request=job.nodes)
            return None
        guarded = self.by_cost and self.guard is not None
        candidates: list[Candidate] | None = None
        if self.by_cost and not (self.harmless_first and guarded):
            chosen = self.pool.cheapest(want, job.os_image)  # cost first: fewer preemptions is cheaper
        else:
            candidates = self._priced(job)
            chosen = choose_victims(want, candidates)
        if chosen is None:
            self.waits[job.id] = WaitReason(WaitKind.NO_VICTIM, limit=self.free_count() + can_free, request=job.nodes)
            return None
        victims = tuple(c.job_id for c in chosen)
        take = self._take_for(job, victims)
        if guarded and not self._keeps_guard_on(job, victims, take):
            if not self.fallback:
                return None
            # The guard refused the cheapest victims: once more, harmless ones first.
            if candidates is None:
                candidates = self._priced(job)
            harm = self.harm(job, [self.jobs[c.job_id] for c in candidates])
            again = choose_victims(
                want, [c._replace(priority=c.priority + HARMFUL * h) for c, h in zip(candidates, harm, strict=True)]
            )
            if again is None or [c.job_id for c in again] == list(victims):
                return None
            victims = tuple(c.job_id for c in again)
            take = self._take_for(job, victims)
            if not self._keeps_guard_on(job, victims, take):
                return None
            chosen = again
        self._checkpoint(victims, take)
        self.start(job, True, nodes=take, ready=max([self.now, *(self._ckpt_end(v) for v in victims)]))
        if guarded:  # its nodes are the victims' (their return)
            self._cover(self.holds[("run", job.id)])
        return victims, take, sum(c.checkpoint_bytes for c in chosen)

    def _priced(self, job: Job) -> list[Candidate]:
        """Every candidate victim of the pool, priced: vjob by its preempt count (after every
        harmless one when `victims = "guard"`), ubis by its UBIS priority as if queued again
        now, in the view as the pass has changed it."""
        ids = list(self.pool.members)
        if self.by_cost:
            prio = {v: float(self.pool.members[v].preempt_count) for v in ids}
            if self.harmless_first and self.guard is not None:
                for v, harm in zip(ids, self.harm(job, [self.jobs[v] for v in ids]), strict=True):
                    if harm:  # after every harmless one (preempt counts are at most 1000)
                        prio[v] += HARMFUL
        else:
            prio = running_priorities(self._current_view(), self.cfg, (JobClass.BATCH,), only=set(ids))
        return self.pool.candidates(job.os_image, prio)

    def _ckpt_end(self, victim: str) -> float:
        return self.now + self.costs.checkpoint_s(self.jobs[victim])

    def _checkpoint(self, victims: Sequence[str], take: Sequence[str]) -> None:
        """`victims` checkpointed for a job taking `take`: out of the pool, their runs' holds
        gone, the nodes the job does not take busy until their checkpoint is written."""
        taken = set(take)
        for v in victims:
            nodes = self._nodes_of(self.jobs[v])
            done_at = self._ckpt_end(v)
            self._unhold(("run", v))
            self.pool.remove(v)
            if self.bill_victims:
                victim = self.jobs[v]
                ran = self.now - (self.now if victim.start_time is None else victim.start_time)
                self.usage[victim.user] = self.usage.get(victim.user, 0.0) + ran * victim.nodes
            busy = tuple(n for n in nodes if n not in taken)
            self.checkpointing[v] = busy
            if busy:
                self._hold(("checkpoint", v), (done_at, len(busy)))
                if self.by_cost and self.guard is not None:
                    self._cover((done_at, len(busy)))

    def _take_for(self, job: Job, victims: Sequence[str]) -> tuple[str, ...]:
        """The nodes `job` gets from the free ones and those of `victims` (its OS first)."""
        victim_nodes = [self._nodes_of(self.jobs[v]) for v in victims]
        return preemptor_nodes(self.free_nodes(), victim_nodes, self.node_os, job.os_image, job.nodes)

    def _keeps_guard_on(self, job: Job, victims: Sequence[str], take: Sequence[str]) -> bool:
        """`keeps_guard` for `job` started on `take`, the nodes `_take_for` chose."""
        free = set(self.free_nodes())
        return self.keeps_guard(job, victims, sum(1 for n in take if n in free))

    def guard_holds(self) -> list[tuple[float, int]]:
        """What holds nodes as the guard's reservation counts it: this pass's victims by
        their return instead of the holds those returns stand for."""
        held = list(self.holds.values())
        for hold in self.covered:
            held.remove(hold)
        return [*held, *self.returning]

    def _guard_sorted(self) -> list[tuple[float, int]]:
        """`guard_holds()` sorted: built at the guard's first check, then kept in step with
        every change (`_hold`, `_unhold`, `_cover`, the returns), never sorted again."""
        if self._sorted_holds is None:
            self._sorted_holds = sorted(self.guard_holds())
        return self._sorted_holds

    def _hold(self, key: tuple[str, str], hold: tuple[float, int]) -> None:
        """`key` holds nodes until `hold` says (estimated end, nodes)."""
        if key in self.holds:
            self._unhold(key)
        self.holds[key] = hold
        self._sorted_in(hold)

    def _unhold(self, key: tuple[str, str]) -> None:
        self._sorted_out(self.holds.pop(key))

    def _cover(self, hold: tuple[float, int]) -> None:
        """`hold` is stood for by a return (`covered`): out of the guard's holds."""
        self.covered.append(hold)
        self._sorted_out(hold)

    def _sorted_in(self, hold: tuple[float, int]) -> None:
        if self._sorted_holds is not None:
            insort(self._sorted_holds, hold)

    def _sorted_out(self, hold: tuple[float, int]) -> None:
        if self._sorted_holds is not None:
            at = bisect_left(self._sorted_holds, hold)
            if at == len(self._sorted_holds) or self._sorted_holds[at] != hold:
                raise ValueError(f"hold {hold} is not among the guard's holds")
            del self._sorted_holds[at]

    def harm(self, job: Job, cands: Sequence[Job]) -> list[bool]:
        """Which of `cands` would move the guard's reserved start if `job` preempted them
        (`guard.harmful`, with the holds `keeps_guard` reads)."""
        assert self.guard is not None
        start = reserved_start(self.now, self.free_count(), self.guard.nodes, self._guard_sorted())
        return harmful(
            self.now,
            start,
            [(self.holds[("run", j.id)][0], self.costs.checkpoint_s(j)) for j in cands],
            estimate(job),
        )

    def keeps_guard(self, job: Job, victims: Sequence[str], taken_free: int) -> bool:
        """Whether starting `job` on `taken_free` free nodes and the nodes of `victims` (none:
        a plain start) keeps the guard's reservation within the slack
        (`guard.keeps_reservation`, with the numbers the simulator uses too)."""
        assert self.guard is not None
        ready = self.now
        for v in victims:
            ready = max(ready, self.now + self.costs.checkpoint_s(self.jobs[v]))
        gone = [(*self.holds[("run", v)], self.costs.checkpoint_s(self.jobs[v])) for v in victims]
        ok, now_reserved = keeps_reservation_sorted(
            self.now,
            self.free_count(),
            self.guard.nodes,
            self._guard_sorted(),
            gone,
            taken_free,
            ready + estimate(job),
            self.head_slack_s,
            self.anchors.get(self.guard.id),
        )
        self.anchors.setdefault(self.guard.id, now_reserved)
        if not ok and victims:  # a refused preemption: the user is told what it would cost
            holds = self._guard_sorted()
            end = ready + estimate(job)
            after = reserved_after_sorted(self.now, self.free_count(), self.guard.nodes, holds, gone, taken_free, end)
            delay = after - self.anchors[self.guard.id]
            self.waits[job.id] = WaitReason(WaitKind.GUARD, request=job.nodes, job=self.guard.id, delay_s=delay)
        if ok and victims:
            back = returning(self.now, gone, ready + estimate(job))
            if taken_free:
                back.append((ready + estimate(job), taken_free))
            self.returning += back
            for hold in back:
                self._sorted_in(hold)
        return ok

    def wait_reasons(self, waiting: Sequence[Job], head: Job | None) -> dict[str, WaitReason]:
        """Why each of `waiting` (interactive jobs the pass did not start) waits, after the
        pass: what `preempt_for` or the guard recorded at its turn, else its size, a cap it is
        over, the job at the head ahead of it, or (it is the head) a policy that does not
        preempt."""
        out: dict[str, WaitReason] = {}
        total = len(self.node_order)
        for job in waiting:
            if job.nodes > total:
                out[job.id] = WaitReason(WaitKind.TOO_LARGE, limit=total, request=job.nodes)
            elif job.id in self.waits:
                out[job.id] = self.waits[job.id]
            elif not self.within_caps(job):
                out[job.id] = cap_reason(self.cfg, total, self.held, self.user_held.get(job.user, 0), job.nodes)
            elif head is not None and head.id != job.id:
                out[job.id] = WaitReason(WaitKind.BEHIND, request=job.nodes, job=head.id)
            else:
                out[job.id] = WaitReason(WaitKind.NO_PREEMPTION, request=job.nodes)
        return out

    def _nodes_of(self, job: Job) -> tuple[str, ...]:
        """The usable nodes `job` holds now, in its allocation order."""
        alloc = job.allocated_nodes
        if len(alloc) == 1:  # most jobs: no generator for one node
            return alloc if self.owner.get(alloc[0]) == job.id else ()
        return tuple(n for n in alloc if self.owner.get(n) == job.id)

    def _current_view(self) -> ClusterView:
        """The view as the pass has changed it so far: started jobs running on their nodes,
        this pass's victims holding only the nodes their checkpoint still occupies, nodes on
        the images they were switched to (under `ubis`, whose victims are priced in it).
        Only what changed is copied, and the ids are the view's own, already checked: it is
        not validated again (that check was most of this view's cost at 120,000 jobs)."""
        busy, now = self.checkpointing, self.jobs
        current = (now.get(j.id, j) for j in self.view.jobs)  # in the view's order, as the pass left them
        jobs = tuple(j if j.id not in busy else replace(j, allocated_nodes=busy[j.id]) for j in current)
        node_os = self.node_os
        nodes = tuple(
            replace(n, os_image=node_os[n.name]) if node_os.get(n.name, n.os_image) != n.os_image else n
            for n in self.view.nodes
        )
        return _same_ids(self.view, jobs, nodes, self.usage)


def _same_ids(
    view: ClusterView, jobs: tuple[Job, ...], nodes: tuple[Node, ...], usage: Mapping[str, float]
) -> ClusterView:
    """`replace(view, jobs=jobs, nodes=nodes, usage=usage)` for jobs and nodes that carry the
    view's own ids (so its uniqueness check would pass), without running that check again."""
    out = object.__new__(ClusterView)
    for name in ClusterView.__dataclass_fields__:
        object.__setattr__(out, name, getattr(view, name))
    object.__setattr__(out, "jobs", jobs)
    object.__setattr__(out, "nodes", nodes)
    object.__setattr__(out, "usage", MappingProxyType(dict(usage)))
    return out
