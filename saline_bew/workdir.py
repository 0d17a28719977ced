"""The submitter's working directory on the first VM's job disk, without root opening a user path.

Why the user builds it: Saline's site master runs as root, so if it read the submitter's
directory it would read with root's rights (a symlink planted to /etc/shadow would be
followed). `vjob besteffort submit` runs as the user, in their directory: it builds a job disk
from it with provisioning.job_disk (the user's own rights, the stage limit, symlinks copied as
links) and hands the manager an open file descriptor over the socket (SCM_RIGHTS). The manager
never sees a path of the user's: it copies at most `limit` bytes from the descriptor (a regular
file only) into its own root-owned directory (the copy 0600, owned by the submitter: only a
descriptor reaches it), checks it with `qemu-img info` run as the submitter (qcow2, no backing
file, no external data file, a bounded virtual size), and at the deployment has the
copy's `/work` read by a child running as the job's user (`unpacked`: root never parses the
user's file system, and writes only what the checked stream holds) into a root-owned scratch
directory from which it builds the first VM's real job disk (job_disk.build, for the user), as
for every vjob.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from provisioning import ext4_tree, job_disk
from vjob import proc
from vjob.errors import CommandError, InputError

SUFFIX = ".work.qcow2"
EXT4_MARGIN = 64 << 20
"""What ext4 and qcow2 add around the staged bytes (job_disk.build sizes the disk so)."""


def build_for_user(workdir: Path, command: list[str], out: Path, *, limit_bytes: int) -> None:
    """Run as the submitting user: the job disk of `workdir` (its /work is what the manager
    takes; its job description is the manager's own at the deployment)."""
    pw = pwd.getpwuid(os.getuid())
    job = job_disk.JobDescription(
        script=b"#!/bin/sh\n",
        args=command,
        env={},
        uid=pw.pw_uid,
        gid=pw.pw_gid,
        user=pw.pw_name,
        home=pw.pw_dir,
        cwd=pw.pw_dir,
    )
    job_disk.build(workdir, job, out, limit_bytes=limit_bytes, free_bytes=0)


def receive(fd: int, dest: Path, *, limit_bytes: int, uid: int, gid: int) -> None:
    """Copy the disk of the user `uid`/`gid` from `fd` to `dest` (in root's directory, created
    here) and check the copy as that user.

    `fd` stays open (the socket server closes it). Over the limit, not a regular file, or not
    a plain qcow2: InputError, and nothing is left at `dest`."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("working directory disk: the descriptor passed is not a regular file")
        cap = limit_bytes + EXT4_MARGIN
        out = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            ids = _tool_ids(out, uid, gid)
            copied = 0
            while chunk := os.pread(fd, 1 << 20, copied):
                copied += len(chunk)
                if copied > cap:
                    raise InputError(
                        f"working directory: its disk is over {cap >> 20} MiB (provisioning.stage_limit_mb "
                        f"= {limit_bytes >> 20}): run from a smaller directory"
                    )
                os.write(out, chunk)
            _check(out, cap, ids)
        finally:
            os.close(out)
    except OSError as exc:  # a descriptor opened for writing only, or O_PATH
        dest.unlink(missing_ok=True)
        raise InputError(f"working directory disk: cannot read the descriptor passed: {exc.strerror}") from None
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def _tool_ids(fd: int, uid: int, gid: int) -> tuple[int, int] | None:
    """Hand root's file at `fd` to the user `uid`/`gid` (owner-only: its directory is root's,
    so only a descriptor reaches it) and say as whom qemu-img runs on it: as that user, so a
    flaw in qemu-img's parsing of the user's image runs with the user's rights, never root's. A
    manager that is not root runs it as itself."""
    if os.geteuid() != 0:
        return None
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o600)
    return uid, gid


def _check(fd: int, cap: int, ids: tuple[int, int] | None) -> None:
    """`qemu-img info` (as the user `ids`) on the copy at `fd`, never on the user's path: a
    backing file or an external data file would point QEMU at another file, so neither is
    allowed."""
    try:
        info = json.loads(
            proc.run(
                ["qemu-img", "info", "-f", "qcow2", "--output=json", f"/proc/self/fd/{fd}"],
                timeout_s=60,
                as_ids=ids,
                pass_fds=(fd,),
            )
        )
    except (CommandError, ValueError) as exc:
        raise InputError(f"working directory disk: not a qcow2 image ({str(exc)[:200]})") from None
    data = (info.get("format-specific") or {}).get("data") or {}
    if info.get("format") != "qcow2" or info.get("backing-filename") or data.get("data-file"):
        raise InputError("working directory disk: must be a plain qcow2 (no backing file, no data file)")
    if int(info.get("virtual-size", 0)) > 2 * cap:
        raise InputError(f"working directory disk: virtual size {info.get('virtual-size')} over {2 * cap} bytes")


@contextlib.contextmanager
def unpacked(copy: Path, scratch_parent: Path, *, uid: int, gid: int, limit_bytes: int) -> Iterator[Path]:
    """The `/work` of a received disk in a root-owned scratch directory under `scratch_parent`
    (removed on exit), without root parsing the user's file system.

    The job's user converts the checked qcow2 copy to raw (qemu-img as `uid`/`gid`, on
    descriptors of root's files, as `_check` reads it), then a
    child that dropped to the job's `uid`/`gid` (ext4_tree.as_user: no groups, no other
    descriptor, not dumpable: a fork, no exec, and PR_SET_DUMPABLE 0 after setuid, so the user's
    own processes cannot trace it or open its /proc files) reads the ext4 with
    provisioning.ext4_tree and streams what it found; root writes only what that stream holds
    and checks every frame again (ext4_tree.receive: names without `/` or `..`, no duplicates,
    directories, files and links only, created `O_EXCL|O_NOFOLLOW` under directories it made,
    at most `limit_bytes` counting every sparse file and hard link whole). A refused disk
    raises InputError and leaves nothing."""
    tmp = Path(tempfile.mkdtemp(prefix=".vjob-work-", dir=scratch_parent))
    try:
        raw = tmp / "disk.raw"
        _convert_as(copy, raw, uid, gid)
        work = tmp / job_disk.WORK
        work.mkdir(mode=0o700)
        fd = os.open(raw, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _unpack_as(uid, gid, fd, work, limit_bytes)
        finally:
            os.close(fd)
        raw.unlink()
        yield work
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_as(copy: Path, raw: Path, uid: int, gid: int) -> None:
    """qemu-img convert of root's copy to root's new `raw`, run as `uid`/`gid` on descriptors
    (the user cannot reach either path; both files become the user's, owner-only)."""
    src = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.open(raw, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            ids = _tool_ids(src, uid, gid)
            _tool_ids(dst, uid, gid)
            proc.run(
                [
                    "qemu-img",
                    "convert",
                    "-q",
                    "-f",
                    "qcow2",
                    "-O",
                    "raw",
                    f"/proc/self/fd/{src}",
                    f"/proc/self/fd/{dst}",
                ],
                timeout_s=600,
                as_ids=ids,
                pass_fds=(src, dst),
            )
        finally:
            os.close(dst)
    finally:
        os.close(src)


UNPACK_TIMEOUT_S = 600
"""The unprivileged reader's whole life (SIGALRM ends it): a crafted disk cannot hold root."""


def _unpack_as(uid: int, gid: int, image_fd: int, dest: Path, limit_bytes: int) -> None:
    """Read the raw image at `image_fd` as `uid`/`gid` in a child (ext4_tree.as_user) and write
    its /work under `dest` here, from the stream checked again (see `unpacked`)."""
    try:
        ext4_tree.as_user(
            uid,
            gid,
            image_fd,
            lambda fd, out: ext4_tree.send(fd, (job_disk.WORK.encode(),), limit_bytes, out),
            lambda read: ext4_tree.receive(read, dest, limit_bytes),
            timeout_s=UNPACK_TIMEOUT_S,
        )
    except InputError as exc:
        raise InputError(f"working directory: {exc} (provisioning.stage_limit_mb = {limit_bytes >> 20})") from None
