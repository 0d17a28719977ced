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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from preemption.scheduling.easy import reservation
from preemption.scheduling.guard import HARMFUL, harmful, keeps_reservation, reserved_after, returning
from preemption.scheduling.nodes import pick_nodes, preemptor_nodes, swaps
from preemption.scheduling.policies import Policy
from preemption.scheduling.reserve import need_beside, recent_interactive, reserve_asked, reserve_nodes
from preemption.scheduling.victims import Candidate, checkpoint_bytes, choose_victims, running_priorities
from preemption.scheduling.waiting import WaitKind, WaitReason, cap_reason
from ubis_priority import allowed
from ubis_priority.interactive import cap_limit, held_by_interactive
from vjob.config import Config
from vjob.model import ClusterView, Job, JobClass, JobState, Node

DEFAULT_ESTIMATE_S = 3600.0
"""A job's run time estimate when it has no walltime (EASY needs one)."""


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


def estimate(job: Job) -> float:
    """The run time EASY counts on: the job's walltime, else DEFAULT_ESTIMATE_S."""
    return job.walltime if job.walltime is not None and job.walltime > 0 else DEFAULT_ESTIMATE_S


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
        recent = recent_interactive(
            (j.submit_time for j in view.jobs if j.interactive and j.state in (JobState.PENDING, JobState.RUNNING)),
            view.now,
            sched.interactive_reserve_window_s,
        )
        self.reserve_asked = (
            reserve_asked(sched.interactive_reserve_nodes, sched.interactive_reserve_arrivals, recent)
            if self.by_cost
            else 0
        )
        """vjob: `[scheduling] interactive_reserve_nodes`, held in this pass (reserve.py)."""
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
        usable = [n for n in view.nodes if n.state.usable]
        self.node_order = [n.name for n in usable]
        self.node_os = {n.name: n.os_image for n in usable}
        self.owner: dict[str, str | None] = dict.fromkeys(self.node_order)
        """Node → the job holding it (a victim while its checkpoint is written), None if free."""
        self.jobs: dict[str, Job] = {j.id: j for j in view.jobs}
        self.holds: dict[tuple[str, str], tuple[float, int]] = {}
        """What holds nodes, for the reservation: (kind, job id) → (estimated end, nodes)."""
        self.checkpointing: dict[str, tuple[str, ...]] = {}
        """Victims of this pass → their nodes still busy with the checkpoint."""
        self.resumed_on: dict[str, tuple[str, ...]] = {}
        """Held jobs the pass starts on the nodes they were saved on (a local resume)."""
        for job in view.running:
            nodes = [n for n in job.allocated_nodes if n in self.owner]
            for n in nodes:
                self.owner[n] = job.id
            if nodes:
                end = self.now if job.start_time is None else job.start_time + estimate(job)
                self.holds[("run", job.id)] = (end, len(nodes))
        self.held, self.user_held = held_by_interactive(view.running)
        self.waits: dict[str, WaitReason] = {}
        """Why `preempt_for` or the guard refused an interactive job (waiting.py)."""

    def free_nodes(self) -> list[str]:
        return [n for n in self.node_order if self.owner[n] is None]

    def free_count(self) -> int:
        return sum(1 for n in self.node_order if self.owner[n] is None)

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
        self.holds[("run", job.id)] = (alloc + overhead + estimate(job), job.nodes)
        if privileged:
            self.held += job.nodes
            self.user_held[job.user] = self.user_held.get(job.user, 0) + job.nodes

    def preempt_for(self, job: Job) -> tuple[tuple[str, ...], tuple[str, ...], float] | None:
        """Checkpoint the lowest-priority batch jobs (vjob: the cheapest) so interactive `job`
        gets its nodes now: (victims, the nodes `job` takes, the bytes the checkpoints write);
        None when it cannot (or, under vjob, must not)."""
        want = job.nodes - self.free_count()
        cands = [
            j
            for j in self.jobs.values()
            if j.state is JobState.RUNNING
            and j.job_class is JobClass.BATCH
            and j.id not in self.checkpointing
            and (self.checkpointable is None or j.id in self.checkpointable)
            and any(self.owner.get(n) == j.id for n in j.allocated_nodes)
            and (not self.by_cost or j.preempt_count < self.max_preemptions)
        ]
        can_free = sum(len(self._nodes_of(j)) for j in cands)
        if can_free < want:
            self.waits[job.id] = WaitReason(WaitKind.NO_VICTIM, limit=self.free_count() + can_free, request=job.nodes)
            return None
        now_view = self._current_view()
        if self.by_cost:  # cost first: a job preempted fewer times is the cheaper victim
            prio = {j.id: float(j.preempt_count) for j in cands}
            if self.harmless_first and self.guard is not None:
                for j, harm in zip(cands, self.harm(job, cands), strict=True):
                    if harm:  # after every harmless one (preempt counts are at most 1000)
                        prio[j.id] += HARMFUL
        else:
            prio = running_priorities(now_view, self.cfg, (JobClass.BATCH,), only={j.id for j in cands})
        candidates = [
            Candidate(
                j.id,
                prio[j.id],
                len(self._nodes_of(j)),
                sum(1 for n in self._nodes_of(j) if self.node_os[n] == job.os_image),
                checkpoint_bytes(now_view, j),
            )
            for j in cands
        ]
        chosen = choose_victims(want, candidates)
        if chosen is None:
            self.waits[job.id] = WaitReason(WaitKind.NO_VICTIM, limit=self.free_count() + can_free, request=job.nodes)
            return None
        victims = tuple(c.job_id for c in chosen)
        take = self._take_for(job, victims)
        if self.by_cost and self.guard is not None and not self._keeps_guard_on(job, victims, take):
            if not self.fallback:
                return None
            # The guard refused the cheapest victims: once more, harmless ones first.
            harm = self.harm(job, cands)
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
        victim_nodes = [self._nodes_of(self.jobs[v]) for v in victims]
        taken = set(take)
        ready = self.now
        for v, nodes in zip(victims, victim_nodes, strict=True):
            done_at = self.now + self.costs.checkpoint_s(self.jobs[v])
            ready = max(ready, done_at)
            del self.holds[("run", v)]
            if self.bill_victims:
                victim = self.jobs[v]
                ran = self.now - (self.now if victim.start_time is None else victim.start_time)
                self.usage[victim.user] = self.usage.get(victim.user, 0.0) + ran * victim.nodes
            busy = tuple(n for n in nodes if n not in taken)
            self.checkpointing[v] = busy
            if busy:
                self.holds[("checkpoint", v)] = (done_at, len(busy))
                if self.by_cost and self.guard is not None:
                    self.covered.append((done_at, len(busy)))
        self.start(job, True, nodes=take, ready=ready)
        if self.by_cost and self.guard is not None:  # its nodes are the victims' (their return)
            self.covered.append(self.holds[("run", job.id)])
        return victims, take, sum(c.checkpoint_bytes for c in chosen)

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

    def harm(self, job: Job, cands: Sequence[Job]) -> list[bool]:
        """Which of `cands` would move the guard's reserved start if `job` preempted them
        (`guard.harmful`, with the holds `keeps_guard` reads)."""
        assert self.guard is not None
        start, _ = reservation(self.now, self.free_count(), self.guard.nodes, self.guard_holds())
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
        ok, now_reserved = keeps_reservation(
            self.now,
            self.free_count(),
            self.guard.nodes,
            self.guard_holds(),
            gone,
            taken_free,
            ready + estimate(job),
            self.head_slack_s,
            self.anchors.get(self.guard.id),
        )
        self.anchors.setdefault(self.guard.id, now_reserved)
        if not ok and victims:  # a refused preemption: the user is told what it would cost
            holds = self.guard_holds()
            end = ready + estimate(job)
            after = reserved_after(self.now, self.free_count(), self.guard.nodes, holds, gone, taken_free, end)
            delay = after - self.anchors[self.guard.id]
            self.waits[job.id] = WaitReason(WaitKind.GUARD, request=job.nodes, job=self.guard.id, delay_s=delay)
        if ok and victims:
            self.returning += returning(self.now, gone, ready + estimate(job))
            if taken_free:
                self.returning.append((ready + estimate(job), taken_free))
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
        return tuple(n for n in job.allocated_nodes if self.owner.get(n) == job.id)

    def _current_view(self) -> ClusterView:
        """The view as the pass has changed it so far: started jobs running on their nodes,
        this pass's victims holding only the nodes their checkpoint still occupies, nodes on
        the images they were switched to."""
        jobs = []
        for j in self.jobs.values():
            busy = self.checkpointing.get(j.id)
            jobs.append(j if busy is None else replace(j, allocated_nodes=busy))
        nodes: list[Node] = [
            replace(n, os_image=self.node_os[n.name]) if n.name in self.node_os else n for n in self.view.nodes
        ]
        return replace(self.view, jobs=tuple(jobs), nodes=tuple(nodes), usage=self.usage)
