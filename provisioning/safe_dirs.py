"""Cache and working directories that only their owner can change, checked before every use.

Why: root builds what every guest boots (kernel, initrd) from files in a cache. If anyone
else can write that cache, or any directory above it, or replace one of them with a symlink,
they choose what root builds — their own `/init` in every guest. So a directory root (or the
user running vjob) works in must be owned by the effective user and not writable by group
or others, and every directory above it must be owned by root or that user and not writable
by others (unless sticky, like /tmp: then nobody else can rename what we own in it). No
symlink anywhere on the path. A directory that fails is refused with the path, what is wrong
and how to fix it — never repaired silently, since what it holds can no longer be trusted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vjob.errors import VjobError


class UnsafePathError(VjobError):
    """A cache or working directory (or something in it) could have been changed by others."""


def _problem(path: Path, what: str, fix: str) -> UnsafePathError:
    return UnsafePathError(f"{path}: {what}; {fix}")


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def check_ancestors(path: Path) -> None:
    """Every existing directory above `path`: a real directory, owned by root or us, not
    writable by others unless sticky."""
    euid = os.geteuid()
    for parent in reversed(Path(os.path.abspath(path)).parents):
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise _problem(
                parent,
                "is a symlink above a vjob cache/working directory",
                f"configure the real path ({os.path.realpath(parent)}) instead",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise _problem(parent, "is not a directory", "configure another cache/working directory")
        if st.st_uid not in (0, euid):
            raise _problem(
                parent,
                f"is owned by uid {st.st_uid}, who could replace the vjob directory below it",
                "use a directory whose parents belong to root",
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _problem(
                parent,
                f"is writable by group or others (mode {_mode(st)}) and not sticky: they could replace "
                "the vjob directory below it",
                f"chmod go-w {parent}, or use another directory",
            )


def check_owned(path: Path, *, directory: bool, owners: tuple[int, ...] = ()) -> os.stat_result:
    """`path` is ours: not a symlink, a directory (or regular file), owned by the effective
    user (or one of `owners`), not writable by group or others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _problem(path, "is missing", "retry") from None
    kind = "directory" if directory else "regular file"
    if stat.S_ISLNK(st.st_mode):
        raise _problem(path, "is a symlink", f"remove it (rm {path}) and retry")
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        raise _problem(path, f"is not a {kind}", "remove it, or configure another directory")
    euid = os.geteuid()
    if st.st_uid != euid and st.st_uid not in owners:
        raise _problem(
            path,
            f"is owned by uid {st.st_uid}, not by uid {euid} which uses it",
            f"remove it, or chown {euid} it after checking its content",
        )
    if st.st_mode & 0o022:
        raise _problem(
            path,
            f"is writable by group or others (mode {_mode(st)}): its content cannot be trusted",
            f"remove it (rm -rf {path}) and retry",
        )
    return st


def ensure_dir(path: Path, mode: int = 0o755) -> Path:
    """Create `path` (and missing parents) with `mode`, or check the existing one; returns it.

    Existing parents follow `check_ancestors`; every directory created here and `path` itself
    follow `check_owned`.
    """
    path = Path(os.path.abspath(path))
    check_ancestors(path)
    missing = [p for p in (*reversed(path.parents), path) if not os.path.lexists(p)]
    for p in missing:
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            pass  # a concurrent build made it: checked below like any existing directory
        else:
            os.chmod(p, mode)  # the umask may have taken bits away
        check_owned(p, directory=True)
    check_owned(path, directory=True)
    return path


def check_tree(root: Path, *, file_owners: tuple[int, ...] = ()) -> None:
    """`root` and everything below it are ours (see `check_owned`); files may also belong to
    one of `file_owners` (libvirt gives kernel and initrd to the QEMU user while a VM runs)."""
    check_owned(root, directory=True)
    with os.scandir(root) as entries:
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                check_tree(path, file_owners=file_owners)
            else:
                check_owned(path, directory=False, owners=file_owners)
