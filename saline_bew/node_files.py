"""A vjob's snapshot files on its nodes, wherever the node is: this machine or another host.

Why apart from the VMs (saline_bew.vms): a node of another site is another machine (its own
libvirtd, its own VM and snapshot directories, reached over ssh: `provisioning.hosts`), and
every step of a snapshot touches the node's files — the cut staged under its label, hashed,
sent to the repository, a resume's files fetched from a repository and checked there. Each
function here names a node and works on that node's host through provisioning.transfer, so
the same code serves the master's own node and a node across the wire.

Why each file of a resume is checked where it arrived, against the digests the journal took
at the snapshot (`check_arrived`): the memory state was always checked against its manifest
before its restore, but the manifest travels with it, and the overlay and the job disk were
not checked at all. The journal is the manager's own record, so a copy altered on the way
(in the repository, on the wire, on the node's disk) is refused before libvirt sees it; the
copies are removed from the node and the repository's snapshot stays the one to resume from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from provisioning import integrity, transfer
from provisioning.driver import Driver, SnapshotError
from provisioning.transfer import Endpoint
from provisioning.vm_types import MANIFEST_SUFFIX, OVERLAY_COPY_SUFFIX, STATE_SUFFIX, Snapshot

JOB_DISK_COPY_SUFFIX = ".job.qcow2"
"""A real image's VM: the copy of its job disk (provisioning.job_disk) in the snapshot."""
Digests = dict[str, tuple[int, str]]
"""{file name: (size, sha256)} of a snapshot's files."""


@dataclass
class Fetched:
    """What fetching a snapshot to its nodes took: the bytes moved and the time of each step."""

    bytes: int = 0
    copy_s: float = 0.0
    check_s: float = 0.0


def snapshot_files(vm: str, label: str, *, with_job_disk: bool = False) -> list[str]:
    """The files one VM's snapshot is made of, as the driver names them (and the job disk's
    copy for a real image: the job's files are part of its state)."""
    base = f"{vm}@{label}{STATE_SUFFIX}"
    files = [base, base + MANIFEST_SUFFIX, f"{vm}@{label}{OVERLAY_COPY_SUFFIX}"]
    return [*files, f"{vm}@{label}{JOB_DISK_COPY_SUFFIX}"] if with_job_disk else files


def at(driver: Driver, node: str, path: Path) -> Endpoint:
    """`path` on `node`'s machine."""
    return driver.endpoint(path, node)


def method(*ends: Endpoint) -> str:
    """The copy method between `ends`: a plain copy when all are this machine's; scp through
    this machine (`scp -3`) between two other hosts, which rsync cannot copy between (a relay
    of the gathering between nodes of two hosts); else rsync over ssh (transfer.copy copies on
    the host itself when both ends are on one other host)."""
    hosts = {e.host for e in ends}
    if hosts == {None}:
        return "local"
    return "scp" if None not in hosts and len(hosts) > 1 else "rsync"


def stage(driver: Driver, snap: Snapshot, vm: str, node: str, label: str, *, keep_state: bool) -> None:
    """Name the saved state of `vm` and a copy of its overlay `label` in the node's snapshot
    dir, with the manifest of the state, as `Driver.snapshot` names them.

    `keep_state`: the VM is restored from its state file next, so the labelled state is a hard
    link to it (one directory, no copy of the memory); otherwise the state file is moved.
    """
    names = snapshot_files(vm, label)
    stage_dir = driver.snapshot_dir(node)
    memory, overlay_copy = stage_dir / names[0], stage_dir / names[2]
    host = driver.host(node)
    overlay = at(driver, node, driver.overlay_path(vm, node))
    transfer.copy(overlay, Endpoint(overlay_copy, host), method=method(overlay))
    if host is None:
        memory.unlink(missing_ok=True)  # a label is never reused; a crashed earlier attempt may have left it
        if keep_state:
            memory.hardlink_to(snap.memory_path)
        else:
            snap.memory_path.replace(memory)
    else:  # one round trip: `ln -f` and `mv -f` replace what a crashed attempt left
        verb = "ln" if keep_state else "mv"
        transfer.run_on(host, [verb, "-f", "--", str(snap.memory_path), str(memory)])
    manifest = {
        "vm": vm,
        "node": node,
        "kind": "full",
        "size_bytes": snap.size_bytes,
        "sha256": snap.sha256,
        "created_at": snap.created_at,
        "overlay": None,
    }
    integrity.write_manifest(memory, manifest, host)


def copy_job_disk(driver: Driver, vm: str, node: str, dest_name: str) -> None:
    """The VM's job disk copied beside its staged snapshot (taken at the cut, on its node)."""
    disk = at(driver, node, driver.job_disk_path(vm, node))
    transfer.copy(disk, Endpoint(driver.snapshot_dir(node) / dest_name, disk.host), method=method(disk))


def digests(driver: Driver, node: str, names: Iterable[str]) -> Digests:
    """Size and sha256 of each staged file, computed on the node's host."""
    out: Digests = {}
    for name in names:
        where = at(driver, node, driver.snapshot_dir(node) / name)
        found = transfer.size_and_sha256(where)
        if found is None:
            raise OSError(f"staged snapshot file {where.spec()} is missing")
        out[name] = found
    return out


def drop(driver: Driver, node: str, names: Iterable[str]) -> None:
    """Remove staged files from the node's snapshot dir (one ssh round trip for another host)."""
    paths = [driver.snapshot_dir(node) / n for n in names]
    host = driver.host(node)
    if host is None:
        for p in paths:
            p.unlink(missing_ok=True)
    elif paths:
        transfer.run_on(host, ["rm", "-f", "--", *map(str, paths)])


def fetch(driver: Driver, node: str, source_dir: Path, source_host: str | None, names: list[str]) -> Fetched:
    """Copy a snapshot's files from `source_dir` (a repository, on `source_host`) into the
    node's snapshot dir; how many bytes and how long."""
    driver.ensure_dirs(node)
    moved = Fetched()
    began = time.monotonic()
    for name in names:
        src = Endpoint(source_dir / name, source_host)
        dst = at(driver, node, driver.snapshot_dir(node) / name)
        size = transfer.size(src) or 0
        moved.bytes += size
        timeout = driver.config.operation_timeout_for(size / 2**20)  # grows with the file's size
        transfer.copy(src, dst, method=method(src, dst), timeout_s=timeout)
    moved.copy_s = time.monotonic() - began
    return moved


def check_arrived(driver: Driver, vm: str, node: str, expected: Mapping[str, tuple[int, str]]) -> int:
    """Every file of `expected` in the node's snapshot dir has the size and sha256 the journal
    took at the snapshot, hashed on the node's host; its bytes in all. SnapshotError naming the
    file otherwise (the caller removes the copies; the repository's snapshot is kept)."""
    total = 0
    for name, (size, digest) in sorted(expected.items()):
        path = driver.snapshot_dir(node) / name
        integrity.check_against(vm, node, path, {"size_bytes": size, "sha256": digest}, driver.host(node))
        total += size
    return total


def expected_for(files: object, vm: str, label: str) -> dict[str, tuple[int, str]]:
    """The digests of `vm`'s files of snapshot `label`, from a journal entry's `files`; {}
    when the entry has none (a snapshot from before they were journalled: its state is still
    checked against its manifest). A malformed entry checks nothing it cannot read, and the
    state must be among them, else SnapshotError: the journal is the manager's, so a damaged
    one is a reason to stop, not to trust the copy."""
    if not isinstance(files, dict):
        return {}
    prefix = f"{vm}@{label}"
    out: dict[str, tuple[int, str]] = {}
    for name, pair in files.items():
        if not (isinstance(name, str) and name.startswith(prefix + ".")):
            continue
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int) and isinstance(pair[1], str)):
            raise SnapshotError("restore", vm, "-", f"the journal's digest of {name[:120]} is malformed")
        out[name] = (pair[0], pair[1])
    if out and prefix + STATE_SUFFIX not in out:
        raise SnapshotError("restore", vm, "-", f"the journal lists no memory state for snapshot {label}")
    return out
