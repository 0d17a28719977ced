"""The vjob agent (`vjob agent --rms slurm`): observe → decide → arbitrate → act, in a loop.

Why this shape: the RMS stays in charge of running jobs; the agent only steers it. Each tick it
observes the RMS (jobs, nodes), the pilots (their state files) and the store (Pn, Pt, usage)
(agent.observe), asks the pure tick decision what to do (preemption.scheduling.tick.decide,
the same decision the simulator's differential test holds its engine to), lets the pure
arbiter (agent.arbiter) merge it with the deadline duty, the control loop and the remap step
into one plan, and carries the plan out through the RMS adapter and the pilots (agent.act) —
after journalling every action (vjob.store.journal), so that a restarted agent finishes or
undoes a half-done switch (agent.recover). The loop is the top of the agent: the steps get
its ports (agent.ports: store, lease, pilot directories, adapter, driver), never the Agent.

Failure stance — the agent must never stop the RMS from working:
* the agent is outside the RMS: if it dies, the RMS keeps scheduling with its own priorities;
* one agent per RMS acts at a time (a lease in the store); a second one is a standby that
  observes nothing and acts on nothing until the lease is free;
* with the state store down it takes no decisions that would need journalling (no
  checkpoints, no releases), logs, counts the error and tries again next tick;
* a failing RMS command is logged with the job it concerns and retried next tick;
* a pilot that saved its VM but was never requeued restores it by itself (pilot.pilot).

A tick starts every `interval_s`, or at once when a wake file changes: `<data_dir>/agent.wake`
for anything that knows an interactive job just arrived, plus the files the adapter declares
(`abilities.wake_files`; on Slurm the one job_submit.lua rewrites beside slurm.conf).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agent import act, consolidate, deadline_actions, drain, pause_checkpoint, remap_step
from agent.arbiter import (
    Proposals,
    TickPlan,
    arbitrate,
    consolidation,
    deadline_checkpoints,
    remap_follows,
    remap_moves,
)
from agent.deadline import DeadlineKeeper
from agent.heap_pace import HeapPace
from agent.lease import Lease
from agent.metrics import AgentMetrics
from agent.observe import Observation, observe
from agent.ports import Ports, StoreLink
from agent.recover import recover
from agent.site_read import resync, site_order
from agent.wait_notice import STATUS_NAME as WAIT_STATUS_NAME
from agent.wait_notice import WaitNotices
from plugins import make_adapter
from preemption.scheduling.tick import Decision, decide
from vjob import log
from vjob.config import Config
from vjob.errors import CommandError, StoreError, VjobError
from vjob.model import ClusterView
from vjob.pilot_files import pilot_root
from vjob.rms import RMSAdapter
from vjob.sdnotify import Notifier


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
    with Agent(cfg, make_adapter(rms, cfg), rms=rms) as agent:
        return agent.observe(track=False).view


class Agent:
    """One agent for one RMS: the loop (observe → decide → arbitrate → act) over its ports.

    The steps reach the store, the lease and the pilot directories through `ports` (agent.ports);
    the deciders' state lives in their own records (`control`, `deadline`, `remap`, `forgotten`),
    the pass's in `sent_priorities` and `anchors`."""

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
        self.metrics = metrics = metrics or AgentMetrics()
        metrics.interval.set(cfg.agent.interval_s)
        self.log = log.get("agent").bind(rms=rms)
        self.notify = Notifier()
        """systemd's watchdog (Type=notify units): pinged after every tick and while waiting."""
        self.notices = WaitNotices(cfg.data_path / WAIT_STATUS_NAME)
        """Why each held-back interactive job waits, as last written for its user (agent.wait_notice)."""
        store = StoreLink(cfg, metrics, self.log)
        owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        lease = Lease(
            cfg, rms, owner, store, metrics=metrics, log=self.log, notify=self.notify, on_gain=self._look_again
        )
        self.ports = Ports(cfg, rms, adapter, metrics, self.log, store, lease, pilot_root(cfg))
        self.sent_priorities: dict[str, int] = {}
        """job id → the priority this agent last sent the RMS (act.apply_priorities)."""
        self.forgotten = act.Forgotten()
        """The vjobs the RMS no longer lists, until their clean-up (act.clean_up)."""
        self._seen_running_interactive: set[str] = set()
        self._recovered = False
        self.anchors: dict[str, float] = {}
        """The vjob policy's guard: each protected job's first reserved start, carried between
        ticks so repeated preemptions cannot push it back by the slack each time."""
        self.control = consolidate.ControlState()
        """The Entropy control loop's readings and last decision (`planner.interval_s`)."""
        self.deadline = DeadlineKeeper(cfg, rms, metrics=metrics)
        """X for the submit hooks and the running vjobs' x-factors (agent.deadline)."""
        self.remap = remap_step.RemapState()
        """Live remapping's samples and last decisions (`[remap] farm_file`, agent.remap_step)."""
        self.drain = drain.DrainState()
        """`vjob drain`'s mark as last read (agent.drain): drained, a tick only undoes."""
        self.heap = HeapPace()
        """The collector paced to the daemon's ticks (`run`): the heap frozen as each starts, thawed
        and collected every 30 (agent.heap_pace). Not in `tick` itself: a test process calling it
        is not to have its whole heap frozen."""

    def close(self) -> None:
        """Close the agent's own store connection. Why: a `vjob drain` pass (agent.drain_cmd)
        or `vjob prio --rms` builds an agent for a tick or two inside a command that goes on
        (the daemon's ends with its process); its engine's pooled connections stayed open."""
        store, self.ports.store.opened = self.ports.store.opened, None
        if store is not None:
            store.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _look_again(self) -> None:
        """The journal may hold a switch left open (by a previous lease holder, or cut short by
        a failure): the next acting tick recovers it first (agent.recover)."""
        self._recovered = False
        self.notices.synced = False  # an earlier holder's wait reasons: looked at once more

    # -- observe, recover -----------------------------------------------------------------
    def observe(self, *, track: bool = True) -> Observation:
        return observe(self.ports, track=track)

    def recover(self) -> list[int]:
        handled = recover(self.ports)
        self._recovered = True
        return handled

    # -- the loop ------------------------------------------------------------------------
    def tick(self) -> TickReport:
        report = TickReport(at=time.time())
        self.metrics.ticks.inc()
        if self.dry_run:
            return self._dry_tick(report)
        try:
            active: bool | None = self.ports.lease.hold()
        except StoreError as exc:
            # Lease unknown: observe and set priorities (harmless twice), but act on nothing
            # that needs the journal — observe() finds the store down and says so.
            self.ports.store.failed(exc)
            active = None
        if active is False:
            report.active = False
            return report
        with self.ports.lease.keeping(active=bool(active)):
            return self._act_tick(report, active)

    def _act_tick(self, report: TickReport, active: bool | None) -> TickReport:
        """The tick of an agent holding its lease (`active`) or unsure of it (None: the store
        is down, nothing needing the journal is done): observe, let the deciders propose, take
        the arbiter's one plan (agent.arbiter) and carry it out."""
        try:
            if active and not self._recovered:
                self.recover()
            obs = self.observe()
        except (CommandError, VjobError) as exc:
            if isinstance(exc, StoreError):
                self.ports.store.failed(exc)
                report.store_ok = False
            else:
                self.metrics.errors.labels(kind="rms").inc()
                self.log.error("cannot observe the RMS, retrying next tick", error=str(exc))
            report.errors.append(str(exc))
            return report
        report.store_ok = obs.store_ok
        report.cleaned = act.clean_up(self.ports, obs, self.forgotten) if obs.store_ok else []
        if obs.store_ok:
            act.charge_usage(self.ports, obs.view)
        report.resumed += act.record_resumes(self.ports, obs)
        self._observe_interactive_starts(obs.view)
        if drain.is_drained(self.ports, self.drain):  # release, reset, clear; preempt nothing
            done = drain.drain_pass(self.ports, obs, self.drain, self.sent_priorities, self.notices)
            report.released += done.released
            report.errors += done.errors
            self.metrics.last_tick.set(time.time())
            return report
        decision = self._decide(obs, self.anchors)
        self.anchors = dict(decision.anchors)  # the guard's slack counts from the first reservation
        report.decision = decision
        plan = arbitrate(
            Proposals(
                decision,
                obs.store_ok,
                deadline=self.cfg.deadline.admission != "none",
                control=self.cfg.planner.interval_s > 0,
                remap=bool(self.cfg.remap.farm_file),
            )
        )
        return self._carry_out(plan, decision, obs, report)

    def _carry_out(self, plan: TickPlan, decision: Decision, obs: Observation, report: TickReport) -> TickReport:
        """The tick's plan, in its order; a lease lost while acting stops it (Lease.keeping:
        the new holder acts from there), a store failure ends it (the journal may hold a switch
        cut short: the next tick looks again)."""
        exact = plan.priorities if decision.exact_priorities else None  # tier bands: the values themselves
        resync(self.adapter, self.sent_priorities, self.log, exact)  # and a user's own `qalter -p` undone (PBS)
        act.apply_priorities(self.ports, plan.priorities, self.sent_priorities)
        self.notices.update(self.adapter, decision, obs.view, self.log, self.metrics)  # the users told why
        if plan.deadline:
            self._deadline(obs, plan, report)
        if not plan.journals:
            return report
        try:
            for pre in plan.preemptions:
                if not self.ports.lease.held():
                    break
                report.checkpointed += act.preempt(self.ports, pre, obs)
            if not self.ports.lease.held():
                return report  # lost while acting (Lease.keeping): the new holder acts from here
            releases = plan.releases
            if plan.gate_releases:  # a job held for its deadline: only where x < X
                releases = tuple(self.deadline.releases(obs.view, releases))
            for rel in releases:
                if act.release(self.ports, rel):
                    report.released.append(rel.job_id)
            switched = None
            if plan.consolidate and time.time() - self.control.last_step >= self.cfg.planner.interval_s:
                switch = consolidation(plan, consolidate.propose(self.ports, obs, self.control))  # measured demand
                if switch is not None:
                    switched = consolidate.carry_out(self.ports, obs, self.control, switch)
            if remap_follows(plan, switched is not None):
                self._remap(obs, plan, consolidated=switched is not None)  # on this tick's observation
        except StoreError as exc:
            self.ports.store.failed(exc)
            self._recovered = False  # the journal may hold a switch cut short: look again
            report.store_ok = False
            report.errors.append(str(exc))
        self.metrics.last_tick.set(time.time())
        return report

    def _decide(self, obs: Observation, anchors: dict[str, float] | None) -> Decision:
        """The scheduling pass on this observation (preemption.scheduling.tick.decide), the
        guard's `anchors` carried from the last tick (a dry run keeps none)."""
        return decide(
            obs.view,
            self.cfg,
            knob=self.adapter.abilities.priority,
            checkpointable=act.checkpointable(self.ports, obs),
            sleeping=obs.sleeping,
            anchors=anchors,
            site=site_order(self.adapter, self.log),  # the site's fair share inside vjob's tiers
        )

    def _deadline(self, obs: Observation, plan: TickPlan, report: TickReport) -> None:
        """The deadline duty: it proposes (agent.deadline), the arbiter refuses its checkpoints
        of the pass's victims, the rest is carried out (agent.deadline_actions); its failure
        never stops the tick."""
        try:
            store = self.ports.store() if plan.journals else None
            proposal = self.deadline.propose(obs.view, self.adapter, act=plan.journals, store=store)
            deadline_actions.carry_out(
                self.deadline,
                deadline_checkpoints(plan, proposal),  # a victim of this tick's preemptions is the pass's
                self.adapter,
                checkpoint=lambda j, why: self._deadline_checkpoint(obs, j, why, report),
            )
        except VjobError as exc:  # never let the deadline duty stop the tick
            self.log.error("deadline evaluation failed", error=str(exc))

    def _deadline_checkpoint(self, obs: Observation, job_id: str, reason: str, report: TickReport) -> bool:
        """The deadline duty's checkpoint: the preemption path (agent.act.checkpoint_vjob)."""
        saved = act.checkpoint_vjob(self.ports, job_id, obs, reason)
        if saved:
            report.checkpointed.append(job_id)
        return saved

    def _remap(self, obs: Observation, plan: TickPlan, *, consolidated: bool = False) -> None:
        """The remapping step (agent.remap_step): its moves proposed, passed by the arbiter
        (agent.arbiter.remap_moves), carried out. Its failure never stops the tick (a store
        failure excepted: the tick's own handling applies)."""
        try:
            proposal = remap_step.propose(self.ports, obs, self.remap, plan.remap_claims)
            taken = remap_moves(plan, consolidated, proposal)
            if taken is not None:
                remap_step.carry_out(self.ports, obs, self.remap, taken)
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
        if drain.is_drained(self.ports, self.drain):
            self.log.info("dry run: drained (vjob drain), would release", releases=sorted(obs.sleeping))
            self.metrics.last_tick.set(time.time())
            return report
        report.decision = decision = self._decide(obs, None)
        self.log.info(
            "dry run: would do",
            priorities=dict(decision.rms_priorities),
            preemptions=[
                {"job": p.job_id, "victims": list(p.victims), "nodes": list(p.nodes)} for p in decision.preemptions
            ],
            releases=[r.job_id for r in decision.releases],
            waiting_interactive=list(decision.waiting_interactive),
        )
        self.metrics.last_tick.set(time.time())
        return report

    def run(self, stop: threading.Event | None = None, *, once: bool = False) -> bool:
        """Tick until `stop` is set; between ticks wake early when a wake file changes. True
        when the last tick ran whole (no exception, no error in its report): what `--once`
        exits with, so that a cron job or a health check can trust it.

        The files' times are taken before the first tick, so a change during a tick starts the
        next one at once: no submission is missed. Polled twice a second: a stat is cheap and
        works on any filesystem, where inotify would not see a change made on another host. A
        standby polls the lease every third of its time to live.
        """
        stop = stop or threading.Event()
        if not self.dry_run:
            self.deadline.check_publishable()  # an admission that cannot publish X is said at once
            pause_checkpoint.enabled(self.ports)  # pause-first on or off, and why: one log line at start
        wakes = wake_files(self.cfg, self.adapter)
        last_mtimes = _mtimes(wakes)
        try:
            while True:
                report = None
                self.heap.tick_starts()  # the collector paced to the daemon's ticks (agent.heap_pace)
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
                    return report is not None and not report.errors
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
                        woken = getattr(self.adapter, "woken", None)  # optional: the next look reads sooner (json_pace)
                        if callable(woken):
                            woken()
                        break
                    stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    self.notify.watchdog()
                if stop.is_set():
                    return report is not None and not report.errors
        finally:
            if not once and not self.dry_run:
                self.ports.lease.give_up()

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
