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

from provisioning import transfer
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
    where = transfer.Endpoint(path, host).spec()
    size = transfer.size(transfer.Endpoint(path, host))
    if size is None:
        raise SnapshotError("restore", vm, node, f"snapshot {where} is missing")
    if "size_bytes" in expected and size != int(expected["size_bytes"]):
        raise SnapshotError(
            "restore", vm, node, f"snapshot {where} is {size} bytes, {expected['size_bytes']} were recorded"
        )
    digest = transfer.sha256(transfer.Endpoint(path, host))
    if "sha256" in expected and digest != expected["sha256"]:
        raise SnapshotError(
            "restore",
            vm,
            node,
            f"snapshot {where} is corrupt: sha256 {digest[:12]}…, recorded {str(expected['sha256'])[:12]}…",
        )
