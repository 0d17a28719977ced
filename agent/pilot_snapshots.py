"""Record the pilots' snapshots in the store: a pilot saves its VM but has no store credentials.

Why the agent, and what it believes: a pilot's state file is written by the job's user, so
its `memory_path` is only a claim. The agent records a snapshot only when that path is exactly
the one the VM driver would use for the job's own VM (derived from the job id, never the file's
`vm` field): `<snapshot_dir>/<vm>.state` of root's configuration (a root pilot) or
`~USER/.local/share/vjob/snapshots/<vm>.state` of the job's user (a user pilot, its session
libvirt). A multi-node pilot claims its first VM's file; each other VM's (`<vm>-<rank>`, on the
node `member_nodes` gives it) is looked for in the same directory on its node, never claimed.
No component may be a symlink (the path must resolve to itself under the directory's real
path), the file is opened without following links or blocking (a FIFO never stalls the tick),
must be a regular file owned by root or the job's user; size and time come from the file.

The sha256 is never computed here (issue 39): hashing a state the user claims, inside the tick,
let one user stall every tick (a claim may be tens of GiB, and each new mtime meant a new pass).
The digest recorded is the one root took at save time — the VM driver hashes the state while
libvirt writes it and puts size and sha256 in a manifest beside it — and only when root wrote
both (file, manifest and directory root's, the manifest naming this VM and this very size). A
user pilot's state, or a manifest root did not write, is recorded with sha256 "-": where and
how big, not a digest the agent would compute from the user's file on the user's schedule.
Reading a manifest is bounded (MAX_MANIFEST_BYTES), so a tick costs an fstat per claim.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from agent.ports import Ports
from provisioning import integrity
from provisioning.vm_types import STATE_SUFFIX
from vjob.errors import InputError, VjobError
from vjob.model import Job
from vjob.pilot_files import USER_DATA_DIR, PilotState, PilotStatus, vm_name, vms_of
from vjob.store import jobs as store_jobs
from vjob.store import snapshots as store_snapshots
from vjob.store.db import Store

USER_SNAPSHOT_DIR = USER_DATA_DIR / "snapshots"
"""Under the user's home: where a user pilot puts its states (vjob.pilot_files.USER_DATA_DIR)."""
MAX_MANIFEST_BYTES = 64 * 2**10
"""A save-time manifest is a few hundred bytes; a larger file is not one (sha256 "-")."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SAVED = (PilotState.SAVED, PilotState.RESTORING)


def expected_paths(ports: Ports, job: Job, node: str, vm: str = "") -> dict[Path, Path]:
    """Where the driver puts the saved state of `job`'s VM `vm` (default: the job's one VM, its
    name derived from the job id) on `node` — root's snapshot dir first, then the job's user's
    own (a pilot that is not root) — as a pilot writes it → its real path.

    Only root's parts are resolved (the snapshot dir, the home directory from the password
    database); below the home nothing may be a link, which file_facts checks."""
    name = f"{vm or vm_name(ports.rms, job.id)}{STATE_SUFFIX}"
    prov = ports.cfg.provisioning
    root_dir = Path((prov.snapshot_dir or str(ports.cfg.data_path / "snapshots")).replace("{node}", node))
    out = {Path(os.path.normpath(root_dir / name)): Path(os.path.realpath(root_dir)) / name}
    try:
        home = Path(pwd.getpwnam(job.user).pw_dir)
    except KeyError:
        return out  # the user has no account here: its pilot's files are not reachable either
    out[Path(os.path.normpath(home / USER_SNAPSHOT_DIR / name))] = (
        Path(os.path.realpath(home)) / USER_SNAPSHOT_DIR / name
    )
    return out


def digest_at_save(path: Path, info: os.stat_result) -> str:
    """The sha256 root took of state `path` (fstat `info`) when it was saved: from the manifest
    beside it, when root wrote the state, the manifest and their directory (nobody else can write
    there) and the manifest describes this VM's state at this size; "-" otherwise. Reads at most
    MAX_MANIFEST_BYTES, never the state itself."""
    try:
        parent = os.lstat(path.parent)
        if info.st_uid != 0 or parent.st_uid != 0 or not stat.S_ISDIR(parent.st_mode) or parent.st_mode & 0o022:
            return "-"
        fd = os.open(integrity.manifest_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return "-"
    try:
        m = os.fstat(fd)
        if not stat.S_ISREG(m.st_mode) or m.st_uid != 0 or m.st_size > MAX_MANIFEST_BYTES:
            return "-"
        data = json.loads(os.read(fd, MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return "-"
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return "-"
    size, digest, vm = data.get("size_bytes"), data.get("sha256"), data.get("vm")
    if type(size) is not int or size != info.st_size or vm != path.name.removesuffix(STATE_SUFFIX):
        return "-"
    return digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else "-"


def file_facts(path: Path, owners: set[int], known: tuple[int, float] | None) -> tuple[int, float, str] | None:
    """(size, mtime, sha256) of the regular file `path` owned by one of `owners`, the sha256 the
    one root took at save time (digest_at_save, "-" without one); None when there is no such
    file, or `known` (size, mtime) is what it still is. Never reads the state's content."""
    if os.path.realpath(path) != str(path):
        raise InputError(f"snapshot {path}: a component is a symbolic link")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"snapshot {path}: cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"snapshot {path}: not a regular file")
        if st.st_uid not in owners:
            raise InputError(f"snapshot {path}: owned by uid {st.st_uid}, not by the job's user or root")
        if known is not None and known == (st.st_size, st.st_mtime):
            return None
        return st.st_size, st.st_mtime, digest_at_save(path, st)
    finally:
        os.close(fd)


def record_pilot_snapshots(ports: Ports, store: Store, rms_jobs: Sequence[Job], pilots: dict[str, PilotStatus]) -> int:
    """Record the saved states of the RMS's jobs' pilots; how many rows were written.

    A claim that fails a check is logged and skipped: one user's odd file never stops the tick.
    """
    written = 0
    for job in rms_jobs:
        st = pilots.get(job.id)
        if st is None or st.state not in _SAVED or not st.memory_path:
            continue
        vms = vms_of(st)  # names derived from the job id (agent.observe.read_pilots checked them)
        if len(vms) == 1:
            vms = [(vms[0][0], st.saved_node or st.node)]
        try:
            # The pilot claims rank 0's file; it says whose directory (root's or the user's) the
            # states are in. The other VMs' states are where the driver puts them there, on their
            # nodes: derived, never claimed.
            first = list(expected_paths(ports, job, vms[0][1], vms[0][0]))
            written_at = Path(os.path.normpath(st.memory_path))
            if written_at not in first:
                raise InputError(f"memory_path {st.memory_path[:200]!r} is not where the driver saves this job's VM")
            kind = first.index(written_at)
            owners = {0}
            try:
                owners.add(pwd.getpwnam(job.user).pw_uid)
            except KeyError:
                pass
            for vm, node in vms:
                claimed = list(expected_paths(ports, job, node, vm).values())[kind]
                facts = file_facts(claimed, owners, store_snapshots.recorded(store, str(claimed)))
                if facts is None:
                    continue
                size, mtime, digest = facts
                store_snapshots.record(
                    store,
                    store_jobs.track(store, job),
                    vm=vm,
                    node=node,
                    kind="memory",
                    path=str(claimed),
                    size_bytes=size,
                    sha256=digest,
                    created_at=mtime,
                )
                written += 1
        except VjobError as exc:
            ports.log.warning("pilot snapshot not recorded", jobs=[job.id[:64]], error=str(exc))
    return written


__all__ = ["digest_at_save", "expected_paths", "file_facts", "record_pilot_snapshots"]
