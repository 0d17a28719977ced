"""The submission directory of a vjob admitted by OAR's rule: waited for, then received.

Why a wait at all: a user who typed `oarsub` never ran `vjob besteffort submit` in their
directory, so nobody handed the manager its job disk (saline_bew.workdir). The holder, which
OAR starts in that directory as the user, sends it over the manager's socket before the first
deployment; the manager waits for it a bounded time, and journals why COMMAND starts in an
empty home when it does not come.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from saline_bew import journal, phases
from saline_bew.events import EventKind
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from vjob import log
from vjob.errors import InputError

_log = log.get("saline")
STAGE_WAIT_S = 60.0
"""An admitted vjob on a real image: longest wait, once its OAR job runs, for the holder to
send the submission directory before the first deployment (then COMMAND starts in an empty
home, with the reason journalled)."""


def receive(ports: Ports, key: str, fd: int | None, *, reason: str = "") -> SalineJob:
    """The holder of an admitted vjob sends its submission directory (a job disk it built as
    the user, as `vjob besteffort submit` does), or says why it sends none (`fd` None): before
    the first deployment only; the manager stops waiting for it either way."""
    job = journal.get(ports.store, key)
    kinds = [e.kind for e in journal.events(ports.store, key)]
    if EventKind.ADMITTED not in kinds:
        raise InputError(f"best-effort vjob {key}: not submitted with oarsub (submit sent its directory)")
    if any(k in phases.DEPLOY_EVENTS for k in kinds) or not job.active:
        raise InputError(f"best-effort vjob {key}: too late, its VMs started without the directory")
    if EventKind.WORKDIR_STAGED in kinds or ports.vms.work_path(key).exists():
        raise InputError(f"best-effort vjob {key}: its directory was sent already")
    received = ports.vms.receive_work(fd, job.user) if fd is not None else None  # outside the lock: a copy
    try:
        with ports.lock:
            ports.take(key)
            if any(e.kind in phases.DEPLOY_EVENTS for e in journal.events(ports.store, key)):
                raise InputError(f"best-effort vjob {key}: too late, its VMs started without the directory")
            if received is None:
                return ports.record(key, EventKind.WORKDIR_NOT_STAGED, {"reason": f"the holder: {reason[:300]}"})
            size = received.stat().st_size
            os.replace(received, ports.vms.work_path(key))
            received = None
            _log.info("submission directory received from the holder", jobs=[key], bytes=size)
            return ports.record(key, EventKind.WORKDIR_STAGED, {"bytes": size})
    finally:
        if received is not None:
            received.unlink(missing_ok=True)


def awaiting(ports: Ports, job: SalineJob, node: str) -> bool:
    """An admitted vjob on a real image, about to deploy for the first time: wait (each pass,
    at most STAGE_WAIT_S) for its holder to send the submission directory."""
    events = journal.events(ports.store, job.key)
    kinds = {e.kind for e in events}
    done = {*phases.DEPLOY_EVENTS, EventKind.WORKDIR_STAGED, EventKind.WORKDIR_NOT_STAGED}
    if EventKind.ADMITTED not in kinds or kinds & done:
        return False
    if ports.vms.work_path(job.key).exists() or not ports.real(job, node):
        return False
    if not reaches_socket(ports.vms.driver.uri(node)):
        why = f"the holder runs on {node}, another host: it cannot reach this manager's socket"
        ports.record(job.key, EventKind.WORKDIR_NOT_STAGED, {"reason": why})
        return False
    since = next((e.at for e in events if e.kind == EventKind.WAITING_FOR_WORKDIR), None)
    if since is None:
        ports.record(job.key, EventKind.WAITING_FOR_WORKDIR, {"at_most_s": STAGE_WAIT_S})
        return True
    if ports.clock() - since < STAGE_WAIT_S:
        return True
    why = f"the holder sent no directory within {STAGE_WAIT_S:.0f} s: COMMAND starts in an empty home"
    ports.record(job.key, EventKind.WORKDIR_NOT_STAGED, {"reason": why})
    _log.warning("deploying without the submission directory", jobs=[job.key], reason=why)
    return False


def reaches_socket(uri: str) -> bool:
    """Whether a process on the node of libvirt `uri` can use this host's Unix socket (and pass
    descriptors over it): only on this very host. The holder runs on the job's first node."""
    host = urlsplit(uri).hostname
    return host in (None, "", "localhost", "127.0.0.1", socket.gethostname())
