"""What `vjob deploy install` put where: the record `vjob uninstall` removes from.

Why a record and not the catalogue's usual places: an operator installs some files and not
others, into their usual places or under a staging root, and edits some afterwards (vjob.toml
always). The record keeps, per installed path, the catalogue name and the SHA-256 of what was
written, so uninstall removes exactly what vjob wrote and tells an edited file (kept unless
`--purge`) from one of its own. It lives in `<root>/var/lib/vjob/deployed.json` (mode 0600,
root's), written whole and renamed, so a crash never leaves half a record.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from vjob.errors import InputError

MANIFEST = Path("var/lib/vjob/deployed.json")
"""The record, relative to the root deploy installed under ("/" on a real host)."""
MAX_BYTES = 1 << 20


def manifest_path(root: Path) -> Path:
    return root / MANIFEST


def under(root: Path, target: str) -> Path:
    """A catalogue target (an absolute path) under `root`."""
    return root / target.lstrip("/")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entries(root: Path) -> dict[str, dict[str, Any]]:
    """Path → {"name", "sha256", "at"} of every file recorded under `root` ({} when none)."""
    path = manifest_path(root)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InputError(f"{path}: cannot read the deploy record: {exc.strerror}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise InputError(f"{path}: not a deploy record (invalid JSON)") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if len(raw) > MAX_BYTES or not isinstance(files, dict):
        raise InputError(f"{path}: not a deploy record")
    return {str(k): v for k, v in files.items() if isinstance(v, dict) and isinstance(v.get("sha256"), str)}


def _write(root: Path, files: dict[str, dict[str, Any]]) -> None:
    path = manifest_path(root)
    if not files:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"files": files}, out, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record(root: Path, name: str, path: Path) -> None:
    """Note that `vjob deploy install` wrote (or found unchanged) catalogue file `name` at `path`."""
    files = entries(root)
    files[str(path)] = {"name": name, "sha256": digest(path), "at": time.time()}
    _write(root, files)


def forget(root: Path, paths: list[str]) -> None:
    """Drop `paths` from the record (the file of the record goes when it is empty)."""
    files = entries(root)
    for p in paths:
        files.pop(p, None)
    _write(root, files)


__all__ = ["MANIFEST", "digest", "entries", "forget", "manifest_path", "record", "under"]
