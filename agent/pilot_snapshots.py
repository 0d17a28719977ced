"""Record the pilots' snapshots in the store: a pilot saves its VM but has no store credentials.

Why the agent, and what it believes: a pilot's state file is written by the job's user, so
its `memory_path` is only a claim. The agent records a snapshot only when that path is exactly
the one the VM driver would use for the job's own VM (derived from the job id, never the file's
`vm` field): `<snapshot_dir>/<vm>.state` of root's configuration (a root pilot) or
`~USER/.local/share/vjob/snapshots/<vm>.state` of the job's user (a user pilot, its session
libvirt). No component may be a symlink (the path must resolve to itself under the directory's
real path), the file is opened without following links or blocking (a FIFO never stalls the
tick), must be a regular file owned by root or the job's user, and size, time and sha256 come
from the file itself. It is hashed once per new file (size and mtime unchanged: not again).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from provisioning.vm_types import STATE_SUFFIX
from vjob.errors import InputError, VjobError
from vjob.model import Job
from vjob.pilot_files import PilotState, PilotStatus, vm_name
from vjob.store import jobs as store_jobs
from vjob.store import snapshots as store_snapshots
from vjob.store.db import Store

if TYPE_CHECKING:
    from agent.loop import Agent

USER_SNAPSHOT_DIR = Path(".local/share/vjob/snapshots")
"""Under the user's home: where agent.run_cmd.user_provisioning puts a user pilot's states."""
MAX_HASH_BYTES = 64 * 2**30
"""A larger file is not hashed (minutes of the agent's tick): recorded with sha256 "-"."""
_CHUNK = 4 * 2**20
_SAVED = (PilotState.SAVED, PilotState.RESTORING)


def expected_paths(agent: Agent, job: Job, node: str) -> dict[Path, Path]:
    """Where the driver puts the saved state of `job`'s VM on `node` — root's snapshot dir, or
    the job's user's own (a pilot that is not root) — as a pilot writes it → its real path.

    Only root's parts are resolved (the snapshot dir, the home directory from the password
    database); below the home nothing may be a link, which file_facts checks."""
    name = f"{vm_name(agent.rms, job.id)}{STATE_SUFFIX}"
    prov = agent.cfg.provisioning
    root_dir = Path((prov.snapshot_dir or str(agent.cfg.data_path / "snapshots")).replace("{node}", node))
    out = {Path(os.path.normpath(root_dir / name)): Path(os.path.realpath(root_dir)) / name}
    try:
        home = Path(pwd.getpwnam(job.user).pw_dir)
    except KeyError:
        return out  # the user has no account here: its pilot's files are not reachable either
    out[Path(os.path.normpath(home / USER_SNAPSHOT_DIR / name))] = (
        Path(os.path.realpath(home)) / USER_SNAPSHOT_DIR / name
    )
    return out


def file_facts(path: Path, owners: set[int], known: tuple[int, float] | None) -> tuple[int, float, str] | None:
    """(size, mtime, sha256) of the regular file `path` owned by one of `owners`; None when it
    is something else. `known` (size, mtime) already recorded: the hash is not recomputed."""
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
        if st.st_size > MAX_HASH_BYTES:
            return st.st_size, st.st_mtime, "-"
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
        return st.st_size, st.st_mtime, digest.hexdigest()
    finally:
        os.close(fd)


def record_pilot_snapshots(agent: Agent, store: Store, rms_jobs: Sequence[Job], pilots: dict[str, PilotStatus]) -> int:
    """Record the saved states of the RMS's jobs' pilots; how many rows were written.

    A claim that fails a check is logged and skipped: one user's odd file never stops the tick.
    """
    written = 0
    for job in rms_jobs:
        st = pilots.get(job.id)
        if st is None or st.state not in _SAVED or not st.memory_path:
            continue
        node = st.saved_node or st.node
        try:
            candidates = expected_paths(agent, job, node)
            claimed = candidates.get(Path(os.path.normpath(st.memory_path)))
            if claimed is None:
                raise InputError(f"memory_path {st.memory_path[:200]!r} is not where the driver saves this job's VM")
            owners = {0}
            try:
                owners.add(pwd.getpwnam(job.user).pw_uid)
            except KeyError:
                pass
            facts = file_facts(claimed, owners, store_snapshots.recorded(store, str(claimed)))
            if facts is None:
                continue
            size, mtime, digest = facts
            store_snapshots.record(store, store_jobs.track(store, job), vm=vm_name(agent.rms, job.id), node=node,
                                   kind="memory", path=str(claimed), size_bytes=size, sha256=digest,
                                   created_at=mtime)  # fmt: skip
            written += 1
        except VjobError as exc:
            agent.log.warning("pilot snapshot not recorded", jobs=[job.id[:64]], error=str(exc))
    return written


__all__ = ["expected_paths", "file_facts", "record_pilot_snapshots"]
