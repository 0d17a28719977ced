"""The Saline job manager: keeps every best-effort vjob alive across OAR's kills.

For each vjob, on every pass (`step`), what to do is decided by `saline_bew.phases.decide`
(a pure function of the vjob's record, its OAR job and the clock) and carried out by the
step modules, which take the manager's `Ports` (saline_bew.ports), never the manager:
asking OAR (saline_bew.submission), the VMs' start and end (deployment), snapshots
(snapshots, output), OAR's warning (evacuation, on relocation's plan), the submission
directory of an oarsub vjob (staging), an ended vjob's remains (cleanup). What they journal
is one enum (saline_bew.events):

* submitted → when its OAR job runs, deploy the VMs on the nodes OAR chose: from the latest
  safe snapshot when there is one (a resume, possibly at another site), else from the image
  (a first start, or a restart from scratch when it was killed before its first snapshot,
  counted); a job left waiting too long moves to a site with free resources;
* running → snapshot the VMs every `snapshot_period_s` into the site's repository (gathered
  with the paper's ordering, section 3.1.2); on OAR's checkpoint signal (event CHECKPOINT)
  suspend the VMs into the repository at once, free the nodes and give the job back;
* OAR killed the job (BESTEFFORT_KILL, or WALLTIME) → destroy the VMs still on the nodes,
  count the kill and the work lost since the last snapshot, and ask again: at the same site
  if it has room, else at another one, else wait at the same site;
* the command ended in the guest (it powered off) → release the OAR job, delete the VMs,
  the snapshots and the network identities.

Every change is journalled with the row it changes (saline_bew.journal), so a manager that
is stopped and started again carries on from where its predecessor left off. A manager acts
on a vjob only while it holds the vjob's lease (saline_bew.lease), so two site masters on one
store never both act on one vjob. A failure on one vjob is journalled on that vjob and never
stops the others; a vjob that fails `max_failures` times in a row is marked failed. Rows that
fail their checks (saline_bew.grammar) are refused with a logged error and never acted on.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable

from plugins.oar.client import OarUnavailable, SubmitRequest
from plugins.oar.parse import OarJob
from provisioning.driver import DriverError
from saline_bew import (
    cleanup,
    deployment,
    evacuation,
    grammar,
    journal,
    lease,
    output,
    phases,
    relocation,
    snapshots,
    staging,
    submission,
)
from saline_bew.events import EventKind, Phase
from saline_bew.journal import LeaseLost, SalineJob
from saline_bew.ports import Ports
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from vjob import log
from vjob.config import Config
from vjob.errors import ConfigError, InputError, StoreError, VjobError
from vjob.sdnotify import Notifier
from vjob.store.db import Store

_log = log.get("saline")
MAX_FAILURES = 5
"""Failures in a row (not counting OAR being unreachable) after which a vjob is failed."""
FAILURE_BACKOFF_S = 30.0
"""Wait after a first failure before trying the vjob again; doubles with each failure."""


class Manager:
    """The passes over the vjobs: observe each, decide (saline_bew.phases), act through the
    step modules with the manager's `ports`; and the users' verbs (submit, admit, cancel)."""

    def __init__(
        self,
        config: Config,
        store: Store,
        sites: dict[str, Site],
        vms: SalineVMs,
        *,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        lease_s: float | None = None,
        max_failures: int = MAX_FAILURES,
        failure_backoff_s: float = FAILURE_BACKOFF_S,
    ) -> None:
        cfg = config.saline
        if cfg.checkpoint_signal == signal.SIGUSR1:
            raise ConfigError("saline.checkpoint_signal = 10 (SIGUSR1): reserved for ending the holder; use 12")
        self.ports = Ports(
            config=config,
            store=store,
            sites=sites,
            vms=vms,
            clock=clock,
            owner=owner or lease.new_owner(),
            lease_s=lease_s if lease_s is not None else (cfg.lease_s or max(120.0, 30 * cfg.poll_interval_s)),
        )
        self.max_failures = max_failures
        self.failure_backoff_s = failure_backoff_s
        self.refused: dict[str, str] = {}
        """Rows refused by their checks since this manager started: key → why."""
        self.failures: dict[str, int] = {}
        """Per-vjob failures (step_failed) counted by this manager since it started."""
        self._adoptable: dict[str, relocation.OpenRequest] = {}
        """Per vjob, during its pass: a migration request a dead manager left open. An
        evacuation this pass takes it over; otherwise it is deleted at the end of the pass."""
        self._pruned_at = 0.0

    # -- submission ----------------------------------------------------------------------
    def submit(
        self,
        *,
        user: str,
        image: str,
        command: list[str],
        vm_count: int = 1,
        vcpus: int = 1,
        memory_mb: int = 128,
        walltime: str | None = None,
        site: str | None = None,
        work_fd: int | None = None,
    ) -> SalineJob:
        """Record a vjob and ask OAR for it. OAR unreachable: the record stays (phase
        submitted, no OAR job) and the manager submits it later; the CommandError is raised.
        `work_fd`: the submitter's working directory as a job disk they built
        (saline_bew.workdir), copied and checked here before anything is recorded."""
        ports = self.ports
        if not command:
            raise InputError("command: missing (vjob besteffort submit [options] -- COMMAND ...)")
        grammar.word("user", user, grammar.USER)
        grammar.command(command)
        grammar.number("vms", vm_count, 1, grammar.MAX_VMS)
        grammar.number("vcpus", vcpus, 1, grammar.MAX_VCPUS)
        grammar.number("memory", memory_mb, 1, grammar.MAX_MEMORY_MB)
        walltime = walltime or ports.cfg.default_walltime
        grammar.word("walltime", walltime, grammar.WALLTIME)
        if site is not None and site not in ports.sites:
            raise InputError(f"site = {grammar.short(site)}: not a configured site ({', '.join(ports.sites)})")
        grammar.word("image", image, grammar.IMAGE)
        received = ports.vms.receive_work(work_fd, user) if work_fd is not None else None
        try:
            with ports.lock:
                chosen = site or submission.choose_site(ports, vm_count * vcpus, prefer=None)
                job = submission.create(
                    ports,
                    user,
                    image,
                    command,
                    vm_count=vm_count,
                    vcpus=vcpus,
                    memory_mb=memory_mb,
                    walltime=walltime,
                    site=chosen,
                )
                if received is not None:
                    received.replace(ports.vms.work_path(job.key))
                    received = None
                return submission.submit_oar(ports, job, chosen)
        finally:
            if received is not None:
                received.unlink(missing_ok=True)

    def admit(
        self,
        *,
        user: str,
        image: str,
        command: list[str],
        vm_count: int = 1,
        walltime: str | None = None,
        site: str,
    ) -> tuple[SalineJob, SubmitRequest]:
        """Record a vjob that OAR's admission rule is submitting right now (the user typed
        `oarsub -t besteffort -t vjob=IMAGE`), and say what that submission must become: the
        holder, named after the vjob, with Saline's checkpoint warning, at `site`. The manager
        adopts the OAR job by its name at its next pass (`phases.Kind.ADOPT`)."""
        ports = self.ports
        grammar.word("user", user, grammar.USER)
        grammar.command(command)
        grammar.number("vms", vm_count, 1, grammar.MAX_VMS)
        walltime = walltime or ports.cfg.default_walltime
        grammar.word("walltime", walltime, grammar.WALLTIME)
        grammar.word("image", image, grammar.IMAGE)
        if site not in ports.sites:
            raise InputError(f"site = {grammar.short(site)}: not a configured site ({', '.join(ports.sites)})")
        with ports.lock:
            job = submission.create(
                ports, user, image, command, vm_count=vm_count, vcpus=1, memory_mb=128, walltime=walltime, site=site
            )
            key = job.key
            job = ports.record(key, EventKind.ADMITTED, {"site": site, "by": "oar admission rule"})
            _log.info("vjob admitted by OAR's admission rule", jobs=[key], site=site, user=user)
            return job, submission.request(ports, job, ports.site(site), stage=True)

    # -- the loop ------------------------------------------------------------------------
    def run(self, *, stop: Callable[[], bool] = lambda: False) -> None:
        """Pass after pass until `stop()`. Without its journal the manager does nothing: an
        unreachable store is logged and retried, never worked around. On the way out the
        leases are given back, so another site master takes the vjobs over at once."""
        poll_s = self.ports.cfg.poll_interval_s
        notify = Notifier()  # systemd's watchdog (Type=notify unit): pinged after every pass
        try:
            while not stop():
                try:
                    self.step()
                except StoreError as exc:
                    _log.error("state store unreachable: no action this pass", error=str(exc))
                notify.watchdog()
                deadline = time.monotonic() + poll_s
                while not stop() and time.monotonic() < deadline:
                    time.sleep(min(0.2, poll_s))
        finally:
            try:
                lease.release_all(self.ports.store, self.ports.owner)
            except StoreError as exc:
                _log.warning("leases not released (they expire)", error=str(exc))

    def step(self) -> None:
        """One pass over every active vjob this manager holds (or can take) the lease of."""
        ports = self.ports
        jobs, refused = journal.scan(ports.store, active_only=True)
        self._refuse(refused)
        phases_seen: dict[str, int] = {}
        for job in jobs:
            phases_seen[job.phase] = phases_seen.get(job.phase, 0) + 1
            self.process(job.key)
        self._cleanup_ended()
        if ports.clock() - self._pruned_at > 600:
            self._pruned_at = ports.clock()
            output.prune(ports.output_dir, active={j.key for j in jobs})
        ports.metrics.set_phases(phases_seen)
        ports.metrics.refused.set(len(self.refused))
        ports.metrics.last_pass.set(ports.clock())

    def _refuse(self, refused: list[journal.Refused]) -> None:
        """Rows that fail their checks are never acted on; each is logged once per process."""
        for key, reason in refused:
            if key not in self.refused:
                _log.error("vjob row refused: not acted on", jobs=[key], error=reason)
            self.refused[key] = reason

    def process(self, key: str) -> None:
        """Observe, decide and act for one vjob, if its lease is ours.

        A failure of this vjob never stops the pass: OAR or a node's libvirt unreachable
        (`unavailable`) is journalled and retried next pass, as they come back by themselves,
        without counting against the vjob; anything else (a
        garbled OAR answer, a refusal, an unknown user, a bug) is journalled as
        `step_failed`, retried after a doubling wait, and after `max_failures` in a row the
        vjob is marked failed with the reason. Only an unreachable store ends the pass.
        """
        ports = self.ports
        with ports.lock:
            if not ports.lease(key):
                return
            try:
                job = journal.get(ports.store, key)  # fresh: another master may have acted before
            except InputError as exc:
                self._refuse([(key[:80], str(exc))])
                return
            if not job.active:
                return
            events = journal.events(ports.store, key)
            failures, not_before = phases.backoff(events, base_s=self.failure_backoff_s)
            if ports.clock() < not_before and not phases.cancel_requested(events):
                return
            left_open = relocation.open_request(events)
            if left_open is not None:
                self._adoptable[key] = left_open
            try:
                self._advance(job, events)
            except StoreError:
                raise
            except LeaseLost as exc:
                _log.warning("vjob lease lost: another manager acts on it", jobs=[key], error=str(exc))
            except Exception as exc:  # noqa: BLE001 - one vjob's failure must not stop the others
                if not unavailable(exc):
                    self._step_failed(job, exc, failures + 1)
                    return
                _log.warning("vjob step failed", jobs=[key], error=str(exc))
                if str(exc) != journal.get(ports.store, key).error:
                    ports.record(key, EventKind.ERROR, {"error": str(exc)}, error=str(exc))
            finally:
                not_taken = self._adoptable.pop(key, None)
                if not_taken is not None:  # its vjob's own OAR job may be a new one by now
                    evacuation.settle_request(ports, journal.get(ports.store, key), not_taken)

    def _step_failed(self, job: SalineJob, exc: Exception, failures: int) -> None:
        """Journal a failed pass over `job` (its `failures`-th in a row), or fail the vjob
        after `max_failures`, its VMs stopped as far as they can be."""
        ports = self.ports
        ports.metrics.step_failures.inc()
        reason = str(exc) if isinstance(exc, VjobError) else f"{type(exc).__name__}: {exc}"
        reason = reason[:1000]
        self.failures[job.key] = self.failures.get(job.key, 0) + 1
        if failures >= self.max_failures:
            _log.error("vjob failed", jobs=[job.key], failures=failures, error=reason)
            for vm, node in zip(job.vm_names, job.hosts, strict=False):
                with contextlib.suppress(Exception):  # best effort: OAR takes the node back anyway
                    ports.vms.stop(vm, node)
            with contextlib.suppress(Exception):
                if job.hosts:
                    ports.vms.network_down(ports.subnet(job), list(job.hosts))
            ports.record(
                job.key,
                EventKind.FAILED,
                {"error": reason, "failures": failures},
                phase=Phase.FAILED,
                hosts=[],
                error=f"failed {failures} times in a row: {reason}",
            )
            return
        _log.error("vjob step failed: retried later", jobs=[job.key], failures=failures, error=reason)
        ports.record(job.key, EventKind.STEP_FAILED, {"error": reason, "failures": failures}, error=reason)

    def _observe(self, job: SalineJob, events: list[journal.Event]) -> phases.Observed:
        """What the decision needs: OAR is asked only when it matters (`phases.needs_oar`)."""
        cancel = phases.cancel_requested(events)
        oj = None
        finished = False
        if phases.needs_oar(job, cancel):
            oj = self.ports.site(job.site).client.job(job.oar_job_id or "", user=job.user)
            if job.phase == Phase.RUNNING and oj is not None and not oj.killed_for_besteffort:
                finished = deployment.finished(self.ports, job)
        return phases.Observed(
            oar_job=oj,
            vms_finished=finished,
            last_safe_point=phases.last_at(events, phases.SAFE_POINT_EVENTS, job.updated_at),
            last_deploy=phases.last_at(events, phases.DEPLOY_EVENTS, job.created_at),
            cancel_requested=cancel,
            admitted_at=phases.admitted_at(events),
        )

    def _advance(self, job: SalineJob, events: list[journal.Event]) -> None:
        """Observe, decide, act: one step of one vjob."""
        seen = self._observe(job, events)
        self._act(job, seen, phases.decide(job, seen, now=self.ports.clock(), timing=self.ports.cfg))

    def _act(self, job: SalineJob, seen: phases.Observed, action: phases.Action) -> None:
        """Carry out what `phases.decide` chose."""
        ports = self.ports
        kind = action.kind
        if kind is phases.Kind.WAIT:
            return
        if kind is phases.Kind.CANCEL:
            self.cancel(job.key)
        elif kind is phases.Kind.RESUBMIT:
            submission.resubmit(ports, job)
        elif kind is phases.Kind.ADOPT:
            submission.adopt(ports, job, seen.admitted_at or ports.clock())
        elif kind is phases.Kind.FORGET_OAR_JOB:
            ports.record(job.key, EventKind.OAR_JOB_VANISHED, {"oar_job_id": job.oar_job_id}, oar_job_id=None)
        elif kind is phases.Kind.KILLED:
            if job.phase == Phase.RUNNING:
                ports.free_nodes(job)  # its QEMU is outside the job's cpuset: free the node
            submission.count_kill(ports, job, cause=action.cause, lost_s=action.lost_s)
        elif kind is phases.Kind.COMPLETE:
            deployment.complete(ports, job)
        elif kind is phases.Kind.CANCELLED_IN_OAR:
            self._cancelled_in_oar(job, seen.oar_job)
        elif kind is phases.Kind.DEPLOY and seen.oar_job is not None:
            if not staging.awaiting(ports, job, seen.oar_job.hosts[0]):
                deployment.deploy(ports, job, seen.oar_job)
        elif kind is phases.Kind.MOVE:
            submission.maybe_move(ports, job)
        elif kind is phases.Kind.EVACUATE:
            evacuation.evacuate(ports, job, action.event_id or 0, action.warned_at or ports.clock(), self._adoptable)
        elif kind is phases.Kind.SNAPSHOT:
            snapshots.snapshot(ports, job, reason="periodic")

    def _cancelled_in_oar(self, job: SalineJob, oj: OarJob | None) -> None:
        """The user deleted the vjob's OAR job (oardel): the vjob ends with it."""
        self.ports.free_nodes(job)
        types = sorted({e.type for e in oj.events}) if oj else []
        self.ports.record(
            job.key,
            EventKind.CANCELLED,
            {"oar_state": oj.state if oj else None, "events": types},
            phase=Phase.CANCELLED,
            hosts=[],
        )
        _log.info("vjob cancelled (its OAR job was deleted)", jobs=[job.key])

    def _ended(self, job: SalineJob, oj: OarJob | None) -> None:
        """Act on the end of the vjob's OAR job `oj` (None: OAR forgot it)."""
        events = journal.events(self.ports.store, job.key)
        finished = job.phase == Phase.RUNNING and deployment.finished(self.ports, job)
        seen = phases.Observed(
            oar_job=oj,
            vms_finished=finished,
            last_deploy=phases.last_at(events, phases.DEPLOY_EVENTS, job.created_at),
        )
        self._act(job, seen, phases.decide(job, seen, now=self.ports.clock(), timing=self.ports.cfg))

    # -- cancel --------------------------------------------------------------------------
    def request_cancel(self, key: str, *, by: str) -> SalineJob:
        """Cancel `key` for a user (the socket server checked that they may): journalled as a
        request that whichever master holds the vjob's lease carries out; done here at once
        when this master can take the lease."""
        store = self.ports.store
        job = journal.get(store, key)
        if not job.active:
            return job  # already ended: cancelling again changes nothing
        if not phases.cancel_requested(journal.events(store, key)):
            journal.record(store, key, EventKind.CANCEL_REQUESTED, {"by": by})
        self.process(key)
        return journal.get(store, key)

    def cancel(self, key: str) -> SalineJob:
        """End `key` now: delete its OAR job, its VMs; the next pass cleans the rest."""
        ports = self.ports
        with ports.lock:
            ports.take(key)
            job = journal.get(ports.store, key)
            if not job.active:
                return job  # already ended: cancelling again changes nothing
            if job.oar_job_id:
                ports.site(job.site).client.delete(job.oar_job_id, user=job.user)
            by = "vjob besteffort cancel"
            try:
                ports.free_nodes(job)
            except (StoreError, LeaseLost):
                raise
            except Exception as exc:  # noqa: BLE001 - the OAR job is gone: the cancel must be recorded
                # A node's libvirt is unreachable: the vjob is cancelled all the same and keeps
                # its hosts, so the cleanup pass removes the VMs once the node answers.
                _log.warning("vjob cancelled; its VMs are left to the cleanup pass", jobs=[key], error=str(exc)[:300])
                detail = {"by": by, "vms_left": str(exc)[:300]}
                return ports.record(key, EventKind.CANCELLED, detail, phase=Phase.CANCELLED)
            return ports.record(key, EventKind.CANCELLED, {"by": by}, phase=Phase.CANCELLED, hosts=[])

    # -- cleanup -------------------------------------------------------------------------
    def _cleanup_ended(self) -> None:
        """Clean every ended vjob this manager can lease (saline_bew.cleanup); one failure is
        logged and retried next pass, never stopping the others."""
        ports = self.ports
        jobs, refused = journal.scan(ports.store, cleanup=True)
        self._refuse(refused)
        for job in jobs:
            with ports.lock:
                if not ports.lease(job.key):
                    continue
                try:
                    cleanup.clean(ports, job)
                except (StoreError, LeaseLost):
                    raise
                except Exception as exc:  # noqa: BLE001 - one vjob's cleanup must not stop the others
                    _log.error("vjob cleanup failed: retried next pass", jobs=[job.key], error=str(exc)[:1000])


def unavailable(exc: BaseException) -> bool:
    """A failure of the infrastructure rather than of the vjob: OAR unreachable (or timing out,
    or answering 5xx), or no connection to a node's libvirt (the driver's connection errors name
    no VM). Such failures mend by themselves; they are retried every pass, never counted."""
    if isinstance(exc, OarUnavailable):
        return True
    return isinstance(exc, DriverError) and exc.vm == "-"
