"""The discrete-event engine: replays a workload on a cluster model under one policy.

Why an event loop over plain lists: 100,000 jobs on 1,056 nodes must replay in seconds, so
per-job state lives in Python lists (fast scalar access) and NumPy is used where the work is
vectorisable (UBIS priorities of the whole queue). The decisions themselves come from
`preemption.scheduling` (queue orders, EASY reservation and backfilling, victim choice) and
`ubis_priority` (the priority kernel, the interactive cap, targets, usage decay). One pass
(engine_pass.py, engine_preempt.py) is the scheduling pass the live agent runs,
`preemption.scheduling.tick.decide`, written over arrays with compiled hot paths:
tests/test_decision_differential.py holds it equal to `tick.decide` on random cluster states.
What still differs between live and simulated: docs/simulator.md.

The replay, layer by layer: engine_state.py (the state as records, and their builders),
engine_actions.py (queue, start, finish, release, and their bookkeeping), engine_preempt.py
(checkpointing victims for an interactive job), engine_pass.py (the scheduling pass), and
this module (the event loop). Its inputs and output, ClusterModel and Result: replay.py.

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

import heapq
import math
from collections.abc import Callable

import numpy as np

from simulator.engine_actions import END, RELEASE
from simulator.engine_pass import SchedulingPass
from simulator.replay import ClusterModel, Result
from simulator.workload import Workload
from vjob.config import PriorityConfig, SchedulingConfig


class Simulation(SchedulingPass):
    """One replay; construct, then `run()`."""

    def run(self) -> Result:
        """Replay every event and submission in time order, a pass after each instant that
        may let a job start; the Result once every job has finished."""
        jobs, cluster, queue, events = self.jobs, self.cluster, self.queue, self.events
        submit, need, inter, token = jobs.submit, jobs.need, jobs.inter, jobs.token
        preempts = self.rules.policy.preempts
        n = len(submit)
        nxt = 0
        done = 0
        res = self.result
        report_every = max(1, n // 200)
        while nxt < n or events:
            t_submit = submit[nxt] if nxt < n else math.inf
            t_event = events[0][0] if events else math.inf
            now = min(t_submit, t_event)
            dirty = False
            while events and events[0][0] <= now:
                _, kind, _, j, tok = heapq.heappop(events)
                res.events += 1
                if kind == END:
                    if tok != token[j]:
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
            while nxt < n and submit[nxt] <= now:
                j = nxt
                nxt += 1
                res.events += 1
                self._enqueue(j, now)
                if need[j] <= cluster.free or (inter[j] and preempts):
                    dirty = True
            if dirty and queue.sizes and self._may_start():
                res.passes += 1
                self._schedule(now)
        if self.progress:
            self.progress(n, n)
        return self._result()

    def _result(self) -> Result:
        """The Result with the per-job arrays filled in (after `_check_all_finished`)."""
        res, out = self.result, self.out
        res.first_start = np.array(out.first_start)
        res.end = np.array(out.end)
        self._check_all_finished(res.end)
        res.preempt_count = self.jobs.pc_a.astype(np.int64)
        res.overhead_s = np.array(out.overhead)
        res.ran_privileged = np.array(out.privileged, dtype=bool)
        res.fit_wait = np.array(out.fit_wait)
        return res

    def _check_all_finished(self, end: np.ndarray) -> None:
        """Every job that could ever run has finished: a replay whose passes stop waking up
        (a prototype of the interactive reserve left 18,000 of 28,571 jobs queued) would
        otherwise report the means of the jobs that happened to finish. The only jobs that
        may not run are interactive jobs larger than a hard cap."""
        left = np.isnan(end)
        if self.rules.hard_cap:
            left &= ~(self.jobs.inter_a & (self.jobs.need_a > self.rules.cap_nodes))
        if left.any():
            first = int(np.flatnonzero(left)[0])
            raise RuntimeError(
                f"replay ended with {int(left.sum())} of {left.shape[0]} jobs unfinished "
                f"(first: job {int(self.w.job_id[first])}, {self.jobs.need[first]} nodes): a pass stopped waking up"
            )


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
