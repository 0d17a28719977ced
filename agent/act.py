"""Act: carry out one tick's decision through the RMS adapter and the pilots, and record it.

Why the abilities decide what is called: an RMS that cannot do something (OAR has no priority
knob and cannot requeue a running job) is never asked to — the tick goes on with what it can
do, instead of failing on the first job that needs the missing ability.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from agent import pause_checkpoint
from agent.observe import Observation
from agent.pilot_performer import checkpoint_timeout_for, wait_for
from agent.ports import Ports
from preemption.drain_fit import drain_wait_text
from preemption.executor import Abandoned
from preemption.planner import PlanAction, instance_from_view, make_plan
from preemption.scheduling.tick import Preemption, Release
from ubis_priority import usage as ubis_usage
from ubis_priority.job_columns import preempted_running, running_jobs
from vjob.errors import CommandError, StoreError, VjobError
from vjob.model import VM, ClusterView, VJobState, VMState
from vjob.pilot_files import PilotState, vms_of
from vjob.rms import PriorityKnob
from vjob.store import jobs as store_jobs
from vjob.store import vms as store_vms

PLAN_TIME_LIMIT_S = 2.0
"""The planner's time limit in the agent: an interactive job is waiting meanwhile."""
REQUEUE_RESTART_MARGIN_S = 3.0
"""Seconds after a requeue before the agent forces a restart (see requeued_long_enough_ago)."""


class PilotPerformer:
    """The executor's ActionPerformer for RMS-driven vjobs: a suspend is a checkpoint request
    to the VM's pilot, answered by a save, then the job's requeue-hold. Nothing else is done
    by the agent itself: the RMS starts jobs and their pilots boot or restore their VMs.

    A vjob of several VMs (one per node) has one pilot, which saves them all as one cut: the
    executor hands it the suspends of all its VMs together (a JobPerformer), and they are one
    request, one save, one requeue-hold."""

    def __init__(
        self, ports: Ports, obs: Observation, reason: str, notice: pause_checkpoint.DrainNotice | None = None
    ) -> None:
        """`notice`: the interactive job's wait reason while pause-first victims drain."""
        self.ports = ports
        self.obs = obs
        self.reason = reason
        self.notice = notice
        self.job_of = {vm: job_id for job_id, st in obs.pilots.items() for vm, _node in vms_of(st)}
        self.done: list[str] = []

    def suspend(self, vm: str, node: str) -> None:
        self._checkpoint(self.job_of[vm], vm, node)

    def suspend_job(self, actions: Sequence[PlanAction]) -> None:
        """The suspends of every VM of one multi-VM vjob: one checkpoint request to its pilot."""
        jobs = {self.job_of[a.vm] for a in actions}
        if len(jobs) != 1:
            raise VjobError(f"one cut asked for the VMs of several vjobs: {', '.join(sorted(jobs))}")
        first = actions[0]
        self._checkpoint(jobs.pop(), first.vm, first.node or "-")

    def resume_job(self, actions: Sequence[PlanAction]) -> None:
        self._refuse("resume", ", ".join(a.vm for a in actions))

    def _checkpoint(self, job_id: str, vm: str, node: str) -> None:
        """Ask the pilot of `job_id` to save (all its VMs), wait for the save, requeue-hold the job."""
        if job_id in self.done:
            return  # its pilot already saved every VM of it, in one cut
        if pause_checkpoint.usable(self.ports, self.obs, job_id):  # CPUs handed over before the save
            pause_checkpoint.checkpoint(self.ports, self.obs, job_id, vm, self.reason, self.notice)
            finish_checkpoint(self.ports, job_id)
            self.done.append(job_id)
            return
        pdir = self.ports.pilot_dir(job_id)
        request_id = f"{vm}@{time.time():.6f}"
        pdir.request_checkpoint(request_id, reason=self.reason, nodes=self.obs.view.job(job_id).allocated_nodes)
        timeout = checkpoint_timeout_for(self.ports.cfg, self.obs, job_id)  # scales with the VM's memory

        def check_ours() -> None:
            if not self.ports.lease.valid():  # the lease's new holder finishes or undoes it (agent.recover)
                raise Abandoned(f"job {job_id}: the agent lease was lost waiting for VM {vm}'s checkpoint")

        def timed_out() -> VjobError:
            pdir.withdraw_request()  # too slow: a pilot that saves anyway restores at once
            return VjobError(
                f"job {job_id}: no checkpoint of VM {vm} on {node} within {timeout:.0f} s; request withdrawn"
            )

        wait_for(
            lambda: pdir.saved_for(request_id) or None,
            timeout_s=timeout,
            poll_s=0.1,
            check_ours=check_ours,
            timed_out=timed_out,
        )
        finish_checkpoint(self.ports, job_id)
        self.done.append(job_id)

    def _refuse(self, what: str, vm: str) -> None:
        raise VjobError(f"{what} {vm}: the {self.ports.rms} agent only checkpoints; the RMS starts and moves jobs")

    def run(self, vm: str, node: str) -> None:
        self._refuse("run", vm)

    def stop(self, vm: str, node: str) -> None:
        self._refuse("stop", vm)

    def resume(self, vm: str, node: str, source: str | None) -> None:
        self._refuse("resume", vm)

    def migrate(self, vm: str, source: str, destination: str) -> None:
        self._refuse("migrate", vm)


def priorities_to_send(sent: Mapping[str, int], wanted: Mapping[str, int], knob: PriorityKnob) -> dict[str, int]:
    """The fewest priorities to write so that the RMS's knob ranks the jobs as `wanted` does.

    What matters to the RMS is the order, not the values: `wanted` spreads the pass's order
    evenly over the knob, so every job behind one that starts or arrives at the front moves,
    and sending them all is one command per queued job per tick (Slurm: an `scontrol` each).
    Skipping the moves below `min_step`, as the agent did, let neighbours' stale values cross
    with a long queue (tests/test_policy_rms_order.py). Instead, the jobs whose values the RMS
    already holds in the right order (the longest such run, a longest decreasing subsequence)
    keep them, and the others get their wanted values where those fit between their kept
    neighbours', else values spread in that gap (a gap too narrow for its jobs gives up
    kept values next to it until it is wide enough). With nothing sent yet, that is `wanted`.
    Jobs with equal wanted values (more jobs than the knob has values) keep the former rule."""
    if len(set(wanted.values())) < len(wanted):  # equal values (found without sorting 100,000 jobs)
        step, had = knob.min_step, sent.get
        # the jobs whose value moved at all, found in C (most did not; 100,000 at a site's
        # size), then the rule on those (min_step >= 1: an unmoved value is never sent)
        moved = itertools.compress(wanted.items(), map(operator.ne, map(had, wanted), wanted.values()))
        return {j: v for j, v in moved if (was := had(j)) is None or abs(was - v) >= step}
    ranked = sorted(wanted, key=wanted.__getitem__, reverse=True)  # stable: equal keys keep their order
    bounds = [
        (-1, knob.high + 1),
        *((k, sent[ranked[k]]) for k in _in_order(ranked, sent)),
        (len(ranked), knob.low - 1),
    ]
    at = 0
    while at < len(bounds) - 1:  # widen every gap too narrow for its jobs by giving up a kept value
        (k0, hi), (k1, lo) = bounds[at], bounds[at + 1]
        if hi - lo - 1 >= k1 - k0 - 1:
            at += 1
        elif at + 2 < len(bounds):
            del bounds[at + 1]
        else:
            del bounds[at]
            at = max(0, at - 1)
    out: dict[str, int] = {}
    for (k0, hi), (k1, lo) in itertools.pairwise(bounds):
        run = ranked[k0 + 1 : k1]
        if run and lo < wanted[run[-1]] and wanted[run[0]] < hi:  # the wanted values fit: those
            out.update({j: wanted[j] for j in run})
            continue
        step = (hi - lo) / (k1 - k0)  # >= 1: strictly decreasing values strictly between hi and lo
        for m, job in enumerate(run, 1):
            out[job] = hi - round(m * step)
    return {j: v for j, v in out.items() if sent.get(j) != v}


def _in_order(ranked: Sequence[str], sent: Mapping[str, int]) -> list[int]:
    """Positions in `ranked` of a longest run of jobs whose `sent` values strictly decrease
    along it (patience sorting on the negated values, O(n log n))."""
    tails: list[int] = []  # tails[m]: the position ending the best run of length m + 1
    tail_values: list[int] = []
    parent: dict[int, int] = {}
    for k, job in enumerate(ranked):
        if job not in sent:
            continue
        v = -sent[job]
        m = bisect.bisect_left(tail_values, v)
        if m:
            parent[k] = tails[m - 1]
        if m == len(tails):
            tails.append(k)
            tail_values.append(v)
        else:
            tails[m] = k
            tail_values[m] = v
    run: list[int] = []
    k = tails[-1] if tails else -1
    while k >= 0:
        run.append(k)
        k = parent.get(k, -1)
    return run[::-1]


@runtime_checkable
class ManyPriorities(Protocol):
    """An adapter that sends many priorities in one RMS call (plugins.slurm's set_priorities):
    job id → error for each it could not set."""

    def set_priorities(self, values: Mapping[str, int]) -> dict[str, str]: ...


def apply_priorities(ports: Ports, wanted: Mapping[str, int], sent: dict[str, int]) -> None:
    """Send the changed integer priorities (none when the RMS has no knob); `sent`, what the
    RMS holds from this agent, is kept up to date (the jobs no longer wanted forgotten)."""
    knob = ports.adapter.abilities.priority
    if knob is None:
        return
    for gone in [k for k in sent if k not in wanted]:
        del sent[gone]
    send = priorities_to_send(sent, wanted, knob)
    if isinstance(ports.adapter, ManyPriorities):  # Slurm: one scontrol for the whole tick
        failed = ports.adapter.set_priorities(send) if send else {}
        sent.update({j: v for j, v in send.items() if j not in failed})
        for job_id, error in failed.items():
            ports.metrics.errors.labels(kind="rms").inc()
            ports.log.warning("could not set the priority", jobs=[job_id], error=error)
        return
    for job_id, value in send.items():
        try:
            ports.adapter.set_priority(job_id, value)
            sent[job_id] = value
        except CommandError as exc:
            ports.metrics.errors.labels(kind="rms").inc()
            ports.log.warning("could not set the priority", jobs=[job_id], error=str(exc))


def preempt(ports: Ports, pre: Preemption, obs: Observation, *, reason: str = "") -> list[str]:
    """One context switch: the planner plans the victims' suspends, the executor carries the
    plan out (journalling each action first), each suspend done by the VM's pilot. `reason`
    defaults to the interactive job's need; the deadline duty gives its own (checkpoint_vjob)."""
    t0 = time.monotonic()
    view, target = _vm_view(obs, set(pre.victims))
    plan = make_plan(
        instance_from_view(view, target),
        optimizer=ports.cfg.planner.optimizer,
        time_limit_s=min(ports.cfg.planner.time_limit_s, PLAN_TIME_LIMIT_S),
    )
    reason = reason or f"interactive job {pre.job_id} needs nodes {','.join(pre.nodes)}"
    ports.log.info("switch planned", jobs=[pre.job_id, *pre.victims], nodes=list(pre.nodes), cost=plan.cost)
    waits = drain_wait_text(obs.view, pre.job_id, pre.nodes, pre.victims) if pre.job_id not in pre.victims else None
    notice = pause_checkpoint.DrainNotice(ports, pre.job_id, waits)
    performer = PilotPerformer(ports, obs, reason, notice)
    try:
        report = ports.executor(performer).execute(plan, reason=reason)
    finally:
        notice.take_back()  # the victims are requeued (their memory free) or the switch failed
    ports.metrics.switch_seconds.observe(time.monotonic() - t0)
    ports.log.info("switch finished", switch=report.switch_id, summary=report.summary(), jobs=performer.done)
    return performer.done


def checkpoint_vjob(ports: Ports, job_id: str, obs: Observation, reason: str) -> bool:
    """Checkpoint one running vjob through the preemption path (journal, pilot save,
    requeue-hold; released later by the tick's releases) — for a reason other than an
    interactive job, e.g. a deadline it is predicted to miss (agent.deadline). False when the
    job has no pilot (a plain job: nothing to save); VjobError when its VM is not running on a
    node the RMS gave it, or the save failed (the caller retries next tick)."""
    if job_id not in obs.pilots:
        return False
    if job_id not in checkpointable(ports, obs):
        raise VjobError(f"job {job_id}: its VM is not running on its allocated nodes; no checkpoint now")
    if not ports.lease.held():
        raise VjobError(f"job {job_id}: the agent lease is lost; no checkpoint")
    job = obs.view.job(job_id)
    pre = Preemption(job_id=job_id, victims=(job_id,), nodes=tuple(job.allocated_nodes), checkpoint_bytes=0.0)
    if job_id not in preempt(ports, pre, obs, reason=reason):
        raise VjobError(f"job {job_id}: checkpoint failed (see the switch in the journal)")
    return True


def checkpointable(ports: Ports, obs: Observation) -> set[str]:
    """Running vjobs whose VMs (one, or one per node) all run on nodes the RMS allocated
    them — and none at all when the RMS cannot requeue a running job (the victim would have
    nowhere to go)."""
    if not ports.adapter.abilities.requeue_hold:
        return set()
    pilots = obs.pilots
    running = PilotState.RUNNING
    out: set[str] = set()
    for job in running_jobs(obs.view.jobs):  # 20,000 at a site's size: one look-up each
        st = pilots.get(job.id)
        if st is None or st.state is not running:
            continue
        alloc = job.allocated_nodes
        if not alloc:
            out.add(job.id)
        elif len(st.member_nodes) <= 1 or not st.vm.endswith("-0"):
            if st.node in alloc:  # one VM, on the pilot's node (vms_of's rule, without its list)
                out.add(job.id)
        elif all(n in alloc for _, n in vms_of(st)):
            out.add(job.id)
    return out


def _vm_view(obs: Observation, victims: set[str]) -> tuple[ClusterView, dict[str, VJobState]]:
    """The view with the vjobs' VMs (from their pilots) and the target of the switch: the
    victims sleeping, every other vjob as it is."""
    known = {j.id for j in obs.view.jobs}
    nodes = {n.name for n in obs.view.nodes}
    vms, target = [], {}
    for job_id, st in obs.pilots.items():
        saved = st.state is PilotState.SAVED and st.memory_saved
        placed = vms_of(st)  # one VM per node of a multi-node vjob
        usable = saved or st.state is PilotState.RUNNING
        if job_id not in known or not usable or any(n not in nodes for _, n in placed):
            continue
        state = VMState.SAVED if saved else VMState.RUNNING
        vms += [VM(vm, job_id, st.image or "-", 1, max(1, st.memory_mb), node, state) for vm, node in placed]
        target[job_id] = VJobState.SLEEPING if saved or job_id in victims else VJobState.RUNNING
    return replace(obs.view, vms=tuple(vms)), target


def finish_checkpoint(ports: Ports, job_id: str) -> None:
    """The job's VM is saved: requeue-hold it and count the preemption (Pn), once."""
    try:
        ports.adapter.requeue_hold(job_id)
    except CommandError as exc:
        # The pilot resumes its VM by itself when no requeue follows (pilot.pilot); the RMS's
        # own words (e.g. PBS's qrerun on a job submitted `-r n`) say why to the operator.
        ports.metrics.errors.labels(kind="rms").inc()
        ports.log.error("requeue-hold failed; the pilot will resume its VM", jobs=[job_id], error=str(exc))
        raise
    store_jobs.record_preemption(ports.store(), ports.rms, job_id)
    try:
        st = ports.pilot_dir(job_id).read_state()
    except VjobError:
        st = None  # the figures below are the pilot's word: nice to have, never needed
    ports.metrics.preemptions.inc()
    if st is not None:
        ports.metrics.checkpoint_seconds.observe(st.save_seconds)
        ports.metrics.checkpoint_bytes.observe(st.save_bytes)
    ports.log.info("checkpointed and requeue-held", jobs=[job_id])


def requeued_long_enough_ago(ports: Ports, job_id: str) -> bool:
    """Whether forcing the start of a requeued job is safe. Slurm revokes the old run's
    credential with a one-second timestamp: a restart within the same second (on the same
    node, exactly what a local resume does) is killed as "non-startable: Job credential
    revoked" and the job ends. Slurm's own cred_expire delay avoids that; the agent only
    shortens it once a safe margin has passed since the checkpoint."""
    record = store_jobs.get(ports.store(), ports.rms, job_id)
    since = record.preempted_since if record is not None else None
    return since is None or time.time() - since >= REQUEUE_RESTART_MARGIN_S


def release(ports: Ports, rel: Release) -> bool:
    abilities = ports.adapter.abilities
    if not abilities.hold_release:
        ports.log.warning("this RMS adapter cannot release held jobs", jobs=[rel.job_id])
        return False
    try:
        if abilities.pin_nodes and rel.preferred_nodes:
            ports.adapter.require_nodes(rel.job_id, rel.preferred_nodes)  # a local resume: no state to copy
        ports.adapter.release(rel.job_id)
        if abilities.start_now and requeued_long_enough_ago(ports, rel.job_id):
            ports.adapter.start_now(rel.job_id)  # Slurm: skip the cred_expire delay after a requeue
    except CommandError as exc:
        ports.metrics.errors.labels(kind="rms").inc()
        ports.log.warning("release failed, retrying next tick", jobs=[rel.job_id], error=str(exc))
        return False
    ports.metrics.releases.inc()
    ports.log.info("released", jobs=[rel.job_id], nodes=list(rel.preferred_nodes))
    return True


@dataclass
class Forgotten:
    """The vjobs with a pilot directory that the RMS no longer lists, carried between ticks
    for their clean-up (clean_up)."""

    since: dict[str, float] = field(default_factory=dict)
    """job id → when the agent first saw it gone, by its own clock."""
    last_tick: set[str] = field(default_factory=set)
    """The jobs gone at the previous tick."""


def clean_up(ports: Ports, obs: Observation, gone: Forgotten) -> list[str]:
    """Delete the VMs and pilot directories of vjobs the RMS has forgotten.

    Only after two ticks in a row without the job (one odd answer from the RMS must not destroy
    anybody's saved state) and `cleanup_after_s` after the agent itself first saw it gone — by
    the agent's clock, never the time a user wrote in a state file; never while the pilot may
    still act (starting, running, saving, restoring). What is deleted is what the store records
    as that job's VMs, where the store says they are: a state file cannot point the agent at
    another job's VM.
    """
    known = {j.id for j in obs.view.jobs}
    now = time.time()
    gone_now = {
        job_id
        for job_id, st in obs.pilots.items()
        if job_id not in known and st.state in (PilotState.SAVED, PilotState.FINISHED, PilotState.FAILED)
    }
    gone.since = {j: gone.since.get(j, now) for j in gone_now}
    ripe = sorted(j for j, t in gone.since.items() if now - t >= ports.cfg.agent.cleanup_after_s)
    ripe = [j for j in ripe if j in gone.last_tick]
    gone.last_tick = gone_now
    if not ripe:
        return []
    cleaned = []
    driver = ports.driver()  # libvirt: only when a VM must go
    try:
        for job_id in ripe:
            try:
                owned = store_vms.of_job(ports.store(), ports.rms, job_id)
            except StoreError as exc:
                ports.store.failed(exc)
                return cleaned
            try:
                for vm in owned:
                    driver.delete(vm.name, vm.node)
            except VjobError as exc:
                ports.log.warning("could not delete a forgotten vjob's VM", jobs=[job_id], error=str(exc))
                continue
            store_vms.forget(ports.store(), ports.rms, job_id)
            shutil.rmtree(ports.pilot_dir(job_id).path, ignore_errors=True)
            gone.since.pop(job_id, None)
            cleaned.append(job_id)
            ports.log.info(
                "deleted the VMs of a job the RMS no longer knows", jobs=[job_id], vms=[v.name for v in owned]
            )
    finally:
        driver.close()
    return cleaned


def charge_usage(ports: Ports, view: ClusterView) -> None:
    """Add this tick's node-seconds to each user's decayed usage (UBIS Target−Usage)."""
    try:
        ubis_usage.charge(ports.store(), view, ports.cfg.priority)
    except StoreError as exc:
        ports.store.failed(exc)


def record_resumes(ports: Ports, obs: Observation) -> list[str]:
    """A checkpointed job running again with its VM restored: stop its Pt clock. Returns the
    jobs recorded (up to a store failure, when the rest waits for the next tick)."""
    resumed: list[str] = []
    for job in preempted_running(obs.view.jobs):  # not every job of the view: 120,000 at a site's size
        pilot = obs.pilots.get(job.id)
        if job.preempted_since is None or pilot is None or pilot.state is not PilotState.RUNNING:
            continue
        if pilot.since < job.preempted_since:
            continue  # the state file predates the checkpoint: not resumed yet
        at = min(max(pilot.since, job.preempted_since), time.time())  # the pilot's clock, bounded
        try:
            store_jobs.record_resume(ports.store(), ports.rms, job.id, at=at)
            resumed.append(job.id)
            ports.log.info("resumed", jobs=[job.id], node=pilot.node, local=pilot.node == pilot.saved_node)
        except StoreError as exc:
            ports.store.failed(exc)
            return resumed
    return resumed


__all__ = [
    "PLAN_TIME_LIMIT_S",
    "REQUEUE_RESTART_MARGIN_S",
    "Forgotten",
    "PilotPerformer",
    "apply_priorities",
    "charge_usage",
    "checkpoint_vjob",
    "checkpointable",
    "clean_up",
    "finish_checkpoint",
    "preempt",
    "record_resumes",
    "release",
    "requeued_long_enough_ago",
]
