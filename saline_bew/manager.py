"""The Saline job manager: keeps every best-effort vjob alive across OAR's kills.

For each vjob, on every pass (`step`):

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
is stopped and started again carries on from where its predecessor left off. A failure on
one vjob is journalled on that vjob and never stops the others.
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from plugins.oar.client import SubmitRequest
from plugins.oar.parse import CHECKPOINT_EVENTS, OarJob
from provisioning.transfer import sha256_file
from saline_bew import identity, journal
from saline_bew.gathering import REPOSITORY, Gathering
from saline_bew.journal import SalineJob
from saline_bew.repository import RepositoryError
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs, snapshot_files, suspend_to_stage
from vjob import log
from vjob.config import Config
from vjob.errors import CommandError, ConfigError, InputError, StoreError, VjobError
from vjob.store import jobs as store_jobs
from vjob.store.db import Store

_log = log.get("saline")
_WALLTIME = re.compile(r"^\d{1,4}(:\d{1,2}){0,2}$")
HOLDER = Path(__file__).resolve().with_name("holder.sh")
"""Run by the OAR job as the user: it must be readable by every user (package data)."""
RUN_EVENTS = ("deployed", "resumed", "restarted_from_scratch", "snapshot")


class Manager:
    def __init__(
        self,
        config: Config,
        store: Store,
        sites: dict[str, Site],
        vms: SalineVMs,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if config.saline.checkpoint_signal == signal.SIGUSR1:
            raise ConfigError("saline.checkpoint_signal = 10 (SIGUSR1): reserved for ending the holder; use 12")
        self.config = config
        self.cfg = config.saline
        self.store = store
        self.sites = sites
        self.vms = vms
        self.clock = clock

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
    ) -> SalineJob:
        """Record a vjob and ask OAR for it. OAR unreachable: the record stays (phase
        submitted, no OAR job) and the manager submits it later; the CommandError is raised."""
        if not command:
            raise InputError("command: missing (vjob besteffort submit [options] -- COMMAND ...)")
        if not 1 <= vm_count <= 254:
            raise InputError(f"vms = {vm_count}: must be between 1 and 254 (one subnet)")
        walltime = walltime or self.cfg.default_walltime
        if not _WALLTIME.match(walltime):
            raise InputError(f"walltime = {walltime!r}: must be H[:MM[:SS]]")
        if site is not None and site not in self.sites:
            raise InputError(f"site = {site!r}: not a configured site ({', '.join(self.sites)})")
        self.vms.image(image)
        chosen = site or self._choose_site(vm_count, prefer=None)
        key = f"be{uuid.uuid4().hex[:10]}"
        job = journal.create(
            self.store,
            key=key,
            user=user,
            image=image,
            command=command,
            vm_count=vm_count,
            vcpus=vcpus,
            memory_mb=memory_mb,
            walltime=walltime,
            site=chosen,
        )
        identity.assign(
            self.store,
            site=chosen,
            job_key=key,
            vm_names=job.vm_names,
            mac_prefix=self.cfg.mac_prefix,
            network=self.cfg.network,
        )
        return self._submit_oar(job, chosen)

    def _request(self, job: SalineJob, site: Site) -> SubmitRequest:
        return SubmitRequest(
            command=["/bin/sh", str(HOLDER), job.key],
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
            journal.record(
                self.store,
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
        return journal.record(
            self.store,
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
        unreachable store is logged and retried, never worked around."""
        while not stop():
            try:
                self.step()
            except StoreError as exc:
                _log.error("state store unreachable: no action this pass", error=str(exc))
            deadline = time.monotonic() + self.cfg.poll_interval_s
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.2, self.cfg.poll_interval_s))

    def step(self) -> None:
        for job in journal.all_jobs(self.store, active_only=True):
            try:
                self._advance(job)
            except VjobError as exc:
                _log.warning("vjob step failed", jobs=[job.key], error=str(exc))
                if str(exc) != journal.get(self.store, job.key).error:
                    journal.record(self.store, job.key, "error", {"error": str(exc)}, error=str(exc))
        self._cleanup_ended()

    def _advance(self, job: SalineJob) -> None:
        if job.phase == "killed" or job.oar_job_id is None:
            self._resubmit(job)
            return
        site = self._site(job.site)
        oj = site.client.job(job.oar_job_id, user=job.user)
        if job.phase == "submitted":
            if oj is None or oj.finished:
                self._ended(job, oj)
            elif oj.state == "Running" and oj.hosts:
                self._deploy(job, oj)
            elif oj.state == "Waiting" and self.clock() - job.updated_at > self.cfg.requeue_after_s:
                self._maybe_move(job)
            return
        # running
        if oj is None or oj.finished:
            self._ended(job, oj)
            return
        checkpoints = [e for e in oj.events if e.type in CHECKPOINT_EVENTS and e.event_id > job.last_event_id]
        if checkpoints:
            self._evacuate(job, max(e.event_id for e in checkpoints))
            return
        if all(self.vms.finished(vm, node) for vm, node in zip(job.vm_names, job.hosts, strict=True)):
            self._complete(job)
            return
        if self.clock() - self._last_safe_point(job) >= self.cfg.snapshot_period_s:
            self.snapshot(job, reason="periodic")

    def _last_safe_point(self, job: SalineJob) -> float:
        for ev in reversed(journal.events(self.store, job.key)):
            if ev.kind in RUN_EVENTS:
                return ev.at
        return job.updated_at

    # -- deploy ---------------------------------------------------------------------------
    def _deploy(self, job: SalineJob, oj: OarJob) -> None:
        placement = [oj.hosts[i % len(oj.hosts)] for i in range(job.vm_count)]
        seen = max((e.event_id for e in oj.events), default=job.last_event_id)
        if job.snapshot_label and job.snapshot_site:
            repo = self._site(job.snapshot_site).repository
            for vm, node in zip(job.vm_names, placement, strict=True):
                self.vms.restore(vm, node, job.snapshot_label, repo.label_dir(job.key, job.snapshot_label))
            store_jobs.record_resume(self.store, journal.RMS, job.key)
            journal.record(
                self.store,
                job.key,
                "resumed",
                {"label": job.snapshot_label, "from_site": job.snapshot_site, "hosts": placement},
                phase="running",
                hosts=placement,
                last_event_id=seen,
                error="",
            )
            _log.info("vjob resumed", jobs=[job.key], site=job.site, hosts=placement, label=job.snapshot_label)
            return
        image = self.vms.image(job.image)
        ids = {
            i.vm_name: i
            for i in identity.assign(
                self.store,
                site=job.site,
                job_key=job.key,
                vm_names=job.vm_names,
                mac_prefix=self.cfg.mac_prefix,
                network=self.cfg.network,
            )
        }
        for vm, node in zip(job.vm_names, placement, strict=True):
            spec = self.vms.spec(vm, image, list(job.command), ids[vm], job.memory_mb, job.vcpus)
            self.vms.boot_fresh(spec, node, job_id=job.job_id)
        if job.kills:
            store_jobs.record_resume(self.store, journal.RMS, job.key)
        if job.kills and self._ever_ran(job):  # killed before a first snapshot: its work is gone
            journal.record(
                self.store,
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
            journal.record(
                self.store,
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
        holdings: dict[str, tuple[str, ...]] = {}
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            if suspend:
                suspend_to_stage(self.vms, vm, node, label)
            else:
                self.vms.snapshot(vm, node, label, job_id=job.job_id)
            holdings[node] = (*holdings.get(node, ()), vm)
        expected: dict[str, tuple[int, str]] = {}
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            for name in snapshot_files(vm, label):
                path = self.vms.stage_dir(node) / name
                expected[name] = (path.stat().st_size, sha256_file(path))
        repo = self._site(job.site).repository
        started = time.monotonic()
        try:
            repo.check(sum(size for size, _ in expected.values()))
            Gathering(self._copier(job, label)).run(holdings)
            repo.verify(job.key, label, expected)
        except (RepositoryError, OSError) as exc:
            repo.remove_label(job.key, label)
            for vm in job.vm_names:
                for n in set(job.hosts):
                    self.vms.drop_staged(vm, n, label)
            message = str(exc) if isinstance(exc, RepositoryError) else f"repository copy failed: {exc}"
            journal.record(
                self.store,
                job.key,
                "snapshot_failed",
                {"label": label, "reason": reason, "error": message},
                error=message,
            )
            _log.error("snapshot not safe", jobs=[job.key], error=message)
            return False
        for vm in job.vm_names:
            for n in set(job.hosts):
                self.vms.drop_staged(vm, n, label)
        previous = (job.snapshot_label, job.snapshot_site)
        journal.record(
            self.store,
            job.key,
            "snapshot",
            {
                "label": label,
                "reason": reason,
                "bytes": sum(s for s, _ in expected.values()),
                "gather_s": round(time.monotonic() - started, 3),
            },
            snapshot_label=label,
            snapshot_site=job.site,
            snapshot_at=taken_at,
            error="",
        )
        if previous[0] and previous[1] in self.sites:
            self.sites[previous[1]].repository.remove_label(job.key, previous[0])
        return True

    def _copier(self, job: SalineJob, label: str) -> Callable[[str, str, str], None]:
        repo = self._site(job.site).repository
        vms = self.vms

        def copy(vm: str, source: str, destination: str) -> None:
            for name in snapshot_files(vm, label):
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

    def _evacuate(self, job: SalineJob, event_id: int) -> None:
        """OAR asked for a checkpoint: suspend the VMs into the repository, free the nodes."""
        safe = self.snapshot(job, reason="checkpoint", suspend=True)
        job = journal.get(self.store, job.key)
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            self.vms.stop(vm, node)
        try:
            self._site(job.site).client.delete(job.oar_job_id or "", user=job.user)
        except CommandError as exc:  # the job may already be gone: OAR's kill follows anyway
            _log.warning("oardel after checkpoint failed", jobs=[job.key], error=str(exc))
        lost = 0.0 if safe else self.clock() - (job.snapshot_at or job.created_at)
        self._count_kill(job, cause="checkpoint", lost_s=lost, event_id=event_id)

    # -- end of an OAR job ----------------------------------------------------------------
    def _ended(self, job: SalineJob, oj: OarJob | None) -> None:
        types = {e.type for e in oj.events} if oj else set()
        if oj is None and job.phase == "submitted":  # gone before it ran (OAR lost it): just ask again
            journal.record(self.store, job.key, "oar_job_vanished", {"oar_job_id": job.oar_job_id}, oar_job_id=None)
            return
        if oj is None or oj.killed_for_besteffort or "WALLTIME" in types:
            cause = "vanished" if oj is None else ("besteffort_kill" if oj.killed_for_besteffort else "walltime")
            kill_at = next(
                (e.date for e in (oj.events if oj else ()) if e.type in ("BESTEFFORT_KILL", "WALLTIME")), self.clock()
            )
            lost = 0.0
            if job.phase == "running":
                lost = max(0.0, kill_at - max(job.snapshot_at or 0.0, self._last_deploy(job)))
                for vm, node in zip(job.vm_names, job.hosts, strict=True):
                    self.vms.stop(vm, node)  # its QEMU is outside the job's cpuset: free the node
            self._count_kill(job, cause=cause, lost_s=lost)
            return
        if job.phase == "running" and all(
            self.vms.finished(vm, node) for vm, node in zip(job.vm_names, job.hosts, strict=True)
        ):
            self._complete(job)
            return
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            self.vms.stop(vm, node)
        journal.record(
            self.store,
            job.key,
            "cancelled",
            {"oar_state": oj.state, "events": sorted(types)},
            phase="cancelled",
            hosts=[],
        )
        _log.info("vjob cancelled (its OAR job was deleted)", jobs=[job.key])

    def _ever_ran(self, job: SalineJob) -> bool:
        return any(
            e.kind in ("deployed", "resumed", "restarted_from_scratch") for e in journal.events(self.store, job.key)
        )

    def _last_deploy(self, job: SalineJob) -> float:
        for ev in reversed(journal.events(self.store, job.key)):
            if ev.kind in ("deployed", "resumed", "restarted_from_scratch"):
                return ev.at
        return job.created_at

    def _count_kill(self, job: SalineJob, *, cause: str, lost_s: float, event_id: int | None = None) -> None:
        store_jobs.record_preemption(self.store, journal.RMS, job.key)
        changes: dict[str, object] = {"phase": "killed", "kills": job.kills + 1, "hosts": []}
        if event_id is not None:
            changes["last_event_id"] = event_id
        job = journal.record(
            self.store,
            job.key,
            "killed",
            {"cause": cause, "lost_s": round(lost_s, 3), "snapshot": job.snapshot_label},
            **changes,
        )
        _log.warning("vjob killed by OAR", jobs=[job.key], cause=cause, lost_s=round(lost_s, 1))
        self._resubmit(job)

    def _resubmit(self, job: SalineJob) -> None:
        need = job.vm_count * job.vcpus
        site = self._choose_site(need, prefer=job.site)
        try:
            free = self.sites[site].free_cores()
        except VjobError:
            free = -1
        if 0 <= free < need:  # (-1: OAR unreachable, which the submission below reports)
            journal.record(self.store, job.key, "waiting_for_resources", {"site": site, "need": need})
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
                journal.record(self.store, job.key, "moved", {"from": job.site, "to": name})
                self._submit_oar(journal.get(self.store, job.key), name)
                return
        journal.record(self.store, job.key, "waiting_for_resources", {"site": job.site, "need": need})

    # -- the end --------------------------------------------------------------------------
    def _complete(self, job: SalineJob) -> None:
        journal.record(self.store, job.key, "finished", {"hosts": list(job.hosts)}, phase="done")
        if job.oar_job_id:
            try:
                self._site(job.site).client.signal(job.oar_job_id, signal.SIGUSR1, user=job.user)
            except CommandError as exc:
                _log.warning("could not release the OAR job", jobs=[job.key], error=str(exc))
        _log.info("vjob finished", jobs=[job.key])

    def cancel(self, key: str) -> SalineJob:
        job = journal.get(self.store, key)
        if not job.active:
            return job  # already ended: cancelling again changes nothing
        if job.oar_job_id:
            self._site(job.site).client.delete(job.oar_job_id, user=job.user)
        for vm, node in zip(job.vm_names, job.hosts, strict=True):
            self.vms.stop(vm, node)
        return journal.record(
            self.store, key, "cancelled", {"by": "vjob besteffort cancel"}, phase="cancelled", hosts=[]
        )

    def _cleanup_ended(self) -> None:
        for job in journal.needing_cleanup(self.store):
            for vm, node in zip(job.vm_names, job.hosts, strict=False):
                self.vms.stop(vm, node)
            for site in self.sites.values():
                site.repository.remove_job(job.key)
            identity.release(self.store, job.key)
            store_jobs_terminate(self.store, job.key)
            journal.record(self.store, job.key, "cleaned", {"snapshots_removed": True})


def store_jobs_terminate(store: Store, key: str) -> None:
    from sqlalchemy import update

    from vjob.store.schema import JobRecord

    with store.session() as s:
        s.execute(
            update(JobRecord)
            .where(JobRecord.rms == journal.RMS, JobRecord.rms_job_id == key)
            .values(vjob_state="terminated", preempted_since=None, updated_at=time.time())
        )


def _copy_file(src: Path, dest: Path) -> None:
    from provisioning import transfer

    transfer.copy(transfer.Endpoint(src), transfer.Endpoint(dest), method="local")
