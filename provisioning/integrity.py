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
import os
from pathlib import Path
from typing import Any

from provisioning import transfer
from provisioning.vm_types import MANIFEST_SUFFIX, SnapshotError

UNREADABLE = {"sha256": "unreadable manifest"}
"""What an unreadable manifest reads as: it matches no file, so the restore is refused."""


def manifest_path(path: Path) -> Path:
    """The manifest of the state file `path`: the same name plus `.json`."""
    return path.with_name(path.name + MANIFEST_SUFFIX)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of `path`; None when there is none, `UNREADABLE` when it is garbage."""
    try:
        data = json.loads(manifest_path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return dict(UNREADABLE)
    return data if isinstance(data, dict) else dict(UNREADABLE)


def write_manifest(path: Path, data: dict[str, Any]) -> None:
    """Write the manifest of `path` (0600, atomically)."""
    target = manifest_path(path)
    tmp = target.with_name(target.name + ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, target)


def check_against(vm: str, node: str, path: Path, expected: dict[str, Any]) -> None:
    """Raise SnapshotError unless `path` exists with the recorded size and sha256."""
    if not path.exists():
        raise SnapshotError("restore", vm, node, f"snapshot {path} is missing")
    size = path.stat().st_size
    if "size_bytes" in expected and size != int(expected["size_bytes"]):
        raise SnapshotError(
            "restore", vm, node, f"snapshot {path} is {size} bytes, {expected['size_bytes']} were recorded"
        )
    digest = transfer.sha256_file(path)
    if "sha256" in expected and digest != expected["sha256"]:
        raise SnapshotError(
            "restore",
            vm,
            node,
            f"snapshot {path} is corrupt: sha256 {digest[:12]}…, recorded {expected['sha256'][:12]}…",
        )
