"""The vjob's VMs on the nodes OAR gave: started (from the image or its latest safe snapshot),
watched for their end, and the end carried out.

Why apart from the loop (saline_bew.manager): a deployment is where a vjob's journal meets
its VMs — a resume ends a suspension, a fresh boot after a kill is a restart from scratch,
and the end keeps COMMAND's output and exit status before the OAR job is released. The
manager decides when (saline_bew.phases); this module does it.
"""

from __future__ import annotations

import signal

from plugins.oar.parse import OarJob
from saline_bew import identity, journal, node_files, output, phases, relocation
from saline_bew.events import EventKind, Phase
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from vjob import log
from vjob.errors import CommandError, VjobError
from vjob.store import jobs as store_jobs

_log = log.get("saline")


def deploy(ports: Ports, job: SalineJob, oj: OarJob) -> None:
    """Start the vjob on the nodes of its running OAR job `oj`: from its latest safe snapshot
    when it has one, else from the image."""
    placement = [oj.hosts[i % len(oj.hosts)] for i in range(job.vm_count)]
    seen = max((e.event_id for e in oj.events), default=job.last_event_id)
    ids = ports.identities(job)  # the same at every deployment: the vjob keeps its addresses
    ports.vms.network_up(ids[job.vm_names[0]].subnet_id, placement)
    if job.snapshot_label and job.snapshot_site:
        _resume(ports, job, placement, seen, job.snapshot_label, job.snapshot_site)
    else:
        _boot(ports, job, placement, seen, ids)


def _resume(ports: Ports, job: SalineJob, placement: list[str], seen: int, label: str, from_site: str) -> None:
    """Restore the VMs from the vjob's latest safe snapshot `label` (possibly at another site)."""
    repo = ports.site(from_site).repository
    members = list(zip(job.vm_names, placement, strict=True))
    events = journal.events(ports.store, job.key)
    files = next((e.detail.get("files") for e in reversed(events) if _snapshot_of(e, label)), None)
    back = ports.vms.restore(
        members,
        label,
        repo.label_dir(job.key, label),
        repo.host,
        with_job_disk=ports.real(job, placement[0]),
        expected={vm: node_files.expected_for(files, vm, label) for vm in job.vm_names},
    )
    store_jobs.record_resume(ports.store, journal.RMS, job.key)
    detail: dict[str, object] = {"label": label, "from_site": from_site, "from": repo.where}
    detail["hosts"] = placement
    detail["bytes"] = back.fetched.bytes
    detail["copy_s"] = round(back.fetched.copy_s, 3)
    detail["check_s"] = round(back.fetched.check_s, 3)
    detail["restore_to_running_s"] = round(back.restore_to_running_s, 3)
    warned_at = suspended_at(events)
    if warned_at is not None:  # suspended on OAR's warning: the suspend/resume path ends here
        detail["since_warning_s"] = round(ports.clock() - warned_at, 3)
        ports.metrics.relocation_seconds.labels(path=relocation.Path.SUSPEND).observe(ports.clock() - warned_at)
    ports.record(
        job.key,
        EventKind.RESUMED,
        detail,
        phase=Phase.RUNNING,
        hosts=placement,
        last_event_id=seen,
        error="",
    )
    _log.info("vjob resumed", jobs=[job.key], site=job.site, hosts=placement, label=label)


def _snapshot_of(event: journal.Event, label: str) -> bool:
    """The journal's entry of the safe snapshot `label` (its `files`: the digests taken then)."""
    return event.kind == EventKind.SNAPSHOT and event.detail.get("label") == label


def _boot(
    ports: Ports, job: SalineJob, placement: list[str], seen: int, ids: dict[str, identity.NetworkIdentity]
) -> None:
    """Boot fresh VMs from the image: a first start, or a restart from scratch after a kill
    that came before the first snapshot (counted)."""
    vms = ports.vms
    image = vms.image(job.image)
    for vm, node in zip(job.vm_names, placement, strict=True):
        vms.stop(vm, node)  # whatever a killed run left there
    local = vms.real(job.image, placement[0])
    if local is not None:  # the image's own kernel: the guest agent runs COMMAND on the first VM
        specs = vms.real_specs(
            local,
            list(job.command),
            [ids[vm] for vm in job.vm_names],
            placement,
            user=job.user,
            memory_mib=job.memory_mb,
            vcpus=job.vcpus,
            work=vms.work_path(job.key),
        )
    else:
        specs = [vms.spec(vm, image, list(job.command), ids[vm], job.memory_mb, job.vcpus) for vm in job.vm_names]
    for spec, node in zip(specs, placement, strict=True):
        vms.boot_fresh(spec, node, job_id=job.job_id)
    if job.kills:
        store_jobs.record_resume(ports.store, journal.RMS, job.key)
    changes: dict[str, object] = {"phase": Phase.RUNNING, "hosts": placement, "last_event_id": seen, "error": ""}
    if job.kills and ever_ran(ports, job):  # killed before a first snapshot: its work is gone
        ports.record(
            job.key,
            EventKind.RESTARTED_FROM_SCRATCH,
            {"hosts": placement, "kills": job.kills},
            restarts_from_scratch=job.restarts_from_scratch + 1,
            **changes,
        )
        _log.warning("vjob restarted from scratch (killed before its first snapshot)", jobs=[job.key])
    else:
        ports.record(job.key, EventKind.DEPLOYED, {"hosts": placement}, **changes)
        _log.info("vjob deployed", jobs=[job.key], site=job.site, hosts=placement)


def ever_ran(ports: Ports, job: SalineJob) -> bool:
    """Whether the vjob's VMs were ever started: a kill before then loses no work."""
    return any(e.kind in phases.DEPLOY_EVENTS for e in journal.events(ports.store, job.key))


def finished(ports: Ports, job: SalineJob) -> bool:
    """COMMAND ended: every tiny guest powered off after its payload; on a real image the
    first VM, which runs COMMAND (the others only serve it, as a multi-node job's do)."""
    members = list(zip(job.vm_names, job.hosts, strict=True))
    if members and ports.real(job, job.hosts[0]):
        members = members[:1]
    return all(ports.vms.finished(vm, node) for vm, node in members)


def complete(ports: Ports, job: SalineJob) -> None:
    """COMMAND ended: keep the rest of its output and its exit status, then release the OAR
    job (whose holder then prints that output into OAR's output files)."""
    detail: dict[str, object] = {"hosts": list(job.hosts), **output.keep(ports, job, None)}
    detail["exit_code"] = None
    if job.hosts and ports.real(job, job.hosts[0]):
        try:
            detail["exit_code"] = ports.vms.exit_status(job.vm_names[0], job.hosts[0], user=job.user)
        except (VjobError, OSError) as exc:  # the vjob is over all the same; say why it is unknown
            detail["exit_error"] = str(exc)[:300]
    ports.record(job.key, EventKind.FINISHED, detail, phase=Phase.DONE)
    if job.oar_job_id:
        try:
            ports.site(job.site).client.signal(job.oar_job_id, signal.SIGUSR1, user=job.user)
        except CommandError as exc:
            _log.warning("could not release the OAR job", jobs=[job.key], error=str(exc))
    _log.info("vjob finished", jobs=[job.key])


def suspended_at(events: list[journal.Event]) -> float | None:
    """When OAR warned the vjob that was suspended on that warning and not resumed since."""
    for ev in reversed(events):
        if ev.kind in phases.DEPLOY_EVENTS:
            return None
        if ev.kind == EventKind.RELOCATION and ev.detail.get("path") == relocation.Path.SUSPEND:
            at = ev.detail.get("warned_at")
            return float(at) if isinstance(at, int | float) else None
    return None
