"""The Saline job manager: keeps every best-effort vjob alive across OAR's kills.

For each vjob, on every pass (`step`), what to do is decided by `saline_bew.phases.decide`
(a pure function of the vjob's record, its OAR job and the clock) and carried out here:

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
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import update

from plugins.oar.client import OarUnavailable, SubmitRequest
from plugins.oar.parse import OarJob
from provisioning import safe_dirs, transfer
from provisioning.driver import DriverError
from provisioning.transfer import sha256_file
from saline_bew import grammar, identity, journal, lease, output, phases, relocation
from saline_bew.gathering import REPOSITORY, Gathering
from saline_bew.journal import LeaseLost, SalineJob
from saline_bew.metrics import SalineMetrics
from saline_bew.repository import RepositoryError
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs, snapshot_files
from vjob import log
from vjob.config import Config
from vjob.errors import CommandError, ConfigError, InputError, StoreError, VjobError
from vjob.sdnotify import Notifier
from vjob.store import jobs as store_jobs
from vjob.store.db import Store
from vjob.store.schema import JobRecord

_log = log.get("saline")
HOLDER = Path(__file__).resolve().with_name("holder.sh")
"""Run by the OAR job as the user: it must be readable by every user (package data)."""
RUN_EVENTS = phases.SAFE_POINT_EVENTS
MAX_FAILURES = 5
"""Failures in a row (not counting OAR being unreachable) after which a vjob is failed."""
FAILURE_BACKOFF_S = 30.0
"""Wait after a first failure before trying the vjob again; doubles with each failure."""
RELOCATION = "relocation"
"""Journal entry of the path chosen on OAR's warning (migration or suspension) and its time."""
ADMISSION_TIMEOUT_S = 120.0
"""An admitted vjob whose OAR job never shows up (a later admission rule refused it, oarsub
died) is abandoned after this long: nobody asked for it any more."""
STAGE_WAIT_S = 60.0
"""An admitted vjob on a real image: longest wait, once its OAR job runs, for the holder to
send the submission directory before the first deployment (then COMMAND starts in an empty
home, with the reason journalled)."""
WORKDIR_WAIT = "waiting_for_workdir"
WORKDIR_STAGED = "workdir_staged"
WORKDIR_NOT_STAGED = "workdir_not_staged"
FINISHED = "finished"


def _vjob_command() -> str | None:
    """The `vjob` command beside this Python (else on PATH): the holder runs it on the node, as
    the user, to send the directory and print the output; the same install path is expected there."""
    found = shutil.which("vjob", path=str(Path(sys.executable).parent)) or shutil.which("vjob")
    return str(Path(found).absolute()) if found else None


VJOB_COMMAND = _vjob_command()


class Manager:
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
        if config.saline.checkpoint_signal == signal.SIGUSR1:
            raise ConfigError("saline.checkpoint_signal = 10 (SIGUSR1): reserved for ending the holder; use 12")
        self.config = config
        self.cfg = config.saline
        self.store = store
        self.sites = sites
        self.vms = vms
        self.clock = clock
        self.owner = owner or lease.new_owner()
        self.lease_s = (
            lease_s if lease_s is not None else (self.cfg.lease_s or max(120.0, 30 * self.cfg.poll_interval_s))
        )
        """How long a lease outlives its last renewal: a dead manager's vjobs wait this long."""
        self.max_failures = max_failures
        self.failure_backoff_s = failure_backoff_s
        self.refused: dict[str, str] = {}
        """Rows refused by their checks since this manager started: key → why."""
        self.failures: dict[str, int] = {}
        """Per-vjob failures (step_failed) counted by this manager since it started."""
        self._lock = threading.RLock()
        """Serialises acting on vjobs between the loop and the socket server's requests."""
        self._adoptable: dict[str, relocation.OpenRequest] = {}
        """Per vjob, during its pass: a migration request a dead manager left open. An
        evacuation this pass takes it over; otherwise it is deleted at the end of the pass."""
        self.socket: Path | None = None
        """The socket this manager's server listens on (set by saline_bew.server.Server): the
        holder is told it, to talk back as the user."""
        self._pruned_at = 0.0
        self.metrics = SalineMetrics()

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
        if not command:
            raise InputError("command: missing (vjob besteffort submit [options] -- COMMAND ...)")
        grammar.word("user", user, grammar.USER)
        grammar.command(command)
        grammar.number("vms", vm_count, 1, grammar.MAX_VMS)
        grammar.number("vcpus", vcpus, 1, grammar.MAX_VCPUS)
        grammar.number("memory", memory_mb, 1, grammar.MAX_MEMORY_MB)
        walltime = walltime or self.cfg.default_walltime
        grammar.word("walltime", walltime, grammar.WALLTIME)
        if site is not None and site not in self.sites:
            raise InputError(f"site = {grammar.short(site)}: not a configured site ({', '.join(self.sites)})")
        grammar.word("image", image, grammar.IMAGE)
        received = self.vms.receive_work(work_fd, user) if work_fd is not None else None
        try:
            with self._lock:
                chosen = site or self._choose_site(vm_count * vcpus, prefer=None)
                job = self._create(user, image, command, vm_count, vcpus, memory_mb, walltime, chosen)
                if received is not None:
                    os.replace(received, self.vms.work_path(job.key))
                    received = None
                return self._submit_oar(job, chosen)
        finally:
            if received is not None:
                received.unlink(missing_ok=True)

    def _create(
        self, user: str, image: str, command: list[str], vm_count: int, vcpus: int, memory_mb: int, walltime: str,
        site: str,
    ) -> SalineJob:  # fmt: skip
        """The vjob's record, its lease and its network identities: what submit and admit share
        (their inputs are checked by then)."""
        self.vms.image(image)
        key = f"be{uuid.uuid4().hex[:10]}"
        job = journal.create(self.store, key=key, user=user, image=image, command=command, vm_count=vm_count,
                             vcpus=vcpus, memory_mb=memory_mb, walltime=walltime, site=site)  # fmt: skip
        if not self._lease(key):  # a brand-new key: nobody else can hold it
            raise VjobError(f"best-effort vjob {key}: could not take its lease")
        identity.assign(self.store, site=site, job_key=key, vm_names=job.vm_names, mac_prefix=self.cfg.mac_prefix,
                        network=self.cfg.network)  # fmt: skip
        return job

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
        grammar.word("user", user, grammar.USER)
        grammar.command(command)
        grammar.number("vms", vm_count, 1, grammar.MAX_VMS)
        walltime = walltime or self.cfg.default_walltime
        grammar.word("walltime", walltime, grammar.WALLTIME)
        grammar.word("image", image, grammar.IMAGE)
        if site not in self.sites:
            raise InputError(f"site = {grammar.short(site)}: not a configured site ({', '.join(self.sites)})")
        with self._lock:
            job = self._create(user, image, command, vm_count, 1, 128, walltime, site)
            key = job.key
            job = self._record(key, phases.ADMITTED, {"site": site, "by": "oar admission rule"})
            _log.info("vjob admitted by OAR's admission rule", jobs=[key], site=site, user=user)
            return job, self._request(job, self._site(site), stage=True)

    def _adopt(self, job: SalineJob, since: float) -> None:
        """Take the OAR job the admission rule named after the vjob (same user: another
        user's job of that name is never taken); abandon the vjob if none shows up in time."""
        found = [oj for oj in self._site(job.site).client.jobs() if oj.name == job.key and oj.user == job.user]
        if found:
            oj = max(found, key=lambda j: int(j.id))
            self._record(job.key, "adopted", {"site": job.site}, oar_job_id=oj.id, error="")
            _log.info("vjob adopted its OAR job", jobs=[job.key], oar_job=oj.id)
        elif self.clock() - since > ADMISSION_TIMEOUT_S:
            self._record(
                job.key,
                "admission_abandoned",
                {"waited_s": round(self.clock() - since, 1)},
                phase="cancelled",
                hosts=[],
            )
            _log.warning("admitted vjob never got its OAR job: abandoned", jobs=[job.key])

    def _request(self, job: SalineJob, site: Site, *, stage: bool = False) -> SubmitRequest:
        """The holder's OAR job. Told the `vjob` command and this socket, the holder prints the
        vjob's output into OAR's output files when released; with `stage` (the admission
        rule's job, which runs in the submission directory) it first sends that directory."""
        command = ["/bin/sh", str(HOLDER), job.key]
        tail = [VJOB_COMMAND or "", str(self.socket or "")]
        if all(grammar.PLAIN_PATH.fullmatch(word) for word in tail):
            command += [*tail, "stage" if stage else "hold"]
        return SubmitRequest(
            command=command,
            resource=f"/resource_id={job.vm_count * job.vcpus}",
            walltime=job.walltime,
            name=job.key,
            types=("besteffort",),
            properties=site.properties,
            checkpoint_s=self.cfg.checkpoint_delay_s,
            signal=self.cfg.checkpoint_signal,
        )

    def _submit_oar(self, job: SalineJob, site_name: str) -> SalineJob:
        site = self._site(site_name)
        try:
            oar_id = site.client.submit(self._request(job, site), user=job.user)
        except CommandError as exc:
            self._record(
                job.key,
                "submit_failed",
                {"site": site_name, "error": str(exc)},
                site=site_name,
                oar_job_id=None,
                phase="submitted",
                error=str(exc),
            )
            raise
        _log.info("vjob submitted", jobs=[job.key], site=site_name, oar_job=oar_id)
        return self._record(
            job.key,
            "submitted",
            {"site": site_name},
            site=site_name,
            oar_job_id=oar_id,
            phase="submitted",
            hosts=[],
            error="",
        )

    def _site(self, name: str) -> Site:
        try:
            return self.sites[name]
        except KeyError:
            raise VjobError(
                f"site {name!r} is not configured any more (saline.sites: {', '.join(self.sites)})"
            ) from None

    def _choose_site(self, need: int, *, prefer: str | None) -> str:
        """`prefer` when it has room, else the first site with room, else `prefer` (to wait)."""
        order = ([prefer] if prefer else []) + [s for s in self.sites if s != prefer]
        for name in order:
            try:
                if self.sites[name].free_cores() >= need:
                    return name
            except VjobError as exc:
                _log.warning("site unreachable", site=name, error=str(exc))
        return prefer or order[0]

    # -- the loop ------------------------------------------------------------------------
    def run(self, *, stop: Callable[[], bool] = lambda: False) -> None:
        """Pass after pass until `stop()`. Without its journal the manager does nothing: an
        unreachable store is logged and retried, never worked around. On the way out the
        leases are given back, so another site master takes the vjobs over at once."""
        notify = Notifier()  # systemd's watchdog (Type=notify unit): pinged after every pass
        try:
            while not stop():
                try:
                    self.step()
                except StoreError as exc:
                    _log.error("state store unreachable: no action this pass", error=str(exc))
                notify.watchdog()
                deadline = time.monotonic() + self.cfg.poll_interval_s
                while not stop() and time.monotonic() < deadline:
                    time.sleep(min(0.2, self.cfg.poll_interval_s))
        finally:
            try:
                lease.release_all(self.store, self.owner)
            except StoreError as exc:
                _log.warning("leases not released (they expire)", error=str(exc))

    def step(self) -> None:
        """One pass over every active vjob this manager holds (or can take) the lease of."""
        jobs, refused = journal.scan(self.store, active_only=True)
        self._refuse(refused)
        phases_seen: dict[str, int] = {}
        for job in jobs:
            phases_seen[job.phase] = phases_seen.get(job.phase, 0) + 1
            self.process(job.key)
        self._cleanup_ended()
        if self.clock() - self._pruned_at > 600:
            self._pruned_at = self.clock()
            output.prune(self.output_dir, active={j.key for j in jobs})
        self.metrics.set_phases(phases_seen)
        self.metrics.refused.set(len(self.refused))
        self.metrics.last_pass.set(self.clock())

    def _refuse(self, refused: list[journal.Refused]) -> None:
        """Rows that fail their checks are never acted on; each is logged once per process."""
        for key, reason in refused:
            if key not in self.refused:
                _log.error("vjob row refused: not acted on", jobs=[key], error=reason)
            self.refused[key] = reason

    def _lease(self, key: str) -> bool:
        return lease.acquire(self.store, key, self.owner, now=self.clock(), ttl_s=self.lease_s)

    def _record(self, key: str, kind: str, detail: dict[str, object] | None = None, **changes: object) -> SalineJob:
        """journal.record, only while this manager holds the vjob's lease (else LeaseLost)."""
        return journal.record(self.store, key, kind, detail, owner=self.owner, **changes)

    def process(self, key: str) -> None:
        """Observe, decide and act for one vjob, if its lease is ours.

        A failure of this vjob never stops the pass: OAR or a node's libvirt unreachable
        (`unavailable`) is journalled and retried next pass, as they come back by themselves,
        without counting against the vjob; anything else (a
        garbled OAR answer, a refusal, an unknown user, a bug) is journalled as
        `step_failed`, retried after a doubling wait, and after `max_failures` in a row the
        vjob is marked failed with the reason. Only an unreachable store ends the pass.
        """
        with self._lock:
            if not self._lease(key):
                return
            try:
                job = journal.get(self.store, key)  # fresh: another master may have acted before
            except InputError as exc:
                self._refuse([(key[:80], str(exc))])
                return
            if not job.active:
                return
            events = journal.events(self.store, key)
            failures, not_before = phases.backoff(events, base_s=self.failure_backoff_s)
            if self.clock() < not_before and not phases.cancel_requested(events):
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
                if str(exc) != journal.get(self.store, key).error:
                    self._record(key, "error", {"error": str(exc)}, error=str(exc))
            finally:
                not_taken = self._adoptable.pop(key, None)
                if not_taken is not None:  # its vjob's own OAR job may be a new one by now
                    self._settle_request(journal.get(self.store, key), not_taken)

    def _step_failed(self, job: SalineJob, exc: Exception, failures: int) -> None:
        self.metrics.step_failures.inc()
        reason = str(exc) if isinstance(exc, VjobError) else f"{type(exc).__name__}: {exc}"
        reason = reason[:1000]
        self.failures[job.key] = self.failures.get(job.key, 0) + 1
        if failures >= self.max_failures:
            _log.error("vjob failed", jobs=[job.key], failures=failures, error=reason)
            for vm, node in zip(job.vm_names, job.hosts, strict=False):
                with contextlib.suppress(Exception):  # best effort: OAR takes the node back anyway
                    self.vms.stop(vm, node)
            with contextlib.suppress(Exception):
                if job.hosts:
                    self.vms.network_down(self._subnet(job), list(job.hosts))
            self._record(
                job.key,
                "failed",
                {"error": reason, "failures": failures},
                phase="failed",
                hosts=[],
                error=f"failed {failures} times in a row: {reason}",
            )
            return
        _log.error("vjob step failed: retried later", jobs=[job.key], failures=failures, error=reason)
        self._record(job.key, phases.STEP_FAILED, {"error": reason, "failures": failures}, error=reason)

    def _observe(self, job: SalineJob, events: list[journal.Event]) -> phases.Observed:
        cancel = phases.cancel_requested(events)
        oj = None
        finished = False
        if phases.needs_oar(job, cancel):
            oj = self._site(job.site).client.job(job.oar_job_id or "", user=job.user)
            if job.phase == "running" and oj is not None and not oj.killed_for_besteffort:
                finished = self._finished(job)
        return phases.Observed(
            oar_job=oj,
            vms_finished=finished,
            last_safe_point=phases.last_at(events, phases.SAFE_POINT_EVENTS, job.updated_at),
            last_deploy=phases.last_at(events, phases.DEPLOY_EVENTS, job.created_at),
            cancel_requested=cancel,
            admitted_at=phases.admitted_at(events),
        )

    def _advance(self, job: SalineJob, events: list[journal.Event]) -> None:
        seen = self._observe(job, events)
        self._act(job, seen, phases.decide(job, seen, now=self.clock(), timing=self.cfg))

    def _act(self, job: SalineJob, seen: phases.Observed, action: phases.Action) -> None:
        """Carry out what `phases.decide` chose."""
        kind = action.kind
        if kind is phases.Kind.WAIT:
            return
        if kind is phases.Kind.CANCEL:
            self.cancel(job.key)
        elif kind is phases.Kind.RESUBMIT:
            self._resubmit(job)
        elif kind is phases.Kind.ADOPT:
            self._adopt(job, seen.admitted_at or self.clock())
        elif kind is phases.Kind.FORGET_OAR_JOB:
            self._record(job.key, "oar_job_vanished", {"oar_job_id": job.oar_job_id}, oar_job_id=None)
        elif kind is phases.Kind.KILLED:
            if job.phase == "running":
                self._free_nodes(job)  # its QEMU is outside the job's cpuset: free the node
            self._count_kill(job, cause=action.cause, lost_s=action.lost_s)
        elif kind is phases.Kind.COMPLETE:
            self._complete(job)
        elif kind is phases.Kind.CANCELLED_IN_OAR:
            self._free_nodes(job)
            oj = seen.oar_job
            types = sorted({e.type for e in oj.events}) if oj else []
            self._record(
                job.key,
                "cancelled",
                {"oar_state": oj.state if oj else None, "events": types},
                phase="cancelled",
                hosts=[],
            )
            _log.info("vjob cancelled (its OAR job was deleted)", jobs=[job.key])
        elif kind is phases.Kind.DEPLOY and seen.oar_job is not None:
            if not self._awaiting_workdir(job, seen.oar_job.hosts[0]):
                self._deploy(job, seen.oar_job)
        elif kind is phases.Kind.MOVE:
            self._maybe_move(job)
        elif kind is phases.Kind.EVACUATE:
            self._evacuate(job, action.event_id or 0, action.warned_at or self.clock())
        elif kind is phases.Kind.SNAPSHOT:
            self.snapshot(job, reason="periodic")

    def _ended(self, job: SalineJob, oj: OarJob | None) -> None:
        """Act on the end of the vjob's OAR job `oj` (None: OAR forgot it)."""
        events = journal.events(self.store, job.key)
        finished = job.phase == "running" and self._finished(job)
        seen = phases.Observed(
            oar_job=oj,
            vms_finished=finished,
            last_deploy=phases.last_at(events, phases.DEPLOY_EVENTS, job.created_at),
        )
        self._act(job, seen, phases.decide(job, seen, now=self.clock(), timing=self.cfg))

    def _finished(self, job: SalineJob) -> bool:
        """COMMAND ended: every tiny guest powered off after its payload; on a real image the
        first VM, which runs COMMAND (the others only serve it, as a multi-node job's do)."""
        members = list(zip(job.vm_names, job.hosts, strict=True))
        if members and self._real(job, job.hosts[0]):
            members = members[:1]
        return all(self.vms.finished(vm, node) for vm, node in members)

    def _real(self, job: SalineJob, node: str) -> bool:
        """The vjob's image boots its own kernel (a job disk per VM, part of each snapshot)."""
        return self.vms.real(job.image, node) is not None

    # -- deploy ---------------------------------------------------------------------------
    def _deploy(self, job: SalineJob, oj: OarJob) -> None:
        placement = [oj.hosts[i % len(oj.hosts)] for i in range(job.vm_count)]
        seen = max((e.event_id for e in oj.events), default=job.last_event_id)
        ids = self._identities(job)  # the same at every deployment: the vjob keeps its addresses
        self.vms.network_up(ids[job.vm_names[0]].subnet_id, placement)
        if job.snapshot_label and job.snapshot_site:
            repo = self._site(job.snapshot_site).repository
            members = list(zip(job.vm_names, placement, strict=True))
            back = self.vms.restore(members, job.snapshot_label, repo.label_dir(job.key, job.snapshot_label), repo.host,
                                    with_job_disk=self._real(job, placement[0]))  # fmt: skip
            store_jobs.record_resume(self.store, journal.RMS, job.key)
            detail: dict[str, object] = {"label": job.snapshot_label, "from_site": job.snapshot_site}
            detail["hosts"] = placement
            detail["restore_to_running_s"] = round(back.restore_to_running_s, 3)
            warned_at = _suspended_at(journal.events(self.store, job.key))
            if warned_at is not None:  # suspended on OAR's warning: the suspend/resume path ends here
                detail["since_warning_s"] = round(self.clock() - warned_at, 3)
                self.metrics.relocation_seconds.labels(path=relocation.Path.SUSPEND).observe(self.clock() - warned_at)
            self._record(
                job.key,
                "resumed",
                detail,
                phase="running",
                hosts=placement,
                last_event_id=seen,
                error="",
            )
            _log.info("vjob resumed", jobs=[job.key], site=job.site, hosts=placement, label=job.snapshot_label)
            return
        image = self.vms.image(job.image)
        for vm, node in zip(job.vm_names, placement, strict=True):
            self.vms.stop(vm, node)  # whatever a killed run left there
        local = self.vms.real(job.image, placement[0])
        if local is not None:  # the image's own kernel: the guest agent runs COMMAND on the first VM
            specs = self.vms.real_specs(local, list(job.command), [ids[vm] for vm in job.vm_names], placement,
                                        user=job.user, memory_mib=job.memory_mb, vcpus=job.vcpus,
                                        work=self.vms.work_path(job.key))  # fmt: skip
        else:
            specs = [
                self.vms.spec(vm, image, list(job.command), ids[vm], job.memory_mb, job.vcpus) for vm in job.vm_names
            ]
        for spec, node in zip(specs, placement, strict=True):
            self.vms.boot_fresh(spec, node, job_id=job.job_id)
        if job.kills:
            store_jobs.record_resume(self.store, journal.RMS, job.key)
        if job.kills and self._ever_ran(job):  # killed before a first snapshot: its work is gone
            self._record(
                job.key,
                "restarted_from_scratch",
                {"hosts": placement, "kills": job.kills},
                phase="running",
                hosts=placement,
                last_event_id=seen,
                restarts_from_scratch=job.restarts_from_scratch + 1,
                error="",
            )
            _log.warning("vjob restarted from scratch (killed before its first snapshot)", jobs=[job.key])
        else:
            self._record(
                job.key,
                "deployed",
                {"hosts": placement},
                phase="running",
                hosts=placement,
                last_event_id=seen,
                error="",
            )
            _log.info("vjob deployed", jobs=[job.key], site=job.site, hosts=placement)

    # -- snapshots ------------------------------------------------------------------------
    def snapshot(self, job: SalineJob, *, reason: str, suspend: bool = False) -> bool:
        """Snapshot every VM into the site's repository; True when it is safe there.

        With `suspend` the VMs are saved and not resumed (OAR's checkpoint signal). On any
        repository problem the previous safe snapshot stays the one to resume from.
        """
        label = f"s{int(self.clock() * 1000)}"
        taken_at = self.clock()
        began = time.monotonic()
        members = list(zip(job.vm_names, job.hosts, strict=True))
        real = self._real(job, job.hosts[0])
        at_cut: list[int] = []  # the first VM's output logs at the cut: what this snapshot covers
        self.vms.checkpoint(members, label, job_id=job.job_id, keep_running=not suspend, with_job_disk=real,
                            at_cut=lambda: at_cut.extend(self._log_sizes(job)))  # one cut  # fmt: skip
        holdings: dict[str, tuple[str, ...]] = {}
        for vm, node in members:
            holdings[node] = (*holdings.get(node, ()), vm)
        expected: dict[str, tuple[int, str]] = {}
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            for name in snapshot_files(vm, label, with_job_disk=real):
                path = self.vms.stage_dir(node) / name
                expected[name] = (path.stat().st_size, sha256_file(path))
        repo = self._site(job.site).repository
        started = time.monotonic()
        try:
            repo.check(sum(size for size, _ in expected.values()))
            Gathering(self._copier(job, label, with_job_disk=real)).run(holdings)
            repo.verify(job.key, label, expected)
        except (RepositoryError, OSError) as exc:
            try:
                repo.remove_label(job.key, label)
            except RepositoryError as gone:  # an unreachable repository keeps the half copy; never resumed from
                _log.warning("half snapshot not removed", jobs=[job.key], label=label, error=str(gone))
            for vm in job.vm_names:
                for n in set(job.hosts):
                    self.vms.drop_staged(vm, n, label)
            message = str(exc) if isinstance(exc, RepositoryError) else f"repository copy failed: {exc}"
            self._record(
                job.key,
                "snapshot_failed",
                {"label": label, "reason": reason, "error": message},
                error=message,
            )
            _log.error("snapshot not safe", jobs=[job.key], error=message)
            self.metrics.snapshot_failures.inc()
            return False
        for vm in job.vm_names:
            for n in set(job.hosts):
                self.vms.drop_staged(vm, n, label)
        previous = (job.snapshot_label, job.snapshot_site)
        self._record(
            job.key,
            "snapshot",
            {
                "label": label,
                "reason": reason,
                "bytes": sum(s for s, _ in expected.values()),
                "gather_s": round(time.monotonic() - started, 3),
                "took_s": round(time.monotonic() - began, 3),
                **self._commit_output(job, at_cut),
            },
            snapshot_label=label,
            snapshot_site=job.site,
            snapshot_at=taken_at,
            error="",
        )
        self.metrics.snapshots.inc()
        if previous[0] and previous[1] in self.sites:
            self.sites[previous[1]].repository.remove_label(job.key, previous[0])
        return True

    def _copier(self, job: SalineJob, label: str, *, with_job_disk: bool) -> Callable[[str, str, str], None]:
        repo = self._site(job.site).repository
        vms = self.vms

        def copy(vm: str, source: str, destination: str) -> None:
            for name in snapshot_files(vm, label, with_job_disk=with_job_disk):
                src = vms.stage_dir(source) / name
                if destination == REPOSITORY:
                    repo.put(src, job.key, label)
                    src.unlink(missing_ok=True)
                    continue
                dest = vms.stage_dir(destination) / name  # relay to a peer, which sends it on later
                if dest != src:  # nodes sharing one snapshot dir have nothing to relay
                    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    _copy_file(src, dest)
                    src.unlink(missing_ok=True)

        return copy

    def _evacuate(self, job: SalineJob, event_id: int, warned_at: float) -> None:
        """OAR asked for a checkpoint: live-migrate the VMs to resources OAR gives at once (same
        site, then another: the paper's order, `saline_bew.relocation`); when none come in
        time, suspend the VMs into the repository and free the nodes."""
        plan, extra = self._relocate(job, event_id, warned_at)
        if plan is None:
            return  # migrated: the vjob runs on elsewhere, nothing was written to the repository
        job = journal.get(self.store, job.key)  # a failed try may have moved some VMs already
        safe = self.snapshot(job, reason="checkpoint", suspend=True)
        job = journal.get(self.store, job.key)
        self._free_nodes(job)
        for site_name, oar_id in [(job.site, job.oar_job_id or ""), *extra]:
            try:
                self._site(site_name).client.delete(oar_id, user=job.user)
            except CommandError as exc:  # the job may already be gone: OAR's kill follows anyway
                _log.warning("oardel after checkpoint failed", jobs=[job.key], oar_job=oar_id, error=str(exc))
        freed_s = self.clock() - warned_at
        self._record(
            job.key,
            RELOCATION,
            {
                "path": str(relocation.Path.SUSPEND),
                "reason": plan.reason,
                "warned_at": warned_at,
                "freed_s": round(freed_s, 2),
            },
        )
        self.metrics.relocations.labels(path=relocation.Path.SUSPEND).inc()
        lost = 0.0 if safe else self.clock() - (job.snapshot_at or job.created_at)
        self._count_kill(job, cause="checkpoint", lost_s=lost, event_id=event_id)

    def _relocate(
        self, job: SalineJob, event_id: int, warned_at: float
    ) -> tuple[relocation.Plan | None, list[tuple[str, str]]]:
        """Try the live migrations `relocation.plan` chooses. (None, []) once the vjob runs on
        elsewhere; else the plan (its reason is journalled) and the OAR jobs a failed try left
        holding VMs, which the suspension must give back too."""
        need = job.vm_count * job.vcpus
        possible = self.vms.can_migrate()
        events = journal.events(self.store, job.key)
        suspend_s = _last_detail(
            events, "snapshot", "took_s", default=relocation.suspend_estimate_s(job.memory_mb, job.vm_count)
        )
        migrate_s = relocation.migrate_estimate_s(
            job.memory_mb, job.vm_count, _last_detail(events, "migrated", "mb_per_s", default=0.0)
        )
        left_open = self._adoptable.pop(job.key, None)
        if left_open is not None:
            done, extra = self._take_over_request(job, left_open, event_id, warned_at, suspend_s, migrate_s)
            if done:
                return None, []
            if extra:
                return relocation.Plan((), 0.0, "the migration taken over left VMs in two OAR jobs"), extra
            job = journal.get(self.store, job.key)
        free: dict[str, int | None] = {}
        for name, site in self.sites.items() if possible and self.cfg.migrate_wait_s > 0 else ():
            try:  # asked only when a migration could follow: every second counts before OAR's kill
                free[name] = site.free_cores()
            except VjobError as exc:
                free[name] = None
                _log.warning("site unreachable", site=name, error=str(exc))
        plan = relocation.plan(
            need=need,
            site=job.site,
            free=free,
            time_left_s=warned_at + self.cfg.checkpoint_delay_s - self.clock(),
            suspend_s=suspend_s,
            migrate_s=migrate_s,
            wait_s=self.cfg.migrate_wait_s,
            migration_possible=possible,
        )
        extra: list[tuple[str, str]] = []
        end = time.monotonic() + plan.wait_s
        for i, target in enumerate(plan.targets):
            left_s = end - time.monotonic()
            if left_s <= 0:
                break
            # Each try gets its share of what is left: the own site's free cores may be the very
            # ones the job that caused the warning waits for, and OAR then never starts ours there.
            until = time.monotonic() + left_s / (len(plan.targets) - i)
            done, left = self._migrate_to(job, target, until, event_id, warned_at)
            if done:
                return None, []
            extra += left
            job = journal.get(self.store, job.key)
            if extra:
                break  # VMs are split between two OAR jobs: suspend them where they are
        return plan, extra

    def _take_over_request(
        self,
        job: SalineJob,
        req: relocation.OpenRequest,
        event_id: int,
        warned_at: float,
        suspend_s: float,
        migrate_s: float,
    ) -> tuple[bool, list[tuple[str, str]]]:
        """Finish the migration a dead manager started: its OAR job is asked for already (and
        may run by now), so waiting for it is quicker than asking again. Deleted instead when
        its id is unknown, its site is gone, or no try fits before OAR's kill."""
        budget = relocation.wait_budget(
            time_left_s=warned_at + self.cfg.checkpoint_delay_s - self.clock(),
            suspend_s=suspend_s,
            migrate_s=migrate_s,
            wait_s=self.cfg.migrate_wait_s,
        )
        if req.oar_job_id is None or req.site not in self.sites or not self.vms.can_migrate() or budget <= 0:
            self._settle_request(job, req)
            return False, []
        path = relocation.Path.SAME_SITE if req.site == job.site else relocation.Path.OTHER_SITE
        self._record(job.key, "migration_taken_over", {"site": req.site, "oar_job_id": req.oar_job_id})
        _log.info("vjob: taking over the migration a previous manager left", jobs=[job.key], oar_job=req.oar_job_id)
        target = relocation.Target(req.site, path)
        return self._migrate_to(job, target, time.monotonic() + budget, event_id, warned_at, existing=req.oar_job_id)

    def _settle_request(self, job: SalineJob, req: relocation.OpenRequest) -> None:
        """Delete the OAR job of a migration request no manager finished (else it would hold its
        nodes until its walltime), and close the request in the journal. OAR unreachable: the
        request stays open and the next pass tries again."""
        try:
            deleted = self._delete_request_job(job, req)
            self._record(job.key, "migration_abandoned", {"site": req.site, "oar_job_id": req.oar_job_id,
                                                          "deleted": deleted})  # fmt: skip
            _log.warning("vjob: deleted the OAR job of a migration a previous manager left", jobs=[job.key],
                         site=req.site, oar_jobs=deleted)  # fmt: skip
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried next pass: the request stays open
            _log.warning("left-over migration job not deleted yet", jobs=[job.key], error=str(exc)[:300])

    def _delete_request_job(self, job: SalineJob, req: relocation.OpenRequest) -> list[str]:
        """oardel the request's job, or, its id never journalled, every live job of the vjob's
        name and user at that site other than the vjob's own. The ids deleted."""
        site = self.sites.get(req.site)
        if site is None:
            return []
        if req.oar_job_id is not None:
            found = site.client.job(req.oar_job_id, user=job.user)
            candidates = [found] if found is not None else []
        else:
            candidates = [oj for oj in site.client.jobs() if oj.name == job.key and oj.user == job.user]
        doomed = [oj.id for oj in candidates if not oj.finished and oj.id != job.oar_job_id]
        for oar_id in doomed:
            try:
                site.client.delete(oar_id, user=job.user)
            except OarUnavailable:
                raise
            except CommandError as exc:  # ended meanwhile
                _log.warning("oardel failed", jobs=[job.key], oar_job=oar_id, error=str(exc))
        return doomed

    def _migrate_to(
        self,
        job: SalineJob,
        target: relocation.Target,
        until: float,
        event_id: int,
        warned_at: float,
        *,
        existing: str | None = None,
    ) -> tuple[bool, list[tuple[str, str]]]:
        """Ask `target`'s OAR for the vjob's resources (or take `existing`, asked for by a
        previous manager) and move the VMs there live once it starts the job. (True, []) when
        every VM runs there and the warned job is given back; (False, OAR jobs still holding
        some VMs) otherwise, the new job deleted if it holds none.

        The request is journalled before oarsub and again with the job's id before the wait
        (`relocation.ASKING`, `relocation.REQUESTED`): a manager that dies in between leaves an
        open request that its successor deletes or takes over (`_settle_request`)."""
        site = self._site(target.site)
        new_id = existing
        if new_id is None:
            self._record(job.key, relocation.ASKING, {"site": target.site, "path": target.path})
            try:
                new_id = site.client.submit(self._request(job, site), user=job.user)
            except CommandError as exc:
                self._record(job.key, "migration_failed", {"site": target.site, "error": str(exc)[:1000]})
                return False, []
            self._record(
                job.key, relocation.REQUESTED, {"site": target.site, "path": target.path, "oar_job_id": new_id}
            )
        oj = site.client.job(new_id, user=job.user)
        while not (oj is not None and oj.state == "Running" and oj.hosts):
            if oj is None or oj.finished or time.monotonic() >= until:
                self._give_back(site, new_id, job)
                why = f"OAR did not start job {new_id} in the time left" if oj and not oj.finished else (
                    f"OAR job {new_id} ended before it ran")  # fmt: skip
                self._record(job.key, "migration_failed", {"site": target.site, "oar_job_id": new_id, "error": why})
                return False, []
            time.sleep(min(1.0, self.cfg.poll_interval_s))
            oj = site.client.job(new_id, user=job.user)
        placement = [oj.hosts[i % len(oj.hosts)] for i in range(job.vm_count)]
        hosts = list(job.hosts)
        started = time.monotonic()
        subnet = self._subnet(job)
        try:
            self.vms.network_up(subnet, [n for n in placement if n not in job.hosts])
            for i, (vm, src, dst) in enumerate(zip(job.vm_names, job.hosts, placement, strict=True)):
                if src != dst:  # other cores of the same node: the VM stays where it is
                    self.vms.migrate(vm, src, dst)
                hosts[i] = dst
        except (DriverError, VjobError) as exc:
            self.vms.network_down(subnet, [n for n in placement if n not in hosts])
            moved = hosts != list(job.hosts)
            if not moved:
                self._give_back(site, new_id, job)
            self._record(
                job.key,
                "migration_failed",
                {"site": target.site, "oar_job_id": new_id, "error": str(exc)[:1000], "hosts": hosts},
                hosts=hosts,
            )
            return False, [(target.site, new_id)] if moved else []
        migrate_s = time.monotonic() - started
        since = self.clock() - warned_at
        old_site, old_id = job.site, job.oar_job_id or ""
        self._record(
            job.key,
            "migrated",
            {
                "path": target.path,
                "from_site": old_site,
                "from_hosts": list(job.hosts),
                "hosts": placement,
                "oar_job_id": new_id,
                "migrate_s": round(migrate_s, 3),
                "mb_per_s": round(job.memory_mb * job.vm_count / migrate_s, 1) if migrate_s > 0 else 0.0,
                "since_warning_s": round(since, 3),
            },
            site=target.site,
            oar_job_id=new_id,
            hosts=placement,
            last_event_id=event_id,
            error="",
        )
        self._record(job.key, RELOCATION, {"path": target.path, "warned_at": warned_at, "running_s": round(since, 3)})
        self.metrics.relocations.labels(path=target.path).inc()
        self.metrics.relocation_seconds.labels(path=target.path).observe(since)
        self.vms.network_down(subnet, [n for n in job.hosts if n not in placement])
        self._give_back(self._site(old_site), old_id, job)
        _log.info("vjob live-migrated on OAR's warning", jobs=[job.key], to_site=target.site, hosts=placement,
                  since_warning_s=round(since, 1))  # fmt: skip
        return True, []

    def _give_back(self, site: Site, oar_id: str, job: SalineJob) -> None:
        try:
            site.client.delete(oar_id, user=job.user)
        except CommandError as exc:  # gone already, or OAR's kill follows
            _log.warning("oardel failed", jobs=[job.key], oar_job=oar_id, error=str(exc))

    # -- the vjob's network ----------------------------------------------------------------
    def _identities(self, job: SalineJob) -> dict[str, identity.NetworkIdentity]:
        """The VMs' network identities: allocated at the first deployment, the same afterwards."""
        got = identity.assign(self.store, site=job.site, job_key=job.key, vm_names=job.vm_names,
                              mac_prefix=self.cfg.mac_prefix, network=self.cfg.network)  # fmt: skip
        return {i.vm_name: i for i in got}

    def _subnet(self, job: SalineJob) -> int:
        return self._identities(job)[job.vm_names[0]].subnet_id

    def _free_nodes(self, job: SalineJob) -> None:
        """Delete the vjob's VMs from its nodes and take its network off them."""
        for vm, node in zip(job.vm_names, job.hosts, strict=False):
            self.vms.stop(vm, node)
        if job.hosts:
            self.vms.network_down(self._subnet(job), list(job.hosts))

    # -- end of an OAR job ----------------------------------------------------------------
    def _ever_ran(self, job: SalineJob) -> bool:
        return any(e.kind in phases.DEPLOY_EVENTS for e in journal.events(self.store, job.key))

    def _count_kill(self, job: SalineJob, *, cause: str, lost_s: float, event_id: int | None = None) -> None:
        store_jobs.record_preemption(self.store, journal.RMS, job.key)
        changes: dict[str, object] = {"phase": "killed", "kills": job.kills + 1, "hosts": []}
        if event_id is not None:
            changes["last_event_id"] = event_id
        job = self._record(
            job.key,
            "killed",
            {"cause": cause, "lost_s": round(lost_s, 3), "snapshot": job.snapshot_label},
            **changes,
        )
        _log.warning("vjob killed by OAR", jobs=[job.key], cause=cause, lost_s=round(lost_s, 1))
        self.metrics.kills.inc()
        self.metrics.work_lost.inc(max(0.0, lost_s))
        self._resubmit(job)

    def _resubmit(self, job: SalineJob) -> None:
        self.metrics.resubmissions.inc()
        need = job.vm_count * job.vcpus
        site = self._choose_site(need, prefer=job.site)
        try:
            free = self.sites[site].free_cores()
        except VjobError:
            free = -1
        if 0 <= free < need:  # (-1: OAR unreachable, which the submission below reports)
            self._record(job.key, "waiting_for_resources", {"site": site, "need": need})
        self._submit_oar(job, site)

    def _maybe_move(self, job: SalineJob) -> None:
        """Still waiting at its site: go to another site that has room now."""
        need = job.vm_count * job.vcpus
        for name, site in self.sites.items():
            if name == job.site:
                continue
            try:
                room = site.free_cores() >= need
            except VjobError:
                continue
            if room:
                try:
                    self._site(job.site).client.delete(job.oar_job_id or "", user=job.user)
                except CommandError as exc:
                    _log.warning("oardel of the waiting job failed", jobs=[job.key], error=str(exc))
                moved = self._record(job.key, "moved", {"from": job.site, "to": name})
                self._submit_oar(moved, name)
                return
        self._record(job.key, "waiting_for_resources", {"site": job.site, "need": need})

    # -- the end --------------------------------------------------------------------------
    def _complete(self, job: SalineJob) -> None:
        """COMMAND ended: keep the rest of its output and its exit status, then release the OAR
        job (whose holder then prints that output into OAR's output files)."""
        detail: dict[str, object] = {"hosts": list(job.hosts), **self._commit_output(job, None)}
        detail["exit_code"] = None
        if job.hosts and self._real(job, job.hosts[0]):
            try:
                detail["exit_code"] = self.vms.exit_status(job.vm_names[0], job.hosts[0], user=job.user)
            except (VjobError, OSError) as exc:  # the vjob is over all the same; say why it is unknown
                detail["exit_error"] = str(exc)[:300]
        self._record(job.key, FINISHED, detail, phase="done")
        if job.oar_job_id:
            try:
                self._site(job.site).client.signal(job.oar_job_id, signal.SIGUSR1, user=job.user)
            except CommandError as exc:
                _log.warning("could not release the OAR job", jobs=[job.key], error=str(exc))
        _log.info("vjob finished", jobs=[job.key])

    # -- COMMAND's output and the submission directory -------------------------------------
    @property
    def output_dir(self) -> Path:
        return self.vms.driver.data_dir / "saline-output"

    def _log_sizes(self, job: SalineJob) -> list[int]:
        """Sizes of the first VM's stdout and stderr logs on its node (0: none)."""
        sizes = []
        for log_path in self.vms.output_logs(job.vm_names[0], job.hosts[0]):
            try:
                sizes.append(os.stat(log_path, follow_symlinks=False).st_size)
            except FileNotFoundError:
                sizes.append(0)
        return sizes

    def _commit_output(self, job: SalineJob, upto: list[int] | None) -> dict[str, object]:
        """Append to root's copy of the vjob's output what the first VM's logs gained since the
        last safe point of this deployment, up to `upto` (a snapshot's cut) or their end (COMMAND
        ended). The journal detail: `output_at` (the logs' offsets now covered) and
        `output_bytes` (the copy's sizes). Never fails the snapshot or the end: a problem is
        logged and said in `output_error`."""
        if not job.hosts:
            return {}
        events = journal.events(self.store, job.key)
        base, committed = [0, 0], [0, 0]
        for ev in reversed(events):
            if ev.kind in phases.DEPLOY_EVENTS:
                break
            if ev.kind == "snapshot" and _pair(ev.detail.get("output_at")):
                base = list(ev.detail["output_at"])
                break
        for ev in reversed(events):
            if _pair(ev.detail.get("output_bytes")):
                committed = list(ev.detail["output_bytes"])
                break
        try:
            where = safe_dirs.ensure_dir(self.output_dir, 0o700)
            logs = self.vms.output_logs(job.vm_names[0], job.hosts[0])
            sizes, dropped = [], False
            for i, stream in enumerate(output.STREAMS):
                end = upto[i] if upto else None
                size, cut = output.commit(logs[i], base[i], end, output.path(where, job.key, stream), committed[i])
                sizes.append(size)
                dropped = dropped or cut
        except (OSError, VjobError) as exc:
            _log.error("vjob output not kept", jobs=[job.key], error=str(exc)[:300])
            return {"output_error": str(exc)[:300]}
        detail: dict[str, object] = {"output_bytes": sizes}
        if upto:
            detail["output_at"] = list(upto)
        if dropped:
            detail["output_truncated"] = output.LIMIT_BYTES
        return detail

    def output_file(self, key: str, stream: str) -> int:
        """An open read-only descriptor of root's copy of `key`'s output (for the socket server,
        which checked the caller owns the vjob). What a safe snapshot covers while it runs,
        everything once it finished; kept `output.KEEP_S` after the end."""
        try:
            return os.open(output.path(self.output_dir, key, stream), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # nothing printed (yet)

    def stage_workdir(self, key: str, fd: int | None, *, reason: str = "") -> SalineJob:
        """The holder of an admitted vjob sends its submission directory (a job disk it built as
        the user, as `vjob besteffort submit` does), or says why it sends none (`fd` None): before
        the first deployment only; the manager stops waiting for it either way."""
        job = journal.get(self.store, key)
        kinds = [e.kind for e in journal.events(self.store, key)]
        if phases.ADMITTED not in kinds:
            raise InputError(f"best-effort vjob {key}: not submitted with oarsub (submit sent its directory)")
        if any(k in phases.DEPLOY_EVENTS for k in kinds) or not job.active:
            raise InputError(f"best-effort vjob {key}: too late, its VMs started without the directory")
        if WORKDIR_STAGED in kinds or self.vms.work_path(key).exists():
            raise InputError(f"best-effort vjob {key}: its directory was sent already")
        received = self.vms.receive_work(fd, job.user) if fd is not None else None  # outside the lock: a copy
        try:
            with self._lock:
                if not self._lease(key):
                    holder = lease.holder(self.store, key)[0]
                    raise LeaseLost(f"best-effort vjob {key}: handled by the manager {holder}; try again later")
                if any(e.kind in phases.DEPLOY_EVENTS for e in journal.events(self.store, key)):
                    raise InputError(f"best-effort vjob {key}: too late, its VMs started without the directory")
                if received is None:
                    return self._record(key, WORKDIR_NOT_STAGED, {"reason": f"the holder: {reason[:300]}"})
                size = received.stat().st_size
                os.replace(received, self.vms.work_path(key))
                received = None
                _log.info("submission directory received from the holder", jobs=[key], bytes=size)
                return self._record(key, WORKDIR_STAGED, {"bytes": size})
        finally:
            if received is not None:
                received.unlink(missing_ok=True)

    def _awaiting_workdir(self, job: SalineJob, node: str) -> bool:
        """An admitted vjob on a real image, about to deploy for the first time: wait (each pass,
        at most STAGE_WAIT_S) for its holder to send the submission directory."""
        events = journal.events(self.store, job.key)
        kinds = {e.kind for e in events}
        if phases.ADMITTED not in kinds or kinds & {*phases.DEPLOY_EVENTS, WORKDIR_STAGED, WORKDIR_NOT_STAGED}:
            return False
        if self.vms.work_path(job.key).exists() or not self._real(job, node):
            return False
        if not reaches_socket(self.vms.driver.uri(node)):
            why = f"the holder runs on {node}, another host: it cannot reach this manager's socket"
            self._record(job.key, WORKDIR_NOT_STAGED, {"reason": why})
            return False
        since = next((e.at for e in events if e.kind == WORKDIR_WAIT), None)
        if since is None:
            self._record(job.key, WORKDIR_WAIT, {"at_most_s": STAGE_WAIT_S})
            return True
        if self.clock() - since < STAGE_WAIT_S:
            return True
        why = f"the holder sent no directory within {STAGE_WAIT_S:.0f} s: COMMAND starts in an empty home"
        self._record(job.key, WORKDIR_NOT_STAGED, {"reason": why})
        _log.warning("deploying without the submission directory", jobs=[job.key], reason=why)
        return False

    def request_cancel(self, key: str, *, by: str) -> SalineJob:
        """Cancel `key` for a user (the socket server checked that they may): journalled as a
        request that whichever master holds the vjob's lease carries out; done here at once
        when this master can take the lease."""
        job = journal.get(self.store, key)
        if not job.active:
            return job  # already ended: cancelling again changes nothing
        if not phases.cancel_requested(journal.events(self.store, key)):
            journal.record(self.store, key, phases.CANCEL_REQUESTED, {"by": by})
        self.process(key)
        return journal.get(self.store, key)

    def cancel(self, key: str) -> SalineJob:
        """End `key` now: delete its OAR job, its VMs; the next pass cleans the rest."""
        with self._lock:
            if not self._lease(key):
                holder = lease.holder(self.store, key)[0]
                raise LeaseLost(f"best-effort vjob {key}: handled by the manager {holder}; try again later")
            job = journal.get(self.store, key)
            if not job.active:
                return job  # already ended: cancelling again changes nothing
            if job.oar_job_id:
                self._site(job.site).client.delete(job.oar_job_id, user=job.user)
            try:
                self._free_nodes(job)
            except (StoreError, LeaseLost):
                raise
            except Exception as exc:  # noqa: BLE001 - the OAR job is gone: the cancel must be recorded
                # A node's libvirt is unreachable: the vjob is cancelled all the same and keeps
                # its hosts, so the cleanup pass removes the VMs once the node answers.
                _log.warning("vjob cancelled; its VMs are left to the cleanup pass", jobs=[key], error=str(exc)[:300])
                return self._record(key, "cancelled", {"by": "vjob besteffort cancel", "vms_left": str(exc)[:300]},
                                    phase="cancelled")  # fmt: skip
            return self._record(key, "cancelled", {"by": "vjob besteffort cancel"}, phase="cancelled", hosts=[])

    def _cleanup_ended(self) -> None:
        jobs, refused = journal.scan(self.store, cleanup=True)
        self._refuse(refused)
        for job in jobs:
            with self._lock:
                if not self._lease(job.key):
                    continue
                try:
                    self._clean(job)
                except (StoreError, LeaseLost):
                    raise
                except Exception as exc:  # noqa: BLE001 - one vjob's cleanup must not stop the others
                    _log.error("vjob cleanup failed: retried next pass", jobs=[job.key], error=str(exc)[:1000])

    def _clean(self, job: SalineJob) -> None:
        left_open = relocation.open_request(journal.events(self.store, job.key))
        if left_open is not None:  # ended while a dead manager's migration job was pending
            deleted = self._delete_request_job(job, left_open)
            self._record(job.key, "migration_abandoned", {"site": left_open.site, "oar_job_id": left_open.oar_job_id,
                                                          "deleted": deleted})  # fmt: skip
        self._free_nodes(job)
        keep = job.phase == "failed"  # a failed vjob's snapshot is kept for the operator
        if not keep:
            for site in self.sites.values():
                site.repository.remove_job(job.key)
        identity.release(self.store, job.key)
        self.vms.work_path(job.key).unlink(missing_ok=True)  # the submitter's files, once the vjob is over
        store_jobs_terminate(self.store, job.key)
        self._record(job.key, "cleaned", {"snapshots_removed": not keep})
        lease.release(self.store, job.key, self.owner)


def unavailable(exc: BaseException) -> bool:
    """A failure of the infrastructure rather than of the vjob: OAR unreachable (or timing out,
    or answering 5xx), or no connection to a node's libvirt (the driver's connection errors name
    no VM). Such failures mend by themselves; they are retried every pass, never counted."""
    if isinstance(exc, OarUnavailable):
        return True
    return isinstance(exc, DriverError) and exc.vm == "-"


def store_jobs_terminate(store: Store, key: str) -> None:
    with store.session() as s:
        s.execute(
            update(JobRecord)
            .where(JobRecord.rms == journal.RMS, JobRecord.rms_job_id == key)
            .values(vjob_state="terminated", preempted_since=None, updated_at=time.time())
        )


def _copy_file(src: Path, dest: Path) -> None:
    transfer.copy(transfer.Endpoint(src), transfer.Endpoint(dest), method="local")


def reaches_socket(uri: str) -> bool:
    """Whether a process on the node of libvirt `uri` can use this host's Unix socket (and pass
    descriptors over it): only on this very host. The holder runs on the job's first node."""
    host = urlsplit(uri).hostname
    return host in (None, "", "localhost", "127.0.0.1", socket.gethostname())


def _pair(value: object) -> bool:
    """Two non-negative byte counts (stdout, stderr), as the journal keeps output offsets."""
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value)


def _last_detail(events: list[journal.Event], kind: str, field: str, *, default: float) -> float:
    """The newest journalled `field` of a `kind` entry (a measured duration or speed)."""
    for ev in reversed(events):
        value = ev.detail.get(field) if ev.kind == kind else None
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return default


def _suspended_at(events: list[journal.Event]) -> float | None:
    """When OAR warned the vjob that was suspended on that warning and not resumed since."""
    for ev in reversed(events):
        if ev.kind in phases.DEPLOY_EVENTS:
            return None
        if ev.kind == RELOCATION and ev.detail.get("path") == relocation.Path.SUSPEND:
            at = ev.detail.get("warned_at")
            return float(at) if isinstance(at, int | float) else None
    return None
