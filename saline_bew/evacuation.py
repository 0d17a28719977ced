"""OAR warned a vjob (its checkpoint signal): carry out the paper's order, live migration to
resources OAR gives at once, else suspension to the repository.

Why apart from the pure plan (saline_bew.relocation): the plan says which migrations to try
and for how long; this module asks OAR for the new jobs, moves the VMs, journals each request
before and after oarsub (so a successor manager can finish or delete one left open), and
falls back to the suspension when no try succeeds in time.
"""

from __future__ import annotations

import time

from plugins.oar.client import OarUnavailable
from plugins.oar.parse import OarJob
from provisioning.driver import DriverError
from saline_bew import journal, relocation, snapshots, submission
from saline_bew.events import EventKind
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from saline_bew.sites import Site
from vjob import log
from vjob.errors import CommandError, StoreError, VjobError

_log = log.get("saline")
Left = list[tuple[str, str]]
"""OAR jobs (site, id) a failed try left holding some of the vjob's VMs."""


def evacuate(
    ports: Ports,
    job: SalineJob,
    event_id: int,
    warned_at: float,
    left_open: dict[str, relocation.OpenRequest] | None = None,
) -> None:
    """OAR asked for a checkpoint: live-migrate the VMs to resources OAR gives at once (same
    site, then another: the paper's order, `saline_bew.relocation`); when none come in
    time, suspend the VMs into the repository and free the nodes.

    `left_open`: per vjob, the migration request a dead manager left this pass. The vjob's is
    taken out once the tries begin and taken over first; one still there after a failure is
    the caller's to delete (`settle_request`)."""
    plan, extra = _relocate(ports, job, event_id, warned_at, left_open or {})
    if plan is None:
        return  # migrated: the vjob runs on elsewhere, nothing was written to the repository
    job = journal.get(ports.store, job.key)  # a failed try may have moved some VMs already
    safe = snapshots.snapshot(ports, job, reason="checkpoint", suspend=True)
    job = journal.get(ports.store, job.key)
    ports.free_nodes(job)
    for site_name, oar_id in [(job.site, job.oar_job_id or ""), *extra]:
        try:
            ports.site(site_name).client.delete(oar_id, user=job.user)
        except CommandError as exc:  # the job may already be gone: OAR's kill follows anyway
            _log.warning("oardel after checkpoint failed", jobs=[job.key], oar_job=oar_id, error=str(exc))
    freed_s = ports.clock() - warned_at
    ports.record(
        job.key,
        EventKind.RELOCATION,
        {
            "path": str(relocation.Path.SUSPEND),
            "reason": plan.reason,
            "warned_at": warned_at,
            "freed_s": round(freed_s, 2),
        },
    )
    ports.metrics.relocations.labels(path=relocation.Path.SUSPEND).inc()
    lost = 0.0 if safe else ports.clock() - (job.snapshot_at or job.created_at)
    submission.count_kill(ports, job, cause="checkpoint", lost_s=lost, event_id=event_id)


def _relocate(
    ports: Ports, job: SalineJob, event_id: int, warned_at: float, left_open: dict[str, relocation.OpenRequest]
) -> tuple[relocation.Plan | None, Left]:
    """Try the live migrations `relocation.plan` chooses. (None, []) once the vjob runs on
    elsewhere; else the plan (its reason is journalled) and the OAR jobs a failed try left
    holding VMs, which the suspension must give back too."""
    cfg = ports.cfg
    events = journal.events(ports.store, job.key)
    suspend_s = _last_detail(
        events, EventKind.SNAPSHOT, "took_s", default=relocation.suspend_estimate_s(job.memory_mb, job.vm_count)
    )
    migrate_s = relocation.migrate_estimate_s(
        job.memory_mb, job.vm_count, _last_detail(events, EventKind.MIGRATED, "mb_per_s", default=0.0)
    )
    taken = left_open.pop(job.key, None)
    if taken is not None:
        done, extra = _take_over(ports, job, taken, event_id, warned_at, suspend_s, migrate_s)
        if done:
            return None, []
        if extra:
            return relocation.Plan((), 0.0, "the migration taken over left VMs in two OAR jobs"), extra
        job = journal.get(ports.store, job.key)
    plan = relocation.plan(
        need=job.vm_count * job.vcpus,
        site=job.site,
        free=_free_cores(ports) if cfg.migrate_wait_s > 0 else {},
        time_left_s=warned_at + cfg.checkpoint_delay_s - ports.clock(),
        suspend_s=suspend_s,
        migrate_s=migrate_s,
        wait_s=cfg.migrate_wait_s,
    )
    extra = []
    end = time.monotonic() + plan.wait_s
    for i, target in enumerate(plan.targets):
        left_s = end - time.monotonic()
        if left_s <= 0:
            break
        # Each try gets its share of what is left: the own site's free cores may be the very
        # ones the job that caused the warning waits for, and OAR then never starts ours there.
        until = time.monotonic() + left_s / (len(plan.targets) - i)
        done, left = migrate_to(ports, job, target, until, event_id, warned_at)
        if done:
            return None, []
        extra += left
        job = journal.get(ports.store, job.key)
        if extra:
            break  # VMs are split between two OAR jobs: suspend them where they are
    return plan, extra


def _free_cores(ports: Ports) -> dict[str, int | None]:
    """Free cores per site now (None: its OAR did not answer). Asked only when a migration
    could follow: every second counts before OAR's kill."""
    free: dict[str, int | None] = {}
    for name, site in ports.sites.items():
        try:
            free[name] = site.free_cores()
        except VjobError as exc:
            free[name] = None
            _log.warning("site unreachable", site=name, error=str(exc))
    return free


def _take_over(
    ports: Ports,
    job: SalineJob,
    req: relocation.OpenRequest,
    event_id: int,
    warned_at: float,
    suspend_s: float,
    migrate_s: float,
) -> tuple[bool, Left]:
    """Finish the migration a dead manager started: its OAR job is asked for already (and
    may run by now), so waiting for it is quicker than asking again. Deleted instead when
    its id is unknown, its site is gone, or no try fits before OAR's kill."""
    budget = relocation.wait_budget(
        time_left_s=warned_at + ports.cfg.checkpoint_delay_s - ports.clock(),
        suspend_s=suspend_s,
        migrate_s=migrate_s,
        wait_s=ports.cfg.migrate_wait_s,
    )
    if req.oar_job_id is None or req.site not in ports.sites or budget <= 0:
        settle_request(ports, job, req)
        return False, []
    path = relocation.Path.SAME_SITE if req.site == job.site else relocation.Path.OTHER_SITE
    ports.record(job.key, EventKind.MIGRATION_TAKEN_OVER, {"site": req.site, "oar_job_id": req.oar_job_id})
    _log.info("vjob: taking over the migration a previous manager left", jobs=[job.key], oar_job=req.oar_job_id)
    target = relocation.Target(req.site, path)
    return migrate_to(ports, job, target, time.monotonic() + budget, event_id, warned_at, existing=req.oar_job_id)


def settle_request(ports: Ports, job: SalineJob, req: relocation.OpenRequest) -> None:
    """Delete the OAR job of a migration request no manager finished (else it would hold its
    nodes until its walltime), and close the request in the journal. OAR unreachable: the
    request stays open and the next pass tries again."""
    try:
        deleted = abandon_request(ports, job, req)
        _log.warning(
            "vjob: deleted the OAR job of a migration a previous manager left",
            jobs=[job.key],
            site=req.site,
            oar_jobs=deleted,
        )
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - retried next pass: the request stays open
        _log.warning("left-over migration job not deleted yet", jobs=[job.key], error=str(exc)[:300])


def abandon_request(ports: Ports, job: SalineJob, req: relocation.OpenRequest) -> list[str]:
    """Delete the request's OAR job (`_delete_request_job`) and journal the request closed;
    the ids deleted."""
    deleted = _delete_request_job(ports, job, req)
    detail = {"site": req.site, "oar_job_id": req.oar_job_id, "deleted": deleted}
    ports.record(job.key, EventKind.MIGRATION_ABANDONED, detail)
    return deleted


def _delete_request_job(ports: Ports, job: SalineJob, req: relocation.OpenRequest) -> list[str]:
    """oardel the request's job, or, its id never journalled, every live job of the vjob's
    name and user at that site other than the vjob's own. The ids deleted."""
    site = ports.sites.get(req.site)
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


def migrate_to(
    ports: Ports,
    job: SalineJob,
    target: relocation.Target,
    until: float,
    event_id: int,
    warned_at: float,
    *,
    existing: str | None = None,
) -> tuple[bool, Left]:
    """Ask `target`'s OAR for the vjob's resources (or take `existing`, asked for by a
    previous manager) and move the VMs there live once it starts the job. (True, []) when
    every VM runs there and the warned job is given back; (False, OAR jobs still holding
    some VMs) otherwise, the new job deleted if it holds none.

    The request is journalled before oarsub and again with the job's id before the wait
    (`EventKind.MIGRATION_ASKING`, `MIGRATION_REQUESTED`): a manager that dies in between
    leaves an open request that its successor deletes or takes over (`settle_request`)."""
    site = ports.site(target.site)
    new_id = existing
    if new_id is None:
        ports.record(job.key, EventKind.MIGRATION_ASKING, {"site": target.site, "path": target.path})
        try:
            new_id = site.client.submit(submission.request(ports, job, site), user=job.user)
        except CommandError as exc:
            ports.record(job.key, EventKind.MIGRATION_FAILED, {"site": target.site, "error": str(exc)[:1000]})
            return False, []
        detail = {"site": target.site, "path": target.path, "oar_job_id": new_id}
        ports.record(job.key, EventKind.MIGRATION_REQUESTED, detail)
    oj = _started(ports, job, site, target, new_id, until)
    if oj is None:
        return False, []
    return _move(ports, job, site, target, new_id, oj, event_id, warned_at)


def _started(
    ports: Ports, job: SalineJob, site: Site, target: relocation.Target, new_id: str, until: float
) -> OarJob | None:
    """Wait until OAR runs the new job `new_id`; None (the job given back, the failure
    journalled) when it ended first or did not start by `until`."""
    oj = site.client.job(new_id, user=job.user)
    while not (oj is not None and oj.state == "Running" and oj.hosts):
        if oj is None or oj.finished or time.monotonic() >= until:
            submission.give_back(site, new_id, job)
            if oj and not oj.finished:
                why = f"OAR did not start job {new_id} in the time left"
            else:
                why = f"OAR job {new_id} ended before it ran"
            detail = {"site": target.site, "oar_job_id": new_id, "error": why}
            ports.record(job.key, EventKind.MIGRATION_FAILED, detail)
            return None
        time.sleep(min(1.0, ports.cfg.poll_interval_s))
        oj = site.client.job(new_id, user=job.user)
    return oj


def _move(
    ports: Ports,
    job: SalineJob,
    site: Site,
    target: relocation.Target,
    new_id: str,
    oj: OarJob,
    event_id: int,
    warned_at: float,
) -> tuple[bool, Left]:
    """Live-migrate the VMs into the running new job `new_id` (`oj`), then give the warned job back."""
    placement = [oj.hosts[i % len(oj.hosts)] for i in range(job.vm_count)]
    hosts = list(job.hosts)
    started = time.monotonic()
    subnet = ports.subnet(job)
    try:
        ports.vms.network_up(subnet, [n for n in placement if n not in job.hosts])
        for i, (vm, src, dst) in enumerate(zip(job.vm_names, job.hosts, placement, strict=True)):
            if src != dst:  # other cores of the same node: the VM stays where it is
                ports.vms.migrate(vm, src, dst)
            hosts[i] = dst
    except (DriverError, VjobError) as exc:
        ports.vms.network_down(subnet, [n for n in placement if n not in hosts])
        moved = hosts != list(job.hosts)
        if not moved:
            submission.give_back(site, new_id, job)
        ports.record(
            job.key,
            EventKind.MIGRATION_FAILED,
            {"site": target.site, "oar_job_id": new_id, "error": str(exc)[:1000], "hosts": hosts},
            hosts=hosts,
        )
        return False, [(target.site, new_id)] if moved else []
    migrate_s = time.monotonic() - started
    since = ports.clock() - warned_at
    old_site, old_id = job.site, job.oar_job_id or ""
    ports.record(
        job.key,
        EventKind.MIGRATED,
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
    detail = {"path": target.path, "warned_at": warned_at, "running_s": round(since, 3)}
    ports.record(job.key, EventKind.RELOCATION, detail)
    ports.metrics.relocations.labels(path=target.path).inc()
    ports.metrics.relocation_seconds.labels(path=target.path).observe(since)
    ports.vms.network_down(subnet, [n for n in job.hosts if n not in placement])
    submission.give_back(ports.site(old_site), old_id, job)
    _log.info(
        "vjob live-migrated on OAR's warning",
        jobs=[job.key],
        to_site=target.site,
        hosts=placement,
        since_warning_s=round(since, 1),
    )
    return True, []


def _last_detail(events: list[journal.Event], kind: EventKind, field: str, *, default: float) -> float:
    """The newest journalled `field` of a `kind` entry (a measured duration or speed)."""
    for ev in reversed(events):
        value = ev.detail.get(field) if ev.kind == kind else None
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return default
