"""Integrity manifests of saved VM states: size and sha256 written beside the file, checked
before any restore.

Why a manifest beside the file as well as the store row: a restore must be refused on a
missing or altered state even when no store is configured (Saline's repository, `vjob vm`),
and the manifest travels with the file when it is copied to another node. Manifests are
0600 like the states they describe, and written to a temporary name then renamed, so a
crash never leaves half a manifest that would describe nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from provisioning import file_batch, transfer
from provisioning.vm_types import MANIFEST_SUFFIX, SnapshotError
from vjob.errors import VjobError

UNREADABLE = {"sha256": "unreadable manifest"}
"""What an unreadable manifest reads as: it matches no file, so the restore is refused."""


def manifest_path(path: Path) -> Path:
    """The manifest of the state file `path`: the same name plus `.json`."""
    return path.with_name(path.name + MANIFEST_SUFFIX)


def read_manifest(path: Path, host: str | None = None) -> dict[str, Any] | None:
    """The manifest of `path` on `host` (None: this machine); None when there is none,
    `UNREADABLE` when it is garbage or too large to be one."""
    try:
        text = transfer.read_text(transfer.Endpoint(manifest_path(path), host))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, VjobError):
        return dict(UNREADABLE)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return dict(UNREADABLE)
    return data if isinstance(data, dict) else dict(UNREADABLE)


def write_manifest(path: Path, data: dict[str, Any], host: str | None = None) -> None:
    """Write the manifest of `path` on `host` (0600, atomically)."""
    transfer.write_text(transfer.Endpoint(manifest_path(path), host), json.dumps(data, indent=1), mode=0o600)


def check_against(vm: str, node: str, path: Path, expected: dict[str, Any], host: str | None = None) -> None:
    """Raise SnapshotError unless `path` exists on `host` with the recorded size and sha256.

    Size and hash are computed where the file is (over ssh for another host): a copy is
    judged by the bytes that arrived, never by the source's file seen through a local path.
    """
    judge(vm, node, transfer.Endpoint(path, host), transfer.size_and_sha256(transfer.Endpoint(path, host)), expected)


def judge(
    vm: str, node: str, target: transfer.Endpoint, found: tuple[int, str] | None, expected: dict[str, Any]
) -> None:
    """Raise SnapshotError naming `target` unless `found` (its size and sha256 as computed where
    it is, None: missing) is what `expected` records."""
    where = target.spec()
    if found is None:
        raise SnapshotError("restore", vm, node, f"snapshot {where} is missing")
    size, digest = found
    if "size_bytes" in expected and size != int(expected["size_bytes"]):
        raise SnapshotError(
            "restore", vm, node, f"snapshot {where} is {size} bytes, {expected['size_bytes']} were recorded"
        )
    if "sha256" in expected and digest != expected["sha256"]:
        raise SnapshotError(
            "restore",
            vm,
            node,
            f"snapshot {where} is corrupt: sha256 {digest[:12]}…, recorded {str(expected['sha256'])[:12]}…",
        )


DISKS = "disks"
"""The manifest's key for the VM's disks at save time: {role: {path, size_bytes, sha256}}."""
DISK_ROLES = ("overlay", "job_disk")


def disk_digests(paths: dict[str, Path], host: str | None = None) -> dict[str, dict[str, Any]]:
    """Size and sha256 of each of the saved VM's disks that exists, hashed on `host`.

    Why at save time: a saved VM's overlay and job disk do not change until it runs again, and
    they travel with its memory state to another node; the state alone being checked there,
    a corrupted overlay copy would start a guest on a damaged disk. Recorded beside the state,
    they are checked on arrival like the state (`check_disks`)."""
    digests: dict[str, dict[str, Any]] = {}
    found = file_batch.found(host, [(path, True) for path in paths.values()])  # one ssh round trip for all
    for (role, path), got in zip(paths.items(), found, strict=True):
        if got is not None:
            digests[role] = {"path": str(path), "size_bytes": got[0], "sha256": got[1]}
    return digests


def recorded_disks(manifest: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The disk digests of a manifest, each well formed (a manifest from before they were
    recorded has none: its disks are then not checked, as before)."""
    raw = manifest.get(DISKS) if manifest else None
    if not isinstance(raw, dict):
        return {}
    disks: dict[str, dict[str, Any]] = {}
    for role in DISK_ROLES:
        entry = raw.get(role)
        if not isinstance(entry, dict):
            continue
        size, digest = entry.get("size_bytes"), entry.get("sha256")
        if isinstance(size, int) and isinstance(digest, str):
            disks[role] = {"size_bytes": size, "sha256": digest}
    return disks


def check_disks(
    vm: str, node: str, recorded: dict[str, dict[str, Any]], paths: dict[str, Path], host: str | None = None
) -> None:
    """Raise SnapshotError (naming the disk) unless each recorded disk is at `paths` on `host`
    with the size and sha256 it had when the VM was saved. All of them hashed where they are,
    in one ssh round trip for another host (`file_batch.found`)."""
    roles = [role for role in recorded if role in paths]
    found = file_batch.found(host, [(paths[role], True) for role in roles])
    for role, got in zip(roles, found, strict=True):
        judge(vm, node, transfer.Endpoint(paths[role], host), got, recorded[role])
