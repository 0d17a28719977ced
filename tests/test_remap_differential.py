"""The heterogeneous replay's scheduler held to the shared pass (`preemption.scheduling`).

Why a differential test and not a call: simulator/remap_engine.py schedules over several
sub-clusters (a job starts on the fastest with room; the queue head reserves the sub-cluster
where it can start first; a backfilled job may take any other sub-cluster freely), which the
shared pass (one pool of nodes: `easy.reservation`, `easy.backfill`, `victims.choose_victims`)
does not model. With one sub-cluster those differences vanish, and what is left must be the
shared rule. What is compared, and what is true:

- every scheduling pass of a one-sub-cluster replay (fcfs-easy, and vjob with interactive jobs
  preempting) starts exactly the jobs the shared EASY core starts from the same state: the
  queue in order while its head fits, then `easy.reservation` for the head over what holds
  slots (running jobs at their exact ends), then `easy.backfill` over the rest of the queue
  (BACKFILL_DEPTH − 1 candidates, estimates = the exact run time, the model's);
- the one case where the two can differ: running jobs that end at the same instant as the
  reservation's shadow time. The replay frees them in job-index order, `easy.reservation` in
  size order, so the shadow time is the same but the extra slots can differ (neither counts all
  jobs ending at the shadow). `test_tied_ends_...` pins that; on the traces below no pass hits it;
- vjob's queue order is `policies.vjob_order` with no job lifted as resumed (the replay keeps a
  checkpointed job at its submission place; the live pass puts it ahead of the other batch jobs);
- vjob's victims (most recently started first) are `victims.choose_victims`'s greedy phase with
  the priority −start: the shared rule then also releases victims that turned out unnecessary,
  the replay keeps them, so the shared set is a subset of the replay's, freeing enough too.
"""

from __future__ import annotations

import numpy as np

from preemption.scheduling.easy import backfill, reservation
from preemption.scheduling.policies import POLICIES, vjob_order
from preemption.scheduling.victims import Candidate, choose_victims
from simulator.lublin import generate
from simulator.remap_engine import BACKFILL_DEPTH, REMAP_POLICIES, RemapReplay, remap_policy
from simulator.remap_jobs import RemapJobs, at_load, jobs_from_workload
from simulator.subclusters import Farm, parse_farm


def _farm(slots: int, time: float = 1.0) -> Farm:
    """One sub-cluster, one kind of job that never thrashes."""
    sub = {"name": "only", "nodes": slots // 4, "cores_per_node": 4, "memory_mb_per_node": 4096, "freq_ghz": 2.0}
    kind = {"name": "EP", "memory_mb_per_core": 100, "time": {"only": time}}
    return parse_farm({"subcluster": [sub], "kind": [kind]}, "test")


class _HeldToShared(RemapReplay):
    """The replay, each pass checked against the shared functions as it runs."""

    passes = 0
    preemptions = 0
    released = 0

    def easy_pass(self, now: float) -> int | None:
        queue, free, holding = list(self.queue), self.free[0], list(self.running)
        if self.interactive_first:
            sub = self.jobs.submit[queue]
            order = vjob_order(sub, self.inter[queue], np.zeros(len(queue), dtype=bool))
            assert [queue[i] for i in order] == queue
        c_res = super().easy_pass(now)
        left = set(self.queue)
        started = [j for j in queue if j not in left]
        assert started == self._shared(now, queue, free, holding), f"pass at t={now}"
        self.passes += 1
        return c_res

    def _shared(self, now: float, queue: list[int], free: int, holding: list[int]) -> list[int]:
        """What the shared EASY core starts from the state before the pass, in queue order."""
        slots, queue = self.jobs.slots, list(queue)
        started: list[int] = []
        while queue and slots[queue[0]] <= free:
            started.append(queue.pop(0))
            free -= int(slots[started[-1]])
        if not queue:
            return started
        holds = [(self.end_time(j), int(slots[j])) for j in holding + started]
        shadow, extra = reservation(now, free, int(slots[queue[0]]), holds)
        assert self.reserve(now, queue[0]) is not None
        rest = queue[1:]
        nodes = [int(slots[j]) for j in rest]
        estimate = [self.jobs.runtime[j] * self.factor[self.jobs.kind[j], 0] for j in rest]
        late = backfill(now, free, shadow, extra, rest, nodes, estimate, depth=BACKFILL_DEPTH - 1)
        return started + late

    def victims(self, h: int, c: int, now: float) -> list[int] | None:
        mine = super().victims(h, c, now)
        cands = [
            Candidate(f"{j:09d}", -float(self.start[j]), int(self.jobs.slots[j]), int(self.jobs.slots[j]), 0.0)
            for j in self.running
            if self.cluster[j] == c and not self.inter[j] and self.paused[j] <= now
        ]
        shared = choose_victims(int(self.jobs.slots[h]) - self.free[c], cands)
        assert (mine is None) == (shared is None)
        if mine is not None and shared is not None:
            ids = {int(v.job_id) for v in shared}
            assert ids <= set(mine)
            assert self.free[c] + sum(int(self.jobs.slots[v]) for v in mine[:-1]) < self.jobs.slots[h]
            self.preemptions += 1
            self.released += len(mine) - len(ids)
        return mine


def _replay(policy: str, seed: int, jobs: int = 1500, slots: int = 64, time: float = 1.0) -> _HeldToShared:
    farm = _farm(slots, time)
    stream = at_load(jobs_from_workload(generate(slots, jobs, seed=seed), farm, seed), slots, 1.0)
    inter = np.random.default_rng(seed).random(len(stream.submit)) < 0.2 if policy == "vjob" else None
    replay = _HeldToShared(farm, stream, "none", policy=policy, interactive=inter, seed=seed)
    replay.run()
    return replay


def test_fcfs_easy_every_pass_is_the_shared_easy_core() -> None:
    for seed, time in ((1, 1.0), (2, 1.7)):
        replay = _replay("fcfs-easy", seed, time=time)
        assert replay.passes >= 3000


def test_vjob_every_pass_is_the_shared_easy_core_and_victims_the_shared_greedy_phase() -> None:
    replay = _replay("vjob", 3)
    assert replay.passes >= 3000
    assert replay.preemptions > 50  # the claim is exercised, not vacuous


def test_tied_ends_give_the_same_shadow_but_can_give_other_extra_slots() -> None:
    """8 slots: job 0 (4 slots) and job 1 (1 slot) both end at 100, 3 free; the head needs 4."""
    farm = _farm(8)
    jobs = RemapJobs(np.array([0.0, 0.0, 1.0, 1.0]), np.array([4, 1, 4, 2]), np.zeros(4, int), np.full(4, 100.0))
    replay = RemapReplay(farm, jobs, "none")
    replay.place(0, 0, 0.0)
    replay.place(1, 0, 0.0)
    assert replay.reserve(1.0, 2) == (100.0, 0, 3)  # (shadow, sub-cluster, extra): job 0 first, 3 + 4 − 4
    assert reservation(1.0, 3, 4, [(100.0, 4), (100.0, 1)]) == (100.0, 0)  # job 1 first (size order)


def test_the_replay_runs_two_policies_of_the_shared_table() -> None:
    assert REMAP_POLICIES <= POLICIES.keys()
    assert remap_policy("vjob") is POLICIES["vjob"]
    for name in POLICIES.keys() - REMAP_POLICIES:
        try:
            remap_policy(name)
        except ValueError as exc:
            assert str(exc) == f"policy {name!r}: the heterogeneous replay runs fcfs-easy, vjob"
        else:
            raise AssertionError(name)
