"""Snapshots of a running vjob, made safe in its site's repository.

Why apart from the loop (saline_bew.manager): a snapshot is the vjob's only way back after a
kill, so it is either whole and checked in the repository (then the previous one goes) or it
is removed and the previous one stays the one to resume from. The copies follow the paper's
ordering (saline_bew.gathering), and COMMAND's output up to the cut is kept with it
(saline_bew.output).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from provisioning import transfer
from saline_bew import node_files, output
from saline_bew.events import EventKind
from saline_bew.gathering import REPOSITORY, Gathering
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from saline_bew.repository import RepositoryError
from saline_bew.vms import snapshot_files
from vjob import log

_log = log.get("saline")


def snapshot(ports: Ports, job: SalineJob, *, reason: str, suspend: bool = False) -> bool:
    """Snapshot every VM into the site's repository; True when it is safe there.

    With `suspend` the VMs are saved and not resumed (OAR's checkpoint signal). On any
    repository problem the previous safe snapshot stays the one to resume from.
    """
    vms = ports.vms
    label = f"s{int(ports.clock() * 1000)}"
    taken_at = ports.clock()
    began = time.monotonic()
    members = list(zip(job.vm_names, job.hosts, strict=True))
    real = ports.real(job, job.hosts[0])
    at_cut: list[int] = []  # the first VM's output logs at the cut: what this snapshot covers
    vms.checkpoint(
        members,
        label,
        job_id=job.job_id,
        keep_running=not suspend,
        with_job_disk=real,
        at_cut=lambda: at_cut.extend(output.log_sizes(ports, job)),  # one cut
    )
    holdings: dict[str, tuple[str, ...]] = {}
    for vm, node in members:
        holdings[node] = (*holdings.get(node, ()), vm)
    repo = ports.site(job.site).repository
    started = time.monotonic()
    try:
        expected: dict[str, tuple[int, str]] = {}
        for vm, node in members:  # hashed on the node's host: what the repository must receive
            expected.update(node_files.digests(vms.driver, node, snapshot_files(vm, label, with_job_disk=real)))
        repo.check(sum(size for size, _ in expected.values()))
        Gathering(_copier(ports, job, label, with_job_disk=real)).run(holdings)
        repo.verify(job.key, label, expected)
    except (RepositoryError, OSError) as exc:
        _not_safe(ports, job, label, reason, exc)
        return False
    _drop_staged(ports, job, label)
    previous = (job.snapshot_label, job.snapshot_site)
    ports.record(
        job.key,
        EventKind.SNAPSHOT,
        {
            "label": label,
            "reason": reason,
            "bytes": sum(s for s, _ in expected.values()),
            "gather_s": round(time.monotonic() - started, 3),
            "staged_s": round(started - began, 3),
            "took_s": round(time.monotonic() - began, 3),
            "files": {name: list(pair) for name, pair in expected.items()},
            **output.keep(ports, job, at_cut),
        },
        snapshot_label=label,
        snapshot_site=job.site,
        snapshot_at=taken_at,
        error="",
    )
    ports.metrics.snapshots.inc()
    if previous[0] and previous[1] in ports.sites:
        ports.sites[previous[1]].repository.remove_label(job.key, previous[0])
    return True


def _not_safe(ports: Ports, job: SalineJob, label: str, reason: str, exc: RepositoryError | OSError) -> None:
    """Remove what the failed snapshot `label` left (in the repository, on the nodes) and say why."""
    repo = ports.site(job.site).repository
    try:
        repo.remove_label(job.key, label)
    except RepositoryError as gone:  # an unreachable repository keeps the half copy; never resumed from
        _log.warning("half snapshot not removed", jobs=[job.key], label=label, error=str(gone))
    _drop_staged(ports, job, label)
    message = str(exc) if isinstance(exc, RepositoryError) else f"repository copy failed: {exc}"
    ports.record(
        job.key,
        EventKind.SNAPSHOT_FAILED,
        {"label": label, "reason": reason, "error": message},
        error=message,
    )
    _log.error("snapshot not safe", jobs=[job.key], error=message)
    ports.metrics.snapshot_failures.inc()


def _drop_staged(ports: Ports, job: SalineJob, label: str) -> None:
    """Remove the snapshot's files staged on the nodes (copied, or never to be)."""
    for vm in job.vm_names:
        for n in set(job.hosts):
            ports.vms.drop_staged(vm, n, label)


def _copier(ports: Ports, job: SalineJob, label: str, *, with_job_disk: bool) -> Callable[[str, str, str], None]:
    """One copy of the gathering (saline_bew.gathering): a VM's files from a node to the
    repository, or relayed to a peer node that sends them on later."""
    repo = ports.site(job.site).repository
    vms = ports.vms

    def copy(vm: str, source: str, destination: str) -> None:
        for name in snapshot_files(vm, label, with_job_disk=with_job_disk):
            src = node_files.at(vms.driver, source, vms.stage_dir(source) / name)
            if destination == REPOSITORY:
                repo.put(src, job.key, label)
                transfer.remove(src)
                continue
            # relayed to a peer, which sends it on later
            dest = node_files.at(vms.driver, destination, vms.stage_dir(destination) / name)
            if not transfer.same_file(src, dest):  # nodes sharing one snapshot dir have nothing to relay
                vms.driver.ensure_dirs(destination)
                transfer.copy(src, dest, method=node_files.method(src, dest))
                transfer.remove(src)

    return copy
