"""The job disk: a job's working directory and description on a small ext4 disk of its VM.

Why a disk and not a shared folder: QEMU refuses to save or migrate a guest with a virtio-9p
share mounted (docs/realjobs.md shows the error), and a checkpoint must hold everything the
job has written. The job disk is the VM's second disk (vdb), a qcow2 file beside its root
overlay: it goes wherever the VM's state goes, so a job resumed on another node finds every
file it wrote before its checkpoint.

Who does what: the pilot, running as the job's user, copies the working directory (its own
files, read with its own rights) into a private staging directory and builds the disk from it
with `mkfs.ext4 -d` — nothing is mounted, no privilege is needed, and files keep their owner.
When the job ends, the files under `/work` are read back (again without mounting, by
provisioning.ext4_tree: the guest wrote that file system, so it is checked whole before anything
is written, never dumped by `debugfs rdump`) and moved over the working directory, and the exit
status is read from `/.vjob/exit`. A working directory on one of the site's filesystems (job.json
`mounts`, pilot.site_mounts) is not staged at all: the guest works in it over NFS, `/work` stays
empty and nothing comes back.

Limits (docs/realjobs.md): the working directory may hold at most `stage_limit_mb`
(provisioning.stage_limit_mb); only regular files, directories and symbolic links are staged
(sockets, FIFOs and devices are skipped and named); files changed on the host while the job
runs are overwritten by the job's copy when it ends; files the job deleted stay on the host.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from provisioning import ext4_image, ext4_tree
from provisioning.guest_agent import agent
from vjob import log, proc
from vjob.errors import InputError

CONTROL = ".vjob"
"""Directory of the job description on the disk (job.json, script, exit)."""
WORK = "work"
"""Directory of the working directory's copy on the disk."""
MAX_SCRIPT_BYTES = 4 << 20
"""Slurm's own limit for a batch script (max_script_size): 4 MiB."""
MAX_ENV_BYTES = 1 << 20
MAX_ARGS = 4096
_log = log.get("provisioning")


def _tool(name: str) -> str:
    """mkfs.ext4 lives in /usr/sbin, often not on a user's PATH (a job's)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


@dataclass(frozen=True)
class JobDescription:
    """What the guest agent needs to run the job (provisioning.guest_agent.agent.parse_job)."""

    script: bytes
    args: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    user: str
    home: str
    cwd: str
    hostname: str = "vjob"
    skipped: list[str] = field(default_factory=list)
    network: dict[str, object] | None = None
    """A multi-node job's VM: its address, its peers, the job's ssh key (agent.parse_network)."""
    mounts: dict[str, object] | None = None
    """The site's filesystems from the job's NFS gateway (pilot.site_mounts, agent.mounts)."""

    def to_json(self) -> dict[str, object]:
        return {
            "argv": ["script", *self.args],
            "env": self.env,
            "uid": self.uid,
            "gid": self.gid,
            "user": self.user,
            "home": self.home,
            "cwd": self.cwd,
            "hostname": self.hostname,
            **({"network": self.network} if self.network is not None else {}),
            **({"mounts": self.mounts} if self.mounts is not None else {}),
        }

    @property
    def in_place(self) -> bool:
        """The working directory is on one of the site's filesystems: the guest works there,
        nothing is staged (docs/realjobs.md, "Filesystems")."""
        return agent.mounts.covers(agent.mounts.parse_mounts(self.mounts), self.cwd)


def check_description(job: JobDescription) -> JobDescription:
    """Refuse what the guest would refuse, here, with the field named (before a VM boots)."""
    if len(job.script) > MAX_SCRIPT_BYTES:
        raise InputError(f"script: {len(job.script)} bytes: at most {MAX_SCRIPT_BYTES} (4 MiB)")
    if len(job.args) > MAX_ARGS:
        raise InputError(f"arguments: {len(job.args)}: at most {MAX_ARGS}")
    env_bytes = sum(len(k) + len(v) + 2 for k, v in job.env.items())
    if env_bytes > MAX_ENV_BYTES:
        raise InputError(f"environment: {env_bytes} bytes: at most {MAX_ENV_BYTES}")
    try:
        agent.parse_job(job.to_json())
        agent.mounts.parse_mounts(job.mounts)
    except (agent.JobError, agent.mounts.MountError) as exc:
        raise InputError(f"job for the guest: {exc}") from None
    return job


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `root` (not following symlinks), directories before their content."""
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise InputError(f"working directory: cannot read {directory}: {exc.strerror}") from None
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            path = Path(entry.path)
            yield path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)


def measure(workdir: Path, limit_bytes: int) -> int:
    """Bytes the working directory would put on the job disk; InputError over the limit.

    Checked before anything is copied or started: a refused job loses nothing.
    """
    total = 0
    for _path, st in _walk(workdir):
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        if total > limit_bytes:
            raise InputError(
                f"working directory {workdir}: more than {limit_bytes // 2**20} MiB to stage "
                f"(provisioning.stage_limit_mb); the job was not started and nothing was changed: "
                "run it from a smaller directory, or ask the operator to raise the limit"
            )
    return total


def _stage(workdir: Path, into: Path, staged: dict[str, list[object]]) -> list[str]:
    """Copy the working directory into `into` (files, dirs, symlinks); returns what was skipped.

    `staged` receives what each file and symlink was (size and mtime, or link target): at the
    end only what the job changed is copied back (the pilot's own output file, written while
    the job runs, is often in the working directory).
    """
    skipped: list[str] = []
    into.mkdir(mode=0o700)
    for path, st in sorted(_walk(workdir), key=lambda e: str(e[0])):
        rel = path.relative_to(workdir)
        dst = into / rel
        if stat.S_ISDIR(st.st_mode):
            dst.mkdir(mode=0o700)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(path), dst)
            staged[str(rel)] = ["link", os.readlink(path)]
        elif stat.S_ISREG(st.st_mode):
            try:
                shutil.copyfile(path, dst, follow_symlinks=False)
            except OSError as exc:
                raise InputError(f"working directory: cannot copy {path}: {exc.strerror}") from None
            staged[str(rel)] = ["file", st.st_size, int(st.st_mtime)]
        else:
            skipped.append(str(rel))
            continue
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(dst, stat.S_IMODE(st.st_mode) | (0o700 if stat.S_ISDIR(st.st_mode) else 0o600))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    for path, st in _walk(workdir):  # directory times after their content was written
        if stat.S_ISDIR(st.st_mode):
            os.utime(into / path.relative_to(workdir), ns=(st.st_atime_ns, st.st_mtime_ns))
    return skipped


def build(
    workdir: Path, job: JobDescription, out: Path, *, limit_bytes: int, free_bytes: int, for_user: bool = False
) -> list[str]:
    """Write the job disk `out` (qcow2) from `workdir` and `job`; returns skipped entries.

    `free_bytes` is room left for what the job writes (the disk is sparse: it costs nothing
    until used). Run as the job's user: the copy is made with the user's own rights.
    `for_user`: root builds it for the job's user (Saline's site master, whose `workdir` is
    its own empty directory): what is staged is given to the job's uid/gid before mkfs, as
    if the user had built it, so the job can reach its script and write its directory.
    """
    check_description(job)
    used = 0 if job.in_place else measure(workdir, limit_bytes)
    tmp = Path(tempfile.mkdtemp(prefix=".jobdisk-", dir=out.parent))
    try:
        stage = tmp / "stage"
        stage.mkdir(mode=0o700)
        staged: dict[str, list[object]] = {}
        skipped = [] if job.in_place else _stage(workdir, stage / WORK, staged)
        (stage / WORK).mkdir(mode=0o700, exist_ok=True)
        os.chmod(stage / WORK, stat.S_IMODE(workdir.stat().st_mode) | 0o700)
        control = stage / CONTROL
        control.mkdir(mode=0o700)
        (control / "staged.json").write_text(json.dumps(staged))
        (control / "job.json").write_text(json.dumps(job.to_json()))
        (control / "script").write_bytes(job.script)
        os.chmod(control / "script", 0o700)
        if for_user:
            for path in (stage, *stage.rglob("*")):
                os.chown(path, job.uid, job.gid, follow_symlinks=False)
        raw = tmp / "disk.raw"
        size_mib = (used + free_bytes) // 2**20 + 64 + used // 2**20 // 8  # + ext4's own needs
        with open(raw, "wb") as fh:
            fh.truncate(size_mib * 2**20)
        proc.run(
            [_tool("mkfs.ext4"), "-q", "-F", "-L", "vjob-job", "-d", str(stage), str(raw)],
            timeout_s=600,
            job=str(out.name),
        )
        part = out.with_name(f".{out.name}.part")
        proc.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(part)], timeout_s=600)
        os.chmod(part, 0o600)
        os.replace(part, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if skipped:
        _log.warning("special files not staged", count=len(skipped), first=skipped[0])
    return skipped


@dataclass(frozen=True)
class Results:
    """What a job left on its disk: its exit status (None if it never ended) and files copied."""

    exit_code: int | None
    files: int


def collect(disk: Path, workdir: Path, *, limit_bytes: int | None = None) -> Results:
    """Read the exit status and copy `/work` back over `workdir` (no mount; as the job's user).

    The disk is the guest's, so its tree is data (provisioning.ext4_tree): checked whole before
    anything is written — names, duplicates, loops, and apparent sizes (sparse files and every
    hard link counted whole) against `limit_bytes`, by default the disk's own capacity (what a
    job can write without holes or links). A refused tree raises InputError and changes nothing
    in `workdir`. The scratch copy is made beside the disk (the VM directory, the pilot's own).
    """
    tmp = Path(tempfile.mkdtemp(prefix=".vjob-results-", dir=disk.parent))
    try:
        raw = tmp / "disk.raw"
        proc.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], timeout_s=600)
        dumped = tmp / "out"
        dumped.mkdir(mode=0o700)
        fd = os.open(raw, os.O_RDONLY | os.O_CLOEXEC)
        try:
            image = ext4_image.Image(fd)
            exit_code = _exit_status(image.small_file((CONTROL.encode(), b"exit"), MAX_EXIT_BYTES))
            staged = _staged(image.small_file((CONTROL.encode(), b"staged.json"), MAX_STAGED_BYTES) or b"")
            limit = image.fs_bytes if limit_bytes is None else limit_bytes
            ext4_tree.extract(image, ext4_tree.scan(image, (WORK.encode(),), limit), dumped, limit)
        except InputError as exc:
            raise InputError(f"{exc} (results of {disk.name} not copied back; the disk is kept)") from None
        finally:
            os.close(fd)
        raw.unlink()
        files = _merge(dumped, workdir, staged, Path())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Results(exit_code, files)


MAX_EXIT_BYTES = 16
"""`/.vjob/exit` holds one number and a newline; anything longer is not read."""
MAX_STAGED_BYTES = 256 << 20
"""`/.vjob/staged.json` (one short entry per staged file); a bigger one counts as none."""


def _exit_status(text: bytes | None) -> int | None:
    """A number in 0..255 from the exit file, else None (the job never ended, or it is not the agent's)."""
    value = (text or b"")[: MAX_EXIT_BYTES + 1].strip()
    return int(value) if re.fullmatch(rb"[0-9]{1,3}", value) and int(value) <= 255 else None


EXIT_READ_TIMEOUT_S = 120
"""The life of the child that reads the exit file for root (SIGALRM ends it)."""


def read_exit(disk: Path, scratch_parent: Path, *, uid: int | None = None, gid: int | None = None) -> int | None:
    """The exit status the guest agent left on a job disk, read for root without root parsing
    the file system (the user could have written all of it, that file too): root makes a raw
    copy (qemu-img, no mount) and a forked child that became `uid`/`gid` (the job's user:
    ext4_tree.as_user) reads it with provisioning.ext4_tree and sends back only a regular file
    of at most MAX_EXIT_BYTES (a sparse file of terabytes is not read), which root checks again.
    `uid`/`gid` not given: the caller's own, or `nobody`'s when the caller is root.

    None unless it holds a number in 0..255 (the job never ended, or the file is not the
    agent's); InputError naming the disk when its file system is refused or the reader fails."""
    if uid is None or gid is None:
        uid, gid = _reader_ids()
    tmp = Path(tempfile.mkdtemp(prefix=".vjob-exit-", dir=scratch_parent))
    try:
        raw = tmp / "disk.raw"
        proc.run(["qemu-img", "convert", "-q", "-U", "-f", "qcow2", "-O", "raw", str(disk), str(raw)], timeout_s=600)
        fd = os.open(raw, os.O_RDONLY | os.O_CLOEXEC)
        path = (CONTROL.encode(), b"exit")
        try:
            text = ext4_tree.as_user(
                uid,
                gid,
                fd,
                lambda image_fd, out: ext4_tree.send_small_file(image_fd, path, MAX_EXIT_BYTES, out),
                lambda read: ext4_tree.receive_small_file(read, MAX_EXIT_BYTES),
                timeout_s=EXIT_READ_TIMEOUT_S,
            )
        except InputError as exc:
            raise InputError(f"{exc} (the exit status of {disk.name} is unknown)") from None
        finally:
            os.close(fd)
        return _exit_status(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _reader_ids() -> tuple[int, int]:
    """Whom the exit file is read as when the caller names no one: itself, never root."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def _staged(text: bytes) -> dict[str, list[object]]:
    """What build staged, as the guest left it (it could rewrite it): garbled means nothing
    counts as unchanged, so everything comes back."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _unchanged(entry: os.DirEntry[str], before: object) -> bool:
    """Whether the job left this file or link as it was staged (then the host's copy stays)."""
    if not isinstance(before, list) or not before:
        return False
    st = entry.stat(follow_symlinks=False)
    if before[0] == "link" and stat.S_ISLNK(st.st_mode):
        return before[1:] == [os.readlink(entry.path)]
    if before[0] == "file" and stat.S_ISREG(st.st_mode):
        return before[1:] == [st.st_size, int(st.st_mtime)]
    return False


def _merge(src: Path, dst: Path, staged: dict[str, list[object]], rel: Path) -> int:
    """Move what the job changed or created from `src` over `dst` (the job's copy wins over a
    host change made meanwhile); returns the number of files moved."""
    moved = 0
    if not src.is_dir():
        return 0
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        s, d = Path(entry.path), dst / entry.name
        s_dir = entry.is_dir(follow_symlinks=False)
        d_dir = d.is_dir() and not d.is_symlink()
        if s_dir and d_dir:
            moved += _merge(s, d, staged, rel / entry.name)
            continue
        if _unchanged(entry, staged.get(str(rel / entry.name))):
            continue
        if os.path.lexists(d):
            if d_dir:
                shutil.rmtree(d)
            else:
                d.unlink()
        shutil.move(s, d)  # a rename where the scratch copy shares the working directory's filesystem
        moved += 1
    return moved
