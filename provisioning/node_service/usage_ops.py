"""The node service's usage operations: root measures a job's VMs on this node and writes what
they used into the job's RMS record (Slurm: AdminComment; vjob.usage_record says how).

Why root, and why here: QEMU must run outside the job's step (the RMS signals everything in the
step at a requeue, before the pilot's cut: docs/multinode.md), so the RMS's own accounting never
sees the VMs, and a figure the job's user reported would be the user's word. The service reads
the kernel's counters of the job's QEMU processes (provisioning.vm_usage: which processes count
and what a hostile user can and cannot falsify) and writes through the RMS as root.

    usage.start {job, node}  -> {tracking, processes, interval_s}
      the pilot's VMs are about to start (or to be restored, or adopted): sample them every
      `[node] usage_interval_s` while the job runs on this node.
    usage.final {job, node}  -> {cpu_s, peak_mib, written, record[, reason when not written]}
      the pilot's run ends: sample once more, add this run's figures to the node's word in the
      job's record (CPU seconds summed over the runs, peak memory the largest), stop sampling.

What the figure misses: a QEMU that exits before `usage.final` (a guest that powers off, a VM
saved and stopped) keeps the counters of the last sample, so up to one sampling interval of its
CPU time (typically the save's or the shutdown's) is not counted; a QEMU already running when
the service first saw it (the service was restarted under a running VM) counts from then on.
Nothing is ever counted twice: each process's CPU time handed out is remembered.

Both are idempotent: a second `usage.start` of a tracked job changes nothing; a `usage.final`
repeated after a timeout adds nothing more (the run is closed) and answers what the first wrote.
A write the RMS refused is kept and retried by the next `usage.final` or when the sampler sees
the job's VMs gone for good. Limits: MAX_TRACKED jobs per node, MAX_TRACKED_PER_UID per user.

The writer (one per RMS, plugins/<rms>/accounting.py) is injected when the service is composed
(`install_writer`): provisioning knows no RMS.
"""

from __future__ import annotations

import pwd
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioning import network
from provisioning.node_service import site
from provisioning.node_service.grant import Grant
from provisioning.node_service.net_rules import JobNet
from provisioning.node_service.protocol import OperationSpec
from provisioning.vm_usage import JobMeter
from vjob import log
from vjob.errors import InputError, VjobError
from vjob.pilot_files.names import member_names, vm_name
from vjob.usage_record import Usage

MAX_TRACKED = 512
MAX_TRACKED_PER_UID = 16
GONE_SAMPLES = 10
"""Samples in a row without any of a job's VMs after which an unclosed run is written and dropped."""
NEVER_SEEN_S = 3600.0
"""An open run that never saw a VM for this long is dropped (nothing to write)."""
DEFAULT_INTERVAL_S = 30.0
MAX_ANSWERS = 1024
"""Answers of written runs kept for a usage.final repeated after a timeout."""
SYSTEM_QEMU_USERS = ("libvirt-qemu",)
"""Users root's libvirt runs QEMU as (Debian): domains there are named by root, so a VM of that
uid named after the job is the job's."""


class UsageWriter(Protocol):
    """The RMS's side: add one run's usage on one node to a job's record (plugins/<rms>/accounting.py)."""

    def add(self, job: str, node: str, run: Usage) -> str:
        """Write it; the record's text after."""


_writer: UsageWriter | None = None


def install_writer(writer: UsageWriter | None) -> None:
    """Called once by the service's composition (plugins.node_service_cmd) with its RMS's writer."""
    global _writer
    _writer = writer


@dataclass
class _Tracked:
    meter: JobMeter
    uid: int
    open: bool = True
    pending: Usage | None = None
    answer: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


_tracked: dict[tuple[str, str, str], _Tracked] = {}
_answered: dict[tuple[str, str, str], dict[str, Any]] = {}
_lock = threading.Lock()
_sampler: threading.Thread | None = None


def _rank(grant: Grant) -> int | None:
    """The rank of the grant's node in the job (its VM there is rank's: a user's pilots run per
    node), None when the RMS no longer lists the job's nodes."""
    return grant.nodes.index(grant.node) if grant.node in grant.nodes else None


def job_vm_names(grant: Grant) -> frozenset[str]:
    """The names the job's VM on this node may have: one VM's, or the member's of this node's
    rank (nodes that share a host — the dev cluster — would else each count every VM); every
    name of the job when the rank is unknown."""
    base = vm_name(grant.rms, grant.job)
    count = max(len(grant.nodes), 1)
    rank = _rank(grant)
    if rank is not None:
        return frozenset({base} if count == 1 else {member_names(base, count)[rank]})
    return frozenset({base, *member_names(base, count)})


def job_taps(grant: Grant) -> frozenset[str]:
    """The taps root makes for the job's VMs on this node (provisioning.node_service.net_rules:
    vmID = rank + 1), every tap of the job when the rank is unknown."""
    net = JobNet(network.pilot_subnet_id(grant.rms, grant.job))
    rank = _rank(grant)
    if rank is not None:
        return frozenset({net.tap(rank + 1)})
    return frozenset(net.tap(i) for i in range(1, min(len(grant.nodes), network.GATEWAY_VM_ID - 1) + 1))


def qemu_uids(grant: Grant) -> frozenset[int]:
    """The job's user, plus root and the system QEMU user (their VMs are named by root)."""
    uids = {grant.uid, 0}
    for name in SYSTEM_QEMU_USERS:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return frozenset(uids)


def _start(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    key = (grant.rms, grant.job, grant.node)
    with _lock:
        tracked = _tracked.get(key)
        if tracked is None:
            _check_room(grant.uid)
            meter = JobMeter(qemu_uids(grant), job_vm_names(grant), job_taps(grant))
            tracked = _tracked[key] = _Tracked(meter, grant.uid)
        _ensure_sampler()
    with tracked.lock:
        tracked.open = True
        count = tracked.meter.sample()
    return {"tracking": True, "processes": count, "interval_s": interval_s()}


def _check_room(uid: int) -> None:
    """Refuse a new job beyond the limits (with _lock held)."""
    if len(_tracked) >= MAX_TRACKED:
        raise InputError(f"usage.start: this node already tracks {MAX_TRACKED} jobs")
    mine = sum(1 for t in _tracked.values() if t.uid == uid)
    if mine >= MAX_TRACKED_PER_UID:
        raise InputError(
            f"usage.start: uid {uid} already has {mine} jobs tracked on this node (at most {MAX_TRACKED_PER_UID})"
        )


def _final(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    key = (grant.rms, grant.job, grant.node)
    with _lock:
        tracked = _tracked.get(key)
        if tracked is None and key in _answered:
            return dict(_answered[key])  # a repeated final: the run was closed and written
    if tracked is None:
        raise InputError(f"usage.final: job {grant.job} has no usage.start on {grant.node}: nothing was measured")
    with tracked.lock:
        if tracked.open:
            tracked.meter.sample()
            measured = tracked.meter.processes_seen > 0
            run = tracked.meter.take()
            if measured:
                tracked.pending = run if tracked.pending is None else _joined(tracked.pending, run)
            else:
                tracked.answer = {
                    "cpu_s": 0.0,
                    "peak_mib": 0,
                    "written": False,
                    "record": "",
                    "reason": f"no VM of job {grant.job} was seen on {grant.node}: nothing written",
                }
            tracked.open = False
        if tracked.pending is not None:
            tracked.answer = _write(grant.job, grant.node, tracked.pending)
            if tracked.answer["written"]:
                tracked.pending = None
        answer = dict(tracked.answer)
        if tracked.pending is None:
            _remember(key, answer)
    _forget_if_done(key)
    return answer


def _joined(a: Usage, b: Usage) -> Usage:
    """Two runs' figures not yet written, as one: CPU summed, the larger peak, both runs."""
    return Usage(cpu_s=a.cpu_s + b.cpu_s, peak_mib=max(a.peak_mib, b.peak_mib), runs=a.runs + b.runs)


def _write(job: str, node: str, run: Usage) -> dict[str, Any]:
    """Hand `run` to the RMS's writer; the answer (the error kept when it refused)."""
    answer: dict[str, Any] = {"cpu_s": run.cpu_s, "peak_mib": run.peak_mib, "written": False, "record": ""}
    if _writer is None:
        answer["reason"] = "this node service has no writer for the RMS's record"
        return answer
    try:
        answer["record"] = _writer.add(job, node, run)[:1024]
        answer["written"] = True
    except VjobError as exc:
        log.get("node-service").warning("usage not written", job=job, node=node, error=str(exc))
        answer["reason"] = f"the RMS's record was not written: {str(exc)[:300]}"
    return answer


def _remember(key: tuple[str, str, str], answer: dict[str, Any]) -> None:
    """Keep a written run's answer for a repeated usage.final (the oldest go past MAX_ANSWERS)."""
    with _lock:
        _answered.pop(key, None)
        _answered[key] = answer
        while len(_answered) > MAX_ANSWERS:
            del _answered[next(iter(_answered))]


def _forget_if_done(key: tuple[str, str, str]) -> None:
    """Drop a closed, written run whose VMs are all gone (the meter keeps nothing worth having)."""
    with _lock:
        tracked = _tracked.get(key)
        if tracked and not tracked.open and tracked.pending is None and not tracked.meter.seen:
            del _tracked[key]


# -- the sampler -------------------------------------------------------------------------------
def interval_s() -> float:
    """`[node] usage_interval_s` of the service's configuration."""
    try:
        return float(site.config().node.usage_interval_s)
    except (VjobError, AttributeError):
        return DEFAULT_INTERVAL_S


def _ensure_sampler() -> None:
    """One daemon thread samples every tracked job (started at the first usage.start; _lock held)."""
    global _sampler
    if _sampler is None or not _sampler.is_alive():
        _sampler = threading.Thread(target=_sample_forever, name="usage-sampler", daemon=True)
        _sampler.start()


def _sample_forever() -> None:
    while True:
        time.sleep(interval_s())
        sample_all()


def sample_all() -> None:
    """One round: sample each open run; write and drop a run whose VMs are gone for good."""
    with _lock:
        items = list(_tracked.items())
    for key, tracked in items:
        with tracked.lock:
            if tracked.open:
                tracked.meter.sample()
            gone = tracked.meter.idle_samples >= GONE_SAMPLES and bool(tracked.meter.seen)
            never = not tracked.meter.seen and time.monotonic() - tracked.started > NEVER_SEEN_S
            if tracked.open and gone:
                tracked.pending = tracked.meter.take()
                tracked.open = False
            if not tracked.open and tracked.pending is not None:
                if _write(key[1], key[2], tracked.pending)["written"]:
                    tracked.pending = None
            drop = never or (not tracked.open and tracked.pending is None)
        if drop:
            with _lock:
                _tracked.pop(key, None)


def tracked_jobs() -> list[tuple[str, str, str]]:
    """(rms, job, node) of every run tracked now (for tests and the service's status)."""
    with _lock:
        return sorted(_tracked)


OPERATIONS: Mapping[str, OperationSpec] = {
    "usage.start": OperationSpec(_start, {}),
    "usage.final": OperationSpec(_final, {}, deadline_s=60.0, after_end=True),
}
