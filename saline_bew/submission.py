"""The vjob's OAR job: recording a vjob, asking OAR for it, again after a kill, elsewhere.

Why apart from the loop (saline_bew.manager): asking OAR is what a submission, an admission,
a kill, a long wait and a live migration (saline_bew.evacuation) share: one holder command,
one choice of site, one way to journal the answer. What the holder is and which site has
room are decided here only.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

from plugins.oar.client import SubmitRequest
from saline_bew import grammar, identity, journal
from saline_bew.events import EventKind, Phase
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from saline_bew.sites import Site
from vjob import log
from vjob.errors import CommandError, VjobError
from vjob.store import jobs as store_jobs

_log = log.get("saline")
HOLDER = Path(__file__).resolve().with_name("holder.sh")
"""Run by the OAR job as the user: it must be readable by every user (package data)."""
ADMISSION_TIMEOUT_S = 120.0
"""An admitted vjob whose OAR job never shows up (a later admission rule refused it, oarsub
died) is abandoned after this long: nobody asked for it any more."""


def _vjob_command() -> str | None:
    """The `vjob` command beside this Python (else on PATH): the holder runs it on the node, as
    the user, to send the directory and print the output; the same install path is expected there."""
    found = shutil.which("vjob", path=str(Path(sys.executable).parent)) or shutil.which("vjob")
    return str(Path(found).absolute()) if found else None


VJOB_COMMAND = _vjob_command()


def create(
    ports: Ports,
    user: str,
    image: str,
    command: list[str],
    *,
    vm_count: int,
    vcpus: int,
    memory_mb: int,
    walltime: str,
    site: str,
) -> SalineJob:
    """The vjob's record, its lease and its network identities: what submit and admit share
    (their inputs are checked by then)."""
    ports.vms.image(image)
    key = f"be{uuid.uuid4().hex[:10]}"
    job = journal.create(
        ports.store,
        key=key,
        user=user,
        image=image,
        command=command,
        vm_count=vm_count,
        vcpus=vcpus,
        memory_mb=memory_mb,
        walltime=walltime,
        site=site,
    )
    if not ports.lease(key):  # a brand-new key: nobody else can hold it
        raise VjobError(f"best-effort vjob {key}: could not take its lease")
    identity.assign(
        ports.store,
        site=site,
        job_key=key,
        vm_names=job.vm_names,
        mac_prefix=ports.cfg.mac_prefix,
        network=ports.cfg.network,
    )
    return job


def request(ports: Ports, job: SalineJob, site: Site, *, stage: bool = False) -> SubmitRequest:
    """The holder's OAR job. Told the `vjob` command and this socket, the holder prints the
    vjob's output into OAR's output files when released; with `stage` (the admission
    rule's job, which runs in the submission directory) it first sends that directory."""
    command = ["/bin/sh", str(HOLDER), job.key]
    tail = [VJOB_COMMAND or "", str(ports.socket or "")]
    if all(grammar.PLAIN_PATH.fullmatch(word) for word in tail):
        command += [*tail, "stage" if stage else "hold"]
    return SubmitRequest(
        command=command,
        resource=f"/resource_id={job.vm_count * job.vcpus}",
        walltime=job.walltime,
        name=job.key,
        types=("besteffort",),
        properties=site.properties,
        checkpoint_s=ports.cfg.checkpoint_delay_s,
        signal=ports.cfg.checkpoint_signal,
    )


def submit_oar(ports: Ports, job: SalineJob, site_name: str) -> SalineJob:
    """Ask `site_name`'s OAR for the vjob's job; journalled either way (CommandError raised)."""
    site = ports.site(site_name)
    try:
        oar_id = site.client.submit(request(ports, job, site), user=job.user)
    except CommandError as exc:
        ports.record(
            job.key,
            EventKind.SUBMIT_FAILED,
            {"site": site_name, "error": str(exc)},
            site=site_name,
            oar_job_id=None,
            phase=Phase.SUBMITTED,
            error=str(exc),
        )
        raise
    _log.info("vjob submitted", jobs=[job.key], site=site_name, oar_job=oar_id)
    return ports.record(
        job.key,
        EventKind.SUBMITTED,
        {"site": site_name},
        site=site_name,
        oar_job_id=oar_id,
        phase=Phase.SUBMITTED,
        hosts=[],
        error="",
    )


def choose_site(ports: Ports, need: int, *, prefer: str | None) -> str:
    """`prefer` when it has room, else the first site with room, else `prefer` (to wait)."""
    order = ([prefer] if prefer else []) + [s for s in ports.sites if s != prefer]
    for name in order:
        try:
            if ports.sites[name].free_cores() >= need:
                return name
        except VjobError as exc:
            _log.warning("site unreachable", site=name, error=str(exc))
    return prefer or order[0]


def adopt(ports: Ports, job: SalineJob, since: float) -> None:
    """Take the OAR job the admission rule named after the vjob (same user: another
    user's job of that name is never taken); abandon the vjob if none shows up in time."""
    found = [oj for oj in ports.site(job.site).client.jobs() if oj.name == job.key and oj.user == job.user]
    if found:
        oj = max(found, key=lambda j: int(j.id))
        ports.record(job.key, EventKind.ADOPTED, {"site": job.site}, oar_job_id=oj.id, error="")
        _log.info("vjob adopted its OAR job", jobs=[job.key], oar_job=oj.id)
    elif ports.clock() - since > ADMISSION_TIMEOUT_S:
        ports.record(
            job.key,
            EventKind.ADMISSION_ABANDONED,
            {"waited_s": round(ports.clock() - since, 1)},
            phase=Phase.CANCELLED,
            hosts=[],
        )
        _log.warning("admitted vjob never got its OAR job: abandoned", jobs=[job.key])


def count_kill(ports: Ports, job: SalineJob, *, cause: str, lost_s: float, event_id: int | None = None) -> None:
    """OAR killed the vjob's job (or it was suspended on OAR's warning): count the kill and
    the work lost, then ask OAR again."""
    store_jobs.record_preemption(ports.store, journal.RMS, job.key)
    changes: dict[str, object] = {"phase": Phase.KILLED, "kills": job.kills + 1, "hosts": []}
    if event_id is not None:
        changes["last_event_id"] = event_id
    job = ports.record(
        job.key,
        EventKind.KILLED,
        {"cause": cause, "lost_s": round(lost_s, 3), "snapshot": job.snapshot_label},
        **changes,
    )
    _log.warning("vjob killed by OAR", jobs=[job.key], cause=cause, lost_s=round(lost_s, 1))
    ports.metrics.kills.inc()
    ports.metrics.work_lost.inc(max(0.0, lost_s))
    resubmit(ports, job)


def resubmit(ports: Ports, job: SalineJob) -> None:
    """Ask OAR again: at the same site if it has room, else at another, else wait there."""
    ports.metrics.resubmissions.inc()
    need = job.vm_count * job.vcpus
    site = choose_site(ports, need, prefer=job.site)
    try:
        free = ports.sites[site].free_cores()
    except VjobError:
        free = -1
    if 0 <= free < need:  # (-1: OAR unreachable, which the submission below reports)
        ports.record(job.key, EventKind.WAITING_FOR_RESOURCES, {"site": site, "need": need})
    submit_oar(ports, job, site)


def maybe_move(ports: Ports, job: SalineJob) -> None:
    """Still waiting at its site: go to another site that has room now."""
    need = job.vm_count * job.vcpus
    for name, site in ports.sites.items():
        if name == job.site:
            continue
        try:
            room = site.free_cores() >= need
        except VjobError:
            continue
        if room:
            try:
                ports.site(job.site).client.delete(job.oar_job_id or "", user=job.user)
            except CommandError as exc:
                _log.warning("oardel of the waiting job failed", jobs=[job.key], error=str(exc))
            moved = ports.record(job.key, EventKind.MOVED, {"from": job.site, "to": name})
            submit_oar(ports, moved, name)
            return
    ports.record(job.key, EventKind.WAITING_FOR_RESOURCES, {"site": job.site, "need": need})


def give_back(site: Site, oar_id: str, job: SalineJob) -> None:
    """oardel a job the vjob no longer needs; one already gone (or killed by OAR) is fine."""
    try:
        site.client.delete(oar_id, user=job.user)
    except CommandError as exc:  # gone already, or OAR's kill follows
        _log.warning("oardel failed", jobs=[job.key], oar_job=oar_id, error=str(exc))
