"""What COMMAND printed, kept for its user past the VMs that printed it.

Why here and committed at snapshots: a real image's first VM writes COMMAND's stdout and
stderr to two serial ports that libvirt logs beside its overlay on the node, and that log is
deleted with the VM (a kill, a suspension, a move). A vjob resumed from a snapshot runs again
what it ran after that snapshot, so only what was printed before a *safe* snapshot is the
vjob's for good. At each safe snapshot the manager appends what the first VM's logs gained
since the last one (up to their size at the cut) to root's own copy, and at the end the rest;
the user reads it through the socket (`vjob besteffort output`, an open descriptor passed with
SCM_RIGHTS), and the vjob's last OAR job prints it into OAR's own output files. Root never
writes where a user can reach: the copy is in `DATA_DIR/saline-output`, 0700.

Idempotent against a manager dying between the append and the journal entry: each commit
first cuts the copy back to the size the journal last recorded, so bytes are never doubled.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from provisioning import safe_dirs
from saline_bew import journal, phases
from saline_bew.events import EventKind
from saline_bew.journal import SalineJob
from saline_bew.ports import Ports
from vjob import log
from vjob.errors import VjobError

_log = log.get("saline")
STREAMS = ("stdout", "stderr")
LIMIT_BYTES = 64 << 20
"""Most kept per stream and vjob: the rest is dropped (and the journal says so)."""
KEEP_S = 7 * 86400.0
"""How long a finished vjob's output is kept for its user."""
CHUNK = 1 << 20


def path(out_dir: Path, key: str, stream: str) -> Path:
    if stream not in STREAMS:
        raise ValueError(f"stream {stream!r}")
    return out_dir / f"{key}.{stream}"


def commit(log_path: Path, start: int, end: int | None, dest: Path, committed: int) -> tuple[int, bool]:
    """Append `log_path[start:end]` (end None: to its end) to `dest`, first cut back to
    `committed` bytes. (dest's new size, whether the limit dropped some of it). A missing log
    (a guest without output ports, a node that lost it) adds nothing."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{dest}: not a regular file")
        size = min(committed, os.fstat(fd).st_size)
        os.ftruncate(fd, size)
        try:
            src = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return size, False
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):
                return size, False
            stop = os.fstat(src).st_size if end is None else end
            offset = start
            while offset < stop and size < LIMIT_BYTES:
                chunk = os.pread(src, min(CHUNK, stop - offset, LIMIT_BYTES - size), offset)
                if not chunk:
                    break
                os.pwrite(fd, chunk, size)
                offset += len(chunk)
                size += len(chunk)
            return size, offset < stop
        finally:
            os.close(src)
    finally:
        os.close(fd)


def prune(out_dir: Path, *, active: set[str], now: float | None = None) -> list[str]:
    """Remove output files older than KEEP_S of vjobs no longer active; the names removed."""
    if not out_dir.is_dir():
        return []
    limit = (time.time() if now is None else now) - KEEP_S
    gone = []
    for entry in os.scandir(out_dir):
        key = entry.name.split(".", 1)[0]
        if key in active or not entry.is_file(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_mtime < limit:
            Path(entry.path).unlink(missing_ok=True)
            gone.append(entry.name)
    if gone:
        _log.info("old vjob output removed", count=len(gone))
    return gone


def log_sizes(ports: Ports, job: SalineJob) -> list[int]:
    """Sizes of the first VM's stdout and stderr logs on its node (0: none)."""
    sizes = []
    for log_path in ports.vms.output_logs(job.vm_names[0], job.hosts[0]):
        try:
            sizes.append(os.stat(log_path, follow_symlinks=False).st_size)
        except FileNotFoundError:
            sizes.append(0)
    return sizes


def keep(ports: Ports, job: SalineJob, upto: list[int] | None) -> dict[str, object]:
    """Append to root's copy of the vjob's output what the first VM's logs gained since the
    last safe point of this deployment, up to `upto` (a snapshot's cut) or their end (COMMAND
    ended). The journal detail: `output_at` (the logs' offsets now covered) and
    `output_bytes` (the copy's sizes). Never fails the snapshot or the end: a problem is
    logged and said in `output_error`."""
    if not job.hosts:
        return {}
    base, committed = _journalled(journal.events(ports.store, job.key))
    try:
        where = safe_dirs.ensure_dir(ports.output_dir, 0o700)
        logs = ports.vms.output_logs(job.vm_names[0], job.hosts[0])
        sizes, dropped = [], False
        for i, stream in enumerate(STREAMS):
            end = upto[i] if upto else None
            size, cut = commit(logs[i], base[i], end, path(where, job.key, stream), committed[i])
            sizes.append(size)
            dropped = dropped or cut
    except (OSError, VjobError) as exc:
        _log.error("vjob output not kept", jobs=[job.key], error=str(exc)[:300])
        return {"output_error": str(exc)[:300]}
    detail: dict[str, object] = {"output_bytes": sizes}
    if upto:
        detail["output_at"] = list(upto)
    if dropped:
        detail["output_truncated"] = LIMIT_BYTES
    return detail


def _journalled(events: list[journal.Event]) -> tuple[list[int], list[int]]:
    """(the logs' offsets the last safe snapshot of this deployment covered, the copy's sizes
    the journal last recorded), per stream."""
    base, committed = [0, 0], [0, 0]
    for ev in reversed(events):
        if ev.kind in phases.DEPLOY_EVENTS:
            break
        if ev.kind == EventKind.SNAPSHOT and _pair(ev.detail.get("output_at")):
            base = list(ev.detail["output_at"])
            break
    for ev in reversed(events):
        if _pair(ev.detail.get("output_bytes")):
            committed = list(ev.detail["output_bytes"])
            break
    return base, committed


def _pair(value: object) -> bool:
    """Two non-negative byte counts (stdout, stderr), as the journal keeps output offsets."""
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value)


def open_copy(ports: Ports, key: str, stream: str) -> int:
    """An open read-only descriptor of root's copy of `key`'s output (for the socket server,
    which checked the caller owns the vjob). What a safe snapshot covers while it runs,
    everything once it finished; kept `KEEP_S` after the end."""
    try:
        return os.open(path(ports.output_dir, key, stream), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # nothing printed (yet)
