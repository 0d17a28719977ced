"""Copying files between nodes: local copy, rsync or scp, chosen by configuration.

Why pluggable: on one machine (and in tests) every node sees the same filesystem and a local
copy is the physical limit; on a cluster, memory states, overlays and OS images travel over
ssh. All three write to a temporary name first and rename at the end, so a copy cut in half
never looks complete, and keep owner-only permissions on what holds users' memory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vjob import proc
from vjob.errors import InputError, VjobError

Method = Literal["local", "rsync", "scp"]
METHODS: tuple[str, ...] = ("local", "rsync", "scp")


@dataclass(frozen=True)
class Endpoint:
    """A file on a node: `host` None means this machine."""

    path: Path
    host: str | None = None

    def spec(self) -> str:
        return str(self.path) if self.host is None else f"{self.host}:{self.path}"


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"copy method {method!r}: must be one of {', '.join(METHODS)}")


def same_file(src: Endpoint, dst: Endpoint) -> bool:
    """True when both ends name one file (nodes sharing a filesystem): nothing to copy."""
    if src.host != dst.host:
        return False
    if src.host is None:
        try:
            return src.path.resolve() == dst.path.resolve()
        except OSError:
            return False
    return src.path == dst.path


def copy(src: Endpoint, dst: Endpoint, *, method: str = "local", mode: int = 0o600, timeout_s: float = 600.0) -> None:
    """Copy `src` to `dst` with `method`; the destination gets `mode` (0600 by default)."""
    _check_method(method)
    if same_file(src, dst):
        return
    if method == "local" or (src.host is None and dst.host is None):
        _copy_local(src.path, dst.path, mode)
        return
    tmp = Endpoint(dst.path.with_name(f".{dst.path.name}.part"), dst.host)
    if method == "rsync":
        cmd = ["rsync", "--partial", "--inplace", f"--chmod=F{mode:o}", "-t", src.spec(), tmp.spec()]
    else:
        cmd = ["scp", "-q", "-B", "-p", *(["-3"] if src.host and dst.host else []), src.spec(), tmp.spec()]
    _run(cmd, timeout_s)
    if dst.host is None:
        os.chmod(tmp.path, mode)
        os.replace(tmp.path, dst.path)
    else:
        run_on(dst.host, ["chmod", f"{mode:o}", str(tmp.path)], timeout_s=timeout_s)
        run_on(dst.host, ["mv", "-f", str(tmp.path), str(dst.path)], timeout_s=timeout_s)


def _copy_local(src: Path, dst: Path, mode: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            shutil.copyfileobj(fin, fout, 4 << 20)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove(target: Endpoint, *, timeout_s: float = 60.0) -> None:
    """Delete a file on a node; a file already gone is fine (idempotent)."""
    if target.host is None:
        target.path.unlink(missing_ok=True)
        return
    run_on(target.host, ["rm", "-f", str(target.path)], timeout_s=timeout_s)


def exists(target: Endpoint, *, timeout_s: float = 60.0) -> bool:
    """Whether a file is there on its node (`test -e` over ssh for a remote one)."""
    if target.host is None:
        return target.path.exists()
    try:
        run_on(target.host, ["test", "-e", str(target.path)], timeout_s=timeout_s)
    except VjobError:
        return False
    return True


def run_on(host: str, argv: list[str], *, timeout_s: float = 60.0) -> None:
    """Run a command on `host` over ssh (no password prompt); arguments are our own paths."""
    _run(["ssh", "-o", "BatchMode=yes", host, "--", *argv], timeout_s)


def _run(cmd: list[str], timeout_s: float) -> None:
    proc.run(cmd, timeout_s=timeout_s)


def sha256_file(path: Path, *, chunk: int = 4 << 20) -> str:
    """The SHA-256 of a file, read in chunks (memory states are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
