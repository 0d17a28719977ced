"""The vjob agent (`vjob agent --rms slurm`): observe → decide → act → record, in a loop.

Why this shape: the RMS stays in charge of running jobs; the agent only steers it. Each tick it
observes the RMS (jobs, nodes), the pilots (their state files) and the store (Pn, Pt, usage),
asks the pure policies what to do (`vjob.agent_decide.decide`), and acts through the RMS
adapter and the pilots — after journalling every action (`vjob.agent_journal`), so that a
restarted agent finishes or undoes a half-done switch (`Agent.recover`).

Failure stance — the agent must never stop the RMS from working:
* the agent is outside the RMS: if it dies, Slurm keeps scheduling with its own priorities;
* with the state store down it takes no decisions that would need journalling (no
  checkpoints, no releases), logs, counts the error and tries again next tick;
* a failing RMS command is logged with the job it concerns and retried next tick;
* a pilot that saved its VM but was never requeued restores it by itself (vjob.pilot).

A tick starts every `interval_s`, or at once when one of the wake files changes (`wake_files`):
`<data_dir>/agent.wake`, for anything that knows an interactive job just arrived, and on Slurm
`vjob-agent.wake` next to slurm.conf, which job_submit.lua rewrites when it accepts one.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from vjob import agent_journal as journal
from vjob import log
from vjob.agent_decide import Decision, Preemption, Release, decide
from vjob.config import Config
from vjob.errors import CommandError, StoreError, VjobError
from vjob.metrics import AgentMetrics
from vjob.model import VM, ClusterView, Job, JobState, VJobState, VMState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs
from vjob.rms import RMSAdapter
from vjob.store import jobs as store_jobs
from vjob.store.db import Store, open_store
from vjob.store.schema import JobRecord


def pilot_root(cfg: Config) -> Path:
    """Where the pilots' directories (state files, checkpoint requests) live."""
    return Path(cfg.agent.pilot_dir) if cfg.agent.pilot_dir else cfg.data_path / "pilots"


SLURM_WAKE_NAME = "vjob-agent.wake"
"""The file job_submit.lua rewrites beside itself (so beside slurm.conf) on an interactive job."""
SLURM_DEFAULT_CONF = "/etc/slurm/slurm.conf"
"""Where Debian's Slurm looks for slurm.conf when neither [slurm] conf nor $SLURM_CONF says."""


def wake_file(cfg: Config) -> Path:
    """The RMS-neutral wake file: touching it makes the agent tick at once."""
    return cfg.data_path / "agent.wake"


def slurm_wake_file(conf: str | os.PathLike[str] = "") -> Path:
    """The wake file job_submit.lua writes: it only knows its own directory, which is the one
    slurmctld loads it from, slurm.conf's. `conf` empty: the slurm.conf the commands would use."""
    return Path(conf or os.environ.get("SLURM_CONF") or SLURM_DEFAULT_CONF).parent / SLURM_WAKE_NAME


def wake_files(cfg: Config, rms: str) -> tuple[Path, ...]:
    """Every file whose change wakes the agent of `rms` before its next tick."""
    if rms == "slurm":
        return wake_file(cfg), slurm_wake_file(cfg.slurm.conf)
    return (wake_file(cfg),)


def make_adapter(rms: str, cfg: Config) -> RMSAdapter:
    """The adapter of `rms` (plugins.<rms>.make_adapter), imported only when asked for."""
    import importlib

    from plugins.cli import RMS_PACKAGES

    if rms not in RMS_PACKAGES:
        raise VjobError(f"--rms {rms!r}: must be one of {', '.join(sorted(RMS_PACKAGES))}")
    module = importlib.import_module(RMS_PACKAGES[rms])
    return module.make_adapter(cfg)


REQUEUE_RESTART_MARGIN_S = 3.0
"""Seconds after a requeue before the agent forces a restart (see _requeued_long_enough_ago)."""


@dataclass
class Observation:
    """What one tick saw: the view the policies get, plus what only the agent needs."""

    view: ClusterView
    pilots: dict[str, PilotStatus]
    sleeping: dict[str, tuple[str, ...]]
    """Jobs vjob checkpointed and still holds → the node(s) their VM was saved on."""
    store_ok: bool


@dataclass
class TickReport:
    """What a tick did (returned for tests, the demo and `--once`)."""

    at: float
    store_ok: bool = True
    decision: Decision | None = None
    checkpointed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)


PLAN_TIME_LIMIT_S = 2.0
"""The planner's time limit in the agent: an interactive job is waiting meanwhile."""


class PilotPerformer:
    """The executor's ActionPerformer for RMS-driven vjobs: a suspend is a checkpoint request
    to the VM's pilot, answered by a save, then the job's requeue-hold. Nothing else is done
    by the agent itself: the RMS starts jobs and their pilots boot or restore their VMs."""

    def __init__(self, agent: Agent, obs: Observation, reason: str) -> None:
        self.agent = agent
        self.obs = obs
        self.reason = reason
        self.job_of = {st.vm: job_id for job_id, st in obs.pilots.items()}
        self.done: list[str] = []

    def suspend(self, vm: str, node: str) -> None:
        job_id = self.job_of[vm]
        pdir = self.agent._ckdir(job_id)
        request_id = f"{vm}@{time.time():.6f}"
        pdir.request_checkpoint(request_id, reason=self.reason, nodes=self.obs.view.job(job_id).allocated_nodes)
        deadline = time.monotonic() + self.agent.checkpoint_timeout_s
        while not pdir.saved_for(request_id):
            if time.monotonic() > deadline:
                # Too slow: withdraw the request; a pilot that saves anyway restores at once.
                pdir.withdraw_request()
                raise VjobError(f"job {job_id}: no checkpoint of VM {vm} on {node} within "
                                f"{self.agent.checkpoint_timeout_s:.0f} s; request withdrawn")  # fmt: skip
            time.sleep(0.1)
        self.agent.finish_checkpoint(job_id)
        self.done.append(job_id)

    def _refuse(self, what: str, vm: str) -> None:
        raise VjobError(f"{what} {vm}: the {self.agent.rms} agent only checkpoints; the RMS starts and moves jobs")

    def run(self, vm: str, node: str) -> None:
        self._refuse("run", vm)

    def stop(self, vm: str, node: str) -> None:
        self._refuse("stop", vm)

    def resume(self, vm: str, node: str, source: str | None) -> None:
        self._refuse("resume", vm)

    def migrate(self, vm: str, source: str, destination: str) -> None:
        self._refuse("migrate", vm)


def live_view(rms: str, cfg: Config) -> ClusterView:
    """The ClusterView the agent would decide on now (for `vjob prio --rms`); writes nothing."""
    return Agent(cfg, make_adapter(rms, cfg), rms=rms).observe(track=False).view


class Agent:
    """One agent for one RMS. `store` is opened lazily and re-opened after failures."""

    def __init__(
        self,
        cfg: Config,
        adapter: RMSAdapter,
        *,
        rms: str,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.adapter = adapter
        self.rms = rms
        self.metrics = metrics or AgentMetrics()
        self._store: Store | None = None
        self.root = pilot_root(cfg)
        self.checkpoint_timeout_s = cfg.agent.checkpoint_timeout_s
        self.log = log.get("agent").bind(rms=rms)
        self._set_priorities: dict[str, int] = {}
        self._seen_running_interactive: set[str] = set()
        self._recovered = False
        self._gone_last_tick: set[str] = set()

    # -- store ----------------------------------------------------------------------------
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.cfg)
        return self._store

    def _store_failed(self, exc: Exception) -> None:
        self.metrics.store_up.set(0)
        self.metrics.errors.labels(kind="store").inc()
        self.log.error("state store unavailable: no checkpoint or release this tick, retrying", error=str(exc))
        if self._store is not None:
            self._store.close()
        self._store = None

    # -- observe --------------------------------------------------------------------------
    def observe(self, *, track: bool = True) -> Observation:
        """One consistent look at the RMS, the pilots and the store; `track` records new jobs."""
        now = time.time()
        rms_jobs = self.adapter.jobs()
        nodes = self.adapter.nodes()
        pilots: dict[str, PilotStatus] = {}
        for ck in all_dirs(self.root, self.rms):
            try:
                st = ck.read_state()
            except VjobError as exc:
                self.log.warning("unreadable pilot state", job=ck.job_id, error=str(exc))
                continue
            if st is not None:
                pilots[ck.job_id] = st
        jobs: list[Job] = []
        sleeping: dict[str, tuple[str, ...]] = {}
        store_ok = True
        records: dict[str, JobRecord] = {}
        try:
            store = self.store()
            records = _records(store, self.rms, [j.id for j in rms_jobs])
            for job in rms_jobs:
                if track and job.id not in records:
                    store_jobs.track(store, job)
            self.metrics.store_up.set(1)
        except StoreError as exc:
            self._store_failed(exc)
            store_ok = False
        for job in rms_jobs:
            rec = records.get(job.id)
            pilot = pilots.get(job.id)
            changes: dict[str, Any] = {}
            if rec is not None:
                changes.update(
                    preempt_count=rec.preempt_count,
                    preempted_seconds=rec.preempted_seconds,
                    preempted_since=rec.preempted_since,
                )
                preempted = rec.preempted_since is not None
                if preempted and job.state is JobState.RUNNING and pilot and pilot.state is PilotState.SAVED:
                    # Requeue-held, its VM saved, but the RMS still winds it up (COMPLETING):
                    # its nodes are as good as free, it must not be chosen as a victim again.
                    changes.update(state=JobState.HELD, allocated_nodes=())
                if preempted and changes.get("state", job.state) in (JobState.PENDING, JobState.HELD):
                    sleeping[job.id] = tuple(pilot.saved_nodes) if pilot else ()
            if pilot is not None:
                changes["vjob_state"] = _vjob_state(job, pilot, job.id in sleeping)
            jobs.append(replace(job, **changes) if changes else job)
        usage, targets = self._shares(store_ok)
        view = ClusterView(now=now, jobs=tuple(jobs), nodes=tuple(nodes), usage=usage, targets=targets)
        counts: dict[tuple[str, str], int] = {}
        for job in jobs:
            key = (job.job_class.value, job.state.value)
            counts[key] = counts.get(key, 0) + 1
        self.metrics.set_queue(counts)
        return Observation(view=view, pilots=pilots, sleeping=sleeping, store_ok=store_ok)

    def _shares(self, store_ok: bool) -> tuple[dict[str, float], dict[str, float]]:
        """Decayed usage and targets from the store (empty when it is down: the term is 0)."""
        if not store_ok:
            return {}, dict(self.cfg.priority.targets)
        from ubis_priority import usage as ubis_usage

        try:
            store = self.store()
            return ubis_usage.load_usage(store, time.time(), self.cfg.priority), ubis_usage.load_targets(store)
        except StoreError as exc:
            self.log.warning("usage and targets unavailable this tick", error=str(exc))
            return {}, dict(self.cfg.priority.targets)

    # -- the loop ------------------------------------------------------------------------
    def tick(self) -> TickReport:
        report = TickReport(at=time.time())
        self.metrics.ticks.inc()
        try:
            if not self._recovered:
                self.recover()
            obs = self.observe()
        except CommandError as exc:
            self.metrics.errors.labels(kind="rms").inc()
            self.log.error("cannot observe the RMS, retrying next tick", error=str(exc))
            report.errors.append(str(exc))
            return report
        except StoreError as exc:
            self._store_failed(exc)
            report.store_ok = False
            report.errors.append(str(exc))
            return report
        report.store_ok = obs.store_ok
        report.cleaned = self._clean_up(obs)
        if obs.store_ok:
            self._charge_usage(obs.view)
        self._record_resumes(obs, report)
        self._observe_interactive_starts(obs.view)
        checkpointable = {
            j.id
            for j in obs.view.running
            if j.id in obs.pilots
            and obs.pilots[j.id].state is PilotState.RUNNING
            and (not j.allocated_nodes or obs.pilots[j.id].node in j.allocated_nodes)
        }
        decision = decide(obs.view, self.cfg, rms=self.rms, checkpointable=checkpointable, sleeping=obs.sleeping)
        report.decision = decision
        self._apply_priorities(decision)
        if decision.waiting_interactive:
            self.log.info("interactive jobs wait (cap or no victims)", jobs=list(decision.waiting_interactive))
        if not obs.store_ok:
            return report
        try:
            for pre in decision.preemptions:
                report.checkpointed += self._preempt(pre, obs)
            for rel in decision.releases:
                if self._release(rel):
                    report.released.append(rel.job_id)
        except StoreError as exc:
            self._store_failed(exc)
            self._recovered = False  # the journal may hold a switch cut short: look again
            report.store_ok = False
            report.errors.append(str(exc))
        self.metrics.last_tick.set(time.time())
        return report

    def run(self, stop: threading.Event | None = None, *, once: bool = False) -> None:
        """Tick until `stop` is set; between ticks wake early when a wake file changes.

        The files' times are taken before the first tick, so a change during a tick starts
        the next one at once: no submission is missed. Polled twice a second: a stat is cheap
        and works on any filesystem, where inotify would not see a change made on another host.
        """
        stop = stop or threading.Event()
        wakes = wake_files(self.cfg, self.rms)
        last_mtimes = _mtimes(wakes)
        while True:
            try:
                self.tick()
            except VjobError as exc:
                self.metrics.errors.labels(kind="tick").inc()
                self.log.error("tick failed, retrying", error=str(exc))
                self._recovered = False  # a switch cut short is finished or undone next tick
            except Exception:  # a daemon outlives one bad tick; the traceback is logged
                self.metrics.errors.labels(kind="unexpected").inc()
                self.log.exception("unexpected error in a tick, retrying")
                self._recovered = False
            if once:
                return
            deadline = time.monotonic() + self.cfg.agent.interval_s
            while time.monotonic() < deadline and not stop.is_set():
                mtimes = _mtimes(wakes)
                if mtimes != last_mtimes:
                    changed = [str(p) for p, old, new in zip(wakes, last_mtimes, mtimes, strict=True) if old != new]
                    last_mtimes = mtimes
                    self.log.info("woken before the next tick", files=changed)
                    break
                stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            if stop.is_set():
                return

    # -- act ------------------------------------------------------------------------------
    def _apply_priorities(self, decision: Decision) -> None:
        # Queue time moves every priority a little each tick: only changes worth an RPC are sent.
        step = max(1, self.cfg.slurm.site_factor_max // 1000) if self.rms == "slurm" else 1
        self._set_priorities = {k: v for k, v in self._set_priorities.items() if k in decision.rms_priorities}
        for job_id, value in decision.rms_priorities.items():
            old = self._set_priorities.get(job_id)
            if old is not None and abs(old - value) < step:
                continue
            try:
                self.adapter.set_priority(job_id, value)
                self._set_priorities[job_id] = value
            except CommandError as exc:
                self.metrics.errors.labels(kind="rms").inc()
                self.log.warning("could not set the priority", jobs=[job_id], error=str(exc))

    def _preempt(self, pre: Preemption, obs: Observation) -> list[str]:
        """One context switch: the planner plans the victims' suspends, the executor carries
        the plan out (journalling each action first), each suspend done by the VM's pilot."""
        from preemption.executor import Executor
        from preemption.planner import instance_from_view, make_plan

        t0 = time.monotonic()
        view, target = self._vm_view(obs, set(pre.victims))
        plan = make_plan(
            instance_from_view(view, target),
            optimizer=self.cfg.planner.optimizer,
            time_limit_s=min(self.cfg.planner.time_limit_s, PLAN_TIME_LIMIT_S),
        )
        reason = f"interactive job {pre.job_id} needs nodes {','.join(pre.nodes)}"
        self.log.info("switch planned", jobs=[pre.job_id, *pre.victims], nodes=list(pre.nodes), cost=plan.cost)
        performer = PilotPerformer(self, obs, reason)
        report = Executor(performer, self.store(), job_key=lambda a: f"{self.rms}:{a.vjob}").execute(
            plan, reason=reason
        )
        self.metrics.switch_seconds.observe(time.monotonic() - t0)
        self.log.info("switch finished", switch=report.switch_id, summary=report.summary(), jobs=performer.done)
        return performer.done

    def _vm_view(self, obs: Observation, victims: set[str]) -> tuple[ClusterView, dict[str, VJobState]]:
        """The view with the vjobs' VMs (from their pilots) and the target of the switch:
        the victims sleeping, every other vjob as it is."""
        known = {j.id for j in obs.view.jobs}
        nodes = {n.name for n in obs.view.nodes}
        vms, target = [], {}
        for job_id, st in obs.pilots.items():
            saved = st.state is PilotState.SAVED and st.memory_saved
            if job_id not in known or st.node not in nodes or not (saved or st.state is PilotState.RUNNING):
                continue
            state = VMState.SAVED if saved else VMState.RUNNING
            vms.append(VM(st.vm, job_id, st.image or "-", 1, max(1, st.memory_mb), st.node, state))
            target[job_id] = VJobState.SLEEPING if saved or job_id in victims else VJobState.RUNNING
        return replace(obs.view, vms=tuple(vms)), target

    def finish_checkpoint(self, job_id: str) -> None:
        """The job's VM is saved: requeue-hold it and count the preemption (Pn), once."""
        try:
            self.adapter.requeue_hold(job_id)
        except CommandError:
            # The pilot resumes its VM by itself when no requeue follows (vjob.pilot).
            self.metrics.errors.labels(kind="rms").inc()
            self.log.error("requeue-hold failed; the pilot will resume its VM", jobs=[job_id])
            raise
        store_jobs.record_preemption(self.store(), self.rms, job_id)
        st = self._ckdir(job_id).read_state()
        self.metrics.preemptions.inc()
        if st is not None:
            self.metrics.checkpoint_seconds.observe(st.save_seconds)
            self.metrics.checkpoint_bytes.observe(st.save_bytes)
        self.log.info("checkpointed and requeue-held", jobs=[job_id])

    def _requeued_long_enough_ago(self, job_id: str) -> bool:
        """Whether forcing the start of a requeued job is safe. Slurm revokes the old run's
        credential with a one-second timestamp: a restart within the same second (on the same
        node, exactly what a local resume does) is killed as "non-startable: Job credential
        revoked" and the job ends. Slurm's own cred_expire delay avoids that; the agent only
        shortens it once a safe margin has passed since the checkpoint."""
        record = store_jobs.get(self.store(), self.rms, job_id)
        since = record.preempted_since if record is not None else None
        return since is None or time.time() - since >= REQUEUE_RESTART_MARGIN_S

    def _release(self, rel: Release) -> bool:
        try:
            require = getattr(self.adapter, "require_nodes", None)
            if require is not None and rel.preferred_nodes:
                require(rel.job_id, rel.preferred_nodes)  # a local resume: no state to copy
            self.adapter.release(rel.job_id)
            start_now = getattr(self.adapter, "start_now", None)
            if start_now is not None and self._requeued_long_enough_ago(rel.job_id):
                start_now(rel.job_id)  # Slurm: skip the cred_expire delay after a requeue
        except CommandError as exc:
            self.metrics.errors.labels(kind="rms").inc()
            self.log.warning("release failed, retrying next tick", jobs=[rel.job_id], error=str(exc))
            return False
        self.metrics.releases.inc()
        self.log.info("released", jobs=[rel.job_id], nodes=list(rel.preferred_nodes))
        return True

    def _clean_up(self, obs: Observation) -> list[str]:
        """Delete the VMs and pilot directories of vjobs the RMS has forgotten.

        Only after two ticks in a row without the job (one odd answer from the RMS must not
        destroy anybody's saved state) and `cleanup_after_s` after the pilot's last change;
        never while the pilot may still act (starting, running, saving, restoring).
        """
        known = {j.id for j in obs.view.jobs}
        gone_now = {
            job_id
            for job_id, st in obs.pilots.items()
            if job_id not in known
            and st.state in (PilotState.SAVED, PilotState.FINISHED, PilotState.FAILED)
            and time.time() - st.since >= self.cfg.agent.cleanup_after_s
        }
        ripe = sorted(gone_now & self._gone_last_tick)
        self._gone_last_tick = gone_now
        if not ripe:
            return []
        import shutil

        from provisioning.driver import Driver

        cleaned = []
        driver = Driver(self.cfg.provisioning, data_dir=self.cfg.data_path)
        try:
            for job_id in ripe:
                st = obs.pilots[job_id]
                try:
                    driver.delete(st.vm, st.saved_node or st.node)
                except VjobError as exc:
                    self.log.warning("could not delete a forgotten vjob's VM", jobs=[job_id], error=str(exc))
                    continue
                shutil.rmtree(self._ckdir(job_id).path, ignore_errors=True)
                cleaned.append(job_id)
                self.log.info("deleted the VM of a job the RMS no longer knows", jobs=[job_id], vm=st.vm)
        finally:
            driver.close()
        return cleaned

    def _charge_usage(self, view: ClusterView) -> None:
        """Add this tick's node-seconds to each user's decayed usage (UBIS Target−Usage)."""
        from ubis_priority import usage as ubis_usage

        try:
            ubis_usage.charge(self.store(), view, self.cfg.priority)
        except StoreError as exc:
            self._store_failed(exc)

    def _record_resumes(self, obs: Observation, report: TickReport) -> None:
        """A checkpointed job running again with its VM restored: stop its Pt clock."""
        for job in obs.view.running:
            pilot = obs.pilots.get(job.id)
            if job.preempted_since is None or pilot is None or pilot.state is not PilotState.RUNNING:
                continue
            if pilot.since < job.preempted_since:
                continue  # the state file predates the checkpoint: not resumed yet
            try:
                store_jobs.record_resume(self.store(), self.rms, job.id, at=pilot.since)
                report.resumed.append(job.id)
                self.log.info("resumed", jobs=[job.id], node=pilot.node, local=pilot.node == pilot.saved_node)
            except StoreError as exc:
                self._store_failed(exc)
                return

    def _observe_interactive_starts(self, view: ClusterView) -> None:
        self._seen_running_interactive &= {j.id for j in view.running}
        for job in view.running:
            if job.interactive and job.id not in self._seen_running_interactive and job.start_time is not None:
                self._seen_running_interactive.add(job.id)
                self.metrics.interactive_wait.observe(max(0.0, job.start_time - job.submit_time))

    # -- recovery -------------------------------------------------------------------------
    def recover(self) -> list[int]:
        """Finish or undo the switches a previous agent left open; returns their ids.

        An action whose pilot saved the VM is finished (requeue-hold if the job still runs,
        Pn recorded once); an action whose VM was not saved is undone (its request withdrawn;
        a pilot caught mid-save restores by itself). No VM is lost either way: it is running,
        or saved on disk behind a held job.
        """
        store = self.store()
        states = {j.id: j.state for j in self.adapter.jobs()}
        handled = []
        for sw in journal.open_switches(store):
            all_done = True
            for action in sw.actions:
                if action.state not in journal.OPEN_ACTION_STATES:
                    all_done = all_done and action.state == "done"
                    continue
                job_id = action.rms_job_id
                pdir = self._ckdir(job_id)
                st = pdir.read_state()
                saved = action.state == "running" and st is not None and st.state is PilotState.SAVED
                saved = saved and bool(st.request_id) and st.memory_saved
                state = states.get(job_id)
                try:
                    if saved and state is JobState.RUNNING:
                        self.finish_checkpoint(job_id)
                        journal.set_action(store, action.id, "done")
                        continue
                    if saved and state in (JobState.PENDING, JobState.HELD):
                        store_jobs.record_preemption(store, self.rms, job_id)
                        journal.set_action(store, action.id, "done")
                        continue
                except CommandError as exc:
                    journal.set_action(store, action.id, "failed", str(exc))
                    all_done = False
                    continue
                pdir.withdraw_request()
                journal.set_action(store, action.id, "undone", "agent restarted before the checkpoint")
                all_done = False
            journal.set_switch(store, sw.id, "done" if all_done else "rolled_back")
            self.log.info("recovered switch", switch=sw.id, outcome="done" if all_done else "rolled_back")
            handled.append(sw.id)
        self._recovered = True
        return handled

    def _ckdir(self, job_id: str) -> PilotDir:
        return PilotDir(self.root, self.rms, job_id)


def _records(store: Store, rms: str, job_ids: list[str], chunk: int = 2000) -> dict[str, JobRecord]:
    """The store's rows of these jobs, in a few queries instead of one per job."""
    out: dict[str, JobRecord] = {}
    with store.session() as s:
        for i in range(0, len(job_ids), chunk):
            part = job_ids[i : i + chunk]
            rows = s.scalars(select(JobRecord).where(JobRecord.rms == rms, JobRecord.rms_job_id.in_(part)))
            out.update({r.rms_job_id: r for r in rows})
    return out


def _vjob_state(job: Job, pilot: PilotStatus, sleeping: bool) -> VJobState:
    if sleeping:
        return VJobState.SLEEPING
    if job.state is JobState.RUNNING and pilot.state in (PilotState.RUNNING, PilotState.SAVING):
        return VJobState.RUNNING
    if pilot.state is PilotState.FINISHED:
        return VJobState.TERMINATED
    return VJobState.WAITING


def _mtimes(paths: tuple[Path, ...]) -> tuple[int, ...]:
    """Modification times in ns; 0 for a file that is missing or cannot be looked at."""
    out = []
    for path in paths:
        try:
            out.append(path.stat().st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)


__all__ = [
    "Agent",
    "Observation",
    "TickReport",
    "live_view",
    "make_adapter",
    "pilot_root",
    "slurm_wake_file",
    "wake_file",
    "wake_files",
]
