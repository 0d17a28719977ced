"""Whether a member pilot's working directory is its leader's (per-node pilots, no shared filesystem).

Why a probe rather than comparing paths: srun starts a member in the batch step's directory
*path*, which on a node without a shared filesystem is another directory of the same name (a
node-local /home), or missing — then slurmstepd starts the member in /tmp instead, and a member
building its job disk from there would stage /tmp into the job's VM. Only a file the leader just
made, seen by the member with the same random content, proves one directory. The leader makes it
with O_EXCL|O_NOFOLLOW under a descriptor of its own working directory and removes it before any
job disk is built from that directory; the member opens its own current directory (never a path
the user could point elsewhere: the kernel's name for it, `os.getcwd`, opened O_NOFOLLOW) and
reads the probe with O_NOFOLLOW, so neither side follows a user's symlink, whoever it runs as.
The same question the driver asks of a VM directory (`disk_placement.shares_dir`), of the job's files.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

PREFIX = ".vjob-probe-"
_NAME = re.compile(r"\.vjob-probe-[0-9a-f]{32}")
_NONCE = re.compile(r"[0-9a-f]{64}")


@dataclass
class Probe:
    """A probe file in the leader's working directory, until `remove`."""

    dir_fd: int
    name: str
    nonce: str

    def remove(self) -> None:
        try:
            os.unlink(self.name, dir_fd=self.dir_fd)
        except OSError:
            pass
        finally:
            os.close(self.dir_fd)


def leave_probe(cwd: str) -> Probe | None:
    """A probe in the leader's working directory `cwd`; None when it cannot be made there
    (read-only, gone): the member then cannot be shown the directory and gets its job disk sent."""
    try:
        dfd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    name, nonce = PREFIX + secrets.token_hex(16), secrets.token_hex(32)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError:
        os.close(dfd)
        return None
    try:
        os.write(fd, nonce.encode())
    finally:
        os.close(fd)
    return Probe(dfd, name, nonce)


def sees_probe(workdir: Path | None, cwd: str, name: object, nonce: object) -> tuple[bool, str]:
    """(True, "") when this member's own working directory `workdir` is the leader's `cwd`:
    the same path, and the leader's probe there with its content; else (False, why) for the log."""
    if workdir is None:
        return False, "this member has no working directory (its node lacks the batch step's)"
    if str(workdir) != cwd:
        return False, f"this member runs in {str(workdir)[:200]}, not {cwd[:200]} (the node lacks it)"
    if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(nonce, str):
        return False, "the leader left no probe in its working directory"
    if not _NONCE.fullmatch(nonce):
        return False, "the leader's probe content is not 64 hex digits"
    try:
        dfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"{str(workdir)[:200]}: {exc.strerror}"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return False, f"{cwd[:200]} here is another directory of the same name (no shared filesystem)"
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False, "the probe here is not a regular file"
        seen = os.read(fd, 128)
    finally:
        os.close(fd)
    if not secrets.compare_digest(seen, nonce.encode()):
        return False, f"{cwd[:200]} here holds another probe: another directory of the same name"
    return True, ""


def own_workdir() -> Path | None:
    """This process's working directory as the kernel names it (no symlink in it); None if gone."""
    try:
        return Path(os.getcwd())
    except OSError:
        return None
