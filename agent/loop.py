"""The vjob agent (`vjob agent --rms slurm`): observe → decide → act → record, in a loop.

Why this shape: the RMS stays in charge of running jobs; the agent only steers it. Each tick it
observes the RMS (jobs, nodes), the pilots (their state files) and the store (Pn, Pt, usage)
(agent.observe), asks the pure tick decision what to do (preemption.scheduling.tick.decide,
the same decision the simulator's differential test holds its engine to), and acts through the
RMS adapter and the pilots (agent.act) — after journalling every action (vjob.store.journal),
so that a restarted agent finishes or undoes a half-done switch (agent.recover).

Failure stance — the agent must never stop the RMS from working:
* the agent is outside the RMS: if it dies, the RMS keeps scheduling with its own priorities;
* one agent per RMS acts at a time (a lease in the store); a second one is a standby that
  observes nothing and acts on nothing until the lease is free;
* with the state store down it takes no decisions that would need journalling (no
  checkpoints, no releases), logs, counts the error and tries again next tick;
* a failing RMS command is logged with the job it concerns and retried next tick;
* a pilot that saved its VM but was never requeued restores it by itself (agent.pilot).

A tick starts every `interval_s`, or at once when a wake file changes: `<data_dir>/agent.wake`
for anything that knows an interactive job just arrived, plus the files the adapter declares
(`abilities.wake_files`; on Slurm the one job_submit.lua rewrites beside slurm.conf).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agent import act, consolidate, remap_step
from agent.deadline import DeadlineKeeper
from agent.metrics import AgentMetrics
from agent.observe import Observation, observe
from agent.recover import recover
from plugins import make_adapter
from preemption.remap.claims import PassClaims, claims
from preemption.scheduling.tick import Decision, decide
from vjob import log
from vjob.config import Config
from vjob.errors import CommandError, StoreError, VjobError
from vjob.model import ClusterView
from vjob.pilot_files import PilotDir, PilotState, find_dir, pilot_root, vms_of
from vjob.rms import RMSAdapter
from vjob.sdnotify import Notifier
from vjob.store import jobs as store_jobs
from vjob.store import leases
from vjob.store.db import Store, open_store


def wake_file(cfg: Config) -> Path:
    """The RMS-neutral wake file: touching it makes the agent tick at once."""
    return cfg.data_path / "agent.wake"


def wake_files(cfg: Config, adapter: RMSAdapter) -> tuple[Path, ...]:
    """Every file whose change wakes the agent before its next tick."""
    return (wake_file(cfg), *adapter.abilities.wake_files)


@dataclass
class TickReport:
    """What a tick did (returned for tests, the demo and `--once`)."""

    at: float
    store_ok: bool = True
    active: bool = True
    """False when another agent holds the cluster's lease: this one only waited."""
    decision: Decision | None = None
    checkpointed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)


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
        owner: str | None = None,
        dry_run: bool = False,
    ) -> None:
        self.cfg = cfg
        self.dry_run = dry_run
        """Observe and decide each tick, log what would be done, change nothing (`--dry-run`)."""
        self.adapter = adapter
        self.rms = rms
        self.metrics = metrics or AgentMetrics()
        self._store: Store | None = None
        self.root = pilot_root(cfg)
        self.pilot_dirs: dict[str, PilotDir] = {}
        """job id → the directory of it the last observation believed (owned by the job's user or
        root, agent.observe.read_pilots): where requests go, never a squatter's same-named one."""
        self.log = log.get("agent").bind(rms=rms)
        self.sent_priorities: dict[str, int] = {}
        self.gone_since: dict[str, float] = {}
        self.gone_last_tick: set[str] = set()
        self._seen_running_interactive: set[str] = set()
        self._recovered = False
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_name = f"agent:{rms}"
        self._lease_until = 0.0
        self.recorded_vms: dict[str, tuple[str, str]] = {}
        """job id → (node, image) this agent last wrote to the store (agent.observe); the nodes of
        a vjob of several VMs comma-separated, its first VM's first."""
        self.anchors: dict[str, float] = {}
        """The vjob policy's guard: each protected job's first reserved start, carried between
        ticks so repeated preemptions cannot push it back by the slack each time."""
        self.notify = Notifier()
        """systemd's watchdog (Type=notify units): pinged after every tick and while waiting."""
        self.control = consolidate.ControlState()
        """The Entropy control loop's readings and last decision (`planner.interval_s`)."""
        self.deadline = DeadlineKeeper(cfg, rms, metrics=self.metrics)
        """X for the submit hooks and the running vjobs' x-factors (agent.deadline)."""
        self.remap = remap_step.RemapState()
        """Live remapping's samples and last decisions (`[remap] farm_file`, agent.remap_step)."""

    # -- store ----------------------------------------------------------------------------
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.cfg)
        return self._store

    def store_failed(self, exc: Exception) -> None:
        self.metrics.store_up.set(0)
        self.metrics.errors.labels(kind="store").inc()
        self.log.error("state store unavailable: no checkpoint or release this tick, retrying", error=str(exc))
        if self._store is not None:
            self._store.close()
        self._store = None

    def pilot_dir(self, job_id: str) -> PilotDir:
        """The job's directory as last observed. Before (recovery runs ahead of the first
        observation) or for a job not heard then: the one owned by the user the store recorded
        for the job, or by root (vjob.pilot_files.find_dir); when there is none, its plain name,
        with reads and requests refused if anybody else owns that (a squatter's)."""
        known = self.pilot_dirs.get(job_id)
        if known is not None:
            return known
        uids = [0]
        try:
            record = store_jobs.get(self.store(), self.rms, job_id)
            if record is not None:
                uids.insert(0, pwd.getpwnam(record.user).pw_uid)
        except (StoreError, KeyError):
            pass  # no store, or a user without an account here: root's directory only
        found = find_dir(self.root, self.rms, job_id, uids)
        if found is not None:
            found.owners = tuple(uids)
            return found
        return PilotDir(self.root, self.rms, job_id, owners=uids)

    # -- the lease ------------------------------------------------------------------------
    def hold_lease(self) -> bool:
        """Take or renew this cluster's lease; False when another agent holds it."""
        ttl = self.cfg.agent.lease_s
        held = leases.acquire(self.store(), self.lease_name, self.owner, ttl)
        was = self._lease_until > time.time()
        self._lease_until = time.time() + ttl if held else 0.0
        self.metrics.active.set(1 if held else 0)
        if held and not was:
            self.log.info("active: holding the agent lease", lease=self.lease_name, owner=self.owner)
            self._recovered = False  # the previous holder may have left a switch open
        elif not held and was:
            self.log.error("lost the agent lease to another agent: standing by", lease=self.lease_name)
        return held

    def lease_valid(self) -> bool:
        """Whether the lease still covers the next action (with a margin for clock and I/O)."""
        return time.time() < self._lease_until - min(5.0, self.cfg.agent.lease_s / 3)

    def lease_held(self) -> bool:
        """Whether the agent may start acting: its lease still covers it, or it takes it now (a
        step run outside the tick's acting phase). False when another agent holds it."""
        return self.lease_valid() or self.hold_lease()

    @contextlib.contextmanager
    def keeping_lease(self, *, active: bool = True) -> Iterator[None]:
        """Renew the lease from a thread for as long as the block acts.

        Why: a switch waits for its victims' saves (minutes for a big VM, agent.act), far
        longer than the lease; unrenewed, it ran out mid-switch and a standby took over, rolled
        the switch back and withdrew the live checkpoint request. The keeper renews every third
        of `lease_s` and feeds systemd's watchdog meanwhile (for at most
        `checkpoint_timeout_max_s`: a tick hung longer is the watchdog's). When the lease is
        lost (another agent holds it, or the store did not answer until it expired)
        `lease_valid()` turns False and the acting code stops: the executor starts and journals
        nothing more, a waiting checkpoint is left to the new holder, who finishes or undoes the
        switch (agent.recover)."""
        if not active or self._lease_until <= 0:
            yield
            return
        stop = threading.Event()
        keeper = threading.Thread(target=self._keep_lease, args=(self.store(), stop), name="vjob-lease-keeper",
                                  daemon=True)  # fmt: skip
        keeper.start()
        try:
            yield
        finally:
            stop.set()
            keeper.join(timeout=self.cfg.agent.command_timeout_s + 5)

    def _keep_lease(self, store: Store, stop: threading.Event) -> None:
        ttl = self.cfg.agent.lease_s
        period = ttl / 3
        wait = period
        feed_until = time.monotonic() + self.cfg.agent.checkpoint_timeout_max_s  # then a hung tick shows
        while not stop.wait(wait):
            if self._lease_until <= 0:
                return  # lost already (the main thread saw it)
            t = time.time()
            try:
                held = leases.acquire(store, self.lease_name, self.owner, ttl, at=t)
            except (StoreError, ValueError) as exc:
                if not self.lease_valid():
                    self._lose_lease(f"the store did not answer before it ran out: {exc}")
                    return
                self.log.warning("cannot renew the agent lease, retrying", lease=self.lease_name, error=str(exc))
                wait = min(1.0, period)
                continue
            if not held:
                self._lose_lease("another agent holds it")
                return
            self._lease_until = t + ttl
            if time.monotonic() < feed_until:
                self.notify.watchdog()  # the tick waits on saves, each bounded by its timeout
            wait = period

    def _lose_lease(self, why: str) -> None:
        """The lease is gone while acting: everything acting checks lease_valid() and stops."""
        self._lease_until = 0.0
        self.metrics.active.set(0)
        self.metrics.errors.labels(kind="lease").inc()
        self.log.error("lost the agent lease while acting: stopping, the switch is left to its new holder",
                       lease=self.lease_name, why=why)  # fmt: skip

    def checkpoint_timeout_for(self, obs: Observation, job_id: str) -> float:
        """How long a switch waits for this job's save: `[agent] checkpoint_timeout_s` plus
        `checkpoint_timeout_per_gib_s` per GiB of its VM, at most `checkpoint_timeout_max_s`.
        The VM's memory is its pilot's word (the user's), bounded by what the RMS allocated the
        job when it says: a claim cannot stretch the wait past the job's own allocation."""
        st = obs.pilots.get(job_id)
        claimed = st.memory_mb if st is not None else 0
        try:
            allocated = obs.view.job(job_id).memory_mb
        except KeyError:
            allocated = 0
        memory = min(claimed, allocated) if claimed and allocated else claimed or allocated
        return self.cfg.agent.checkpoint_timeout_for(memory)

    def give_up_lease(self) -> None:
        try:
            leases.release(self.store(), self.lease_name, self.owner)
        except StoreError:
            pass  # it runs out by itself
        self._lease_until = 0.0

    # -- observe, recover -----------------------------------------------------------------
    def observe(self, *, track: bool = True) -> Observation:
        return observe(self, track=track)

    def recover(self) -> list[int]:
        handled = recover(self)
        self._recovered = True
        return handled

    def finish_checkpoint(self, job_id: str) -> None:
        act.finish_checkpoint(self, job_id)

    # -- the loop ------------------------------------------------------------------------
    def tick(self) -> TickReport:
        report = TickReport(at=time.time())
        self.metrics.ticks.inc()
        if self.dry_run:
            return self._dry_tick(report)
        try:
            active: bool | None = self.hold_lease()
        except StoreError as exc:
            # Lease unknown: observe and set priorities (harmless twice), but act on nothing
            # that needs the journal — observe() finds the store down and says so.
            self.store_failed(exc)
            active = None
        if active is False:
            report.active = False
            return report
        with self.keeping_lease(active=bool(active)):
            return self._act_tick(report, active)

    def _act_tick(self, report: TickReport, active: bool | None) -> TickReport:
        """The tick of an agent holding its lease (`active`) or unsure of it (None: the store
        is down, nothing needing the journal is done)."""
        try:
            if active and not self._recovered:
                self.recover()
            obs = self.observe()
        except (CommandError, VjobError) as exc:
            if isinstance(exc, StoreError):
                self.store_failed(exc)
                report.store_ok = False
            else:
                self.metrics.errors.labels(kind="rms").inc()
                self.log.error("cannot observe the RMS, retrying next tick", error=str(exc))
            report.errors.append(str(exc))
            return report
        report.store_ok = obs.store_ok
        report.cleaned = act.clean_up(self, obs) if obs.store_ok else []
        if obs.store_ok:
            act.charge_usage(self, obs.view)
        act.record_resumes(self, obs, report)
        self._observe_interactive_starts(obs.view)
        decision = decide(
            obs.view,
            self.cfg,
            knob=self.adapter.abilities.priority,
            checkpointable=self.checkpointable(obs),
            sleeping=obs.sleeping,
            anchors=self.anchors,
        )
        self.anchors = dict(decision.anchors)  # the guard's slack counts from the first reservation
        report.decision = decision
        act.apply_priorities(self, decision)
        if decision.waiting_interactive:
            self.log.info("interactive jobs wait (cap or no victims)", jobs=list(decision.waiting_interactive))
        if self.cfg.deadline.admission != "none":
            try:
                self.deadline.tick(
                    obs.view,
                    self.adapter,
                    act=obs.store_ok,
                    checkpoint=lambda j, why: self._deadline_checkpoint(obs, j, why, report, decision),
                    store=self.store() if obs.store_ok else None,
                )
            except VjobError as exc:  # never let the deadline duty stop the tick
                self.log.error("deadline evaluation failed", error=str(exc))
        if not obs.store_ok:
            return report
        try:
            for pre in decision.preemptions:
                if not self.lease_held():
                    break
                report.checkpointed += act.preempt(self, pre, obs)
            if not self.lease_held():
                return report  # lost while acting (keeping_lease): the new holder acts from here
            releases = decision.releases
            if self.cfg.deadline.admission != "none":  # a job held for its deadline: only where x < X
                releases = tuple(self.deadline.releases(obs.view, releases))
            for rel in releases:
                if act.release(self, rel):
                    report.released.append(rel.job_id)
            every = self.cfg.planner.interval_s
            switched = None
            if every > 0 and not decision.preemptions and time.time() - self.control.last_step >= every:
                switched = consolidate.step(self, obs, self.control)  # re-plan from the measured demand
            if self.cfg.remap.farm_file and switched is None:
                # on this tick's observation, leaving alone what the pass acts on (remap.claims)
                self._remap(obs, claims(decision.preemptions, decision.placements))
        except StoreError as exc:
            self.store_failed(exc)
            self._recovered = False  # the journal may hold a switch cut short: look again
            report.store_ok = False
            report.errors.append(str(exc))
        self.metrics.last_tick.set(time.time())
        return report

    def _remap(self, obs: Observation, pass_claims: PassClaims) -> None:
        """The remapping step (agent.remap_step); its failure never stops the tick (a store
        failure excepted: the tick's own handling applies)."""
        try:
            remap_step.step(self, obs, self.remap, pass_claims)
        except StoreError:
            raise
        except VjobError as exc:
            self.metrics.errors.labels(kind="remap").inc()
            self.log.error("remapping step failed", error=str(exc))

    def _dry_tick(self, report: TickReport) -> TickReport:
        """A dry-run tick: the decision an active agent would take, logged and returned; no
        lease, no recovery, no job tracked, no priority sent, no checkpoint, no release."""
        try:
            obs = self.observe(track=False)
        except VjobError as exc:
            self.log.error("dry run: cannot observe the RMS, retrying next tick", error=str(exc))
            report.errors.append(str(exc))
            return report
        report.store_ok = obs.store_ok
        report.decision = decision = decide(
            obs.view,
            self.cfg,
            knob=self.adapter.abilities.priority,
            checkpointable=self.checkpointable(obs),
            sleeping=obs.sleeping,
        )
        self.log.info(
            "dry run: would do",
            priorities=dict(decision.rms_priorities),
            preemptions=[{"job": p.job_id, "victims": list(p.victims), "nodes": list(p.nodes)}
                         for p in decision.preemptions],
            releases=[r.job_id for r in decision.releases],
            waiting_interactive=list(decision.waiting_interactive),
        )  # fmt: skip
        self.metrics.last_tick.set(time.time())
        return report

    def _deadline_checkpoint(
        self, obs: Observation, job_id: str, reason: str, report: TickReport, decision: Decision
    ) -> bool:
        """The deadline duty's checkpoint: the preemption path (agent.act.checkpoint_vjob). A
        victim of this tick's preemptions is left to them (one save per VM; looked at again
        next tick)."""
        if any(job_id in pre.victims for pre in decision.preemptions):
            raise VjobError(f"job {job_id}: checkpointed by this tick's preemption instead")
        saved = act.checkpoint_vjob(self, job_id, obs, reason)
        if saved:
            report.checkpointed.append(job_id)
        return saved

    def checkpointable(self, obs: Observation) -> set[str]:
        """Running vjobs whose VMs (one, or one per node) all run on nodes the RMS allocated
        them — and none at all when the RMS cannot requeue a running job (the victim would have
        nowhere to go)."""
        if not self.adapter.abilities.requeue_hold:
            return set()
        return {
            j.id
            for j in obs.view.running
            if j.id in obs.pilots
            and obs.pilots[j.id].state is PilotState.RUNNING
            and (not j.allocated_nodes or all(n in j.allocated_nodes for _, n in vms_of(obs.pilots[j.id])))
        }

    def run(self, stop: threading.Event | None = None, *, once: bool = False) -> None:
        """Tick until `stop` is set; between ticks wake early when a wake file changes.

        The files' times are taken before the first tick, so a change during a tick starts the
        next one at once: no submission is missed. Polled twice a second: a stat is cheap and
        works on any filesystem, where inotify would not see a change made on another host. A
        standby polls the lease every third of its time to live.
        """
        stop = stop or threading.Event()
        if not self.dry_run:
            self.deadline.check_publishable()  # an admission that cannot publish X is said at once
        wakes = wake_files(self.cfg, self.adapter)
        last_mtimes = _mtimes(wakes)
        try:
            while True:
                report = None
                try:
                    report = self.tick()
                except VjobError as exc:
                    self.metrics.errors.labels(kind="tick").inc()
                    self.log.error("tick failed, retrying", error=str(exc))
                    self._recovered = False  # a switch cut short is finished or undone next tick
                except Exception:  # a daemon outlives one bad tick; the traceback is logged
                    self.metrics.errors.labels(kind="unexpected").inc()
                    self.log.exception("unexpected error in a tick, retrying")
                    self._recovered = False
                self.notify.watchdog()
                if once:
                    return
                interval = self.cfg.agent.interval_s
                if report is not None and not report.active:
                    interval = min(interval, self.cfg.agent.lease_s / 3)
                deadline = time.monotonic() + interval
                while time.monotonic() < deadline and not stop.is_set():
                    mtimes = _mtimes(wakes)
                    if mtimes != last_mtimes:
                        changed = [str(p) for p, a, b in zip(wakes, last_mtimes, mtimes, strict=True) if a != b]
                        last_mtimes = mtimes
                        self.log.info("woken before the next tick", files=changed)
                        break
                    stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    self.notify.watchdog()
                if stop.is_set():
                    return
        finally:
            if not once and not self.dry_run:
                self.give_up_lease()

    def _observe_interactive_starts(self, view: ClusterView) -> None:
        self._seen_running_interactive &= {j.id for j in view.running}
        for job in view.running:
            if job.interactive and job.id not in self._seen_running_interactive and job.start_time is not None:
                self._seen_running_interactive.add(job.id)
                self.metrics.interactive_wait.observe(max(0.0, job.start_time - job.submit_time))


def _mtimes(paths: tuple[Path, ...]) -> tuple[int, ...]:
    """Modification times in ns; 0 for a file that is missing or cannot be looked at."""
    out = []
    for path in paths:
        try:
            out.append(path.stat().st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)


__all__ = ["Agent", "Observation", "TickReport", "live_view", "wake_file", "wake_files"]
