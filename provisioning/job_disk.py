"""The job disk: a job's working directory and description on a small ext4 disk of its VM.

Why a disk and not a shared folder: QEMU refuses to save or migrate a guest with a virtio-9p
share mounted (docs/realjobs.md shows the error), and a checkpoint must hold everything the
job has written. The job disk is the VM's second disk (vdb), a qcow2 file beside its root
overlay: it goes wherever the VM's state goes, so a job resumed on another node finds every
file it wrote before its checkpoint.

Who does what: the pilot, running as the job's user, copies the working directory (its own
files, read with its own rights) into a private staging directory and builds the disk from it
with `mkfs.ext4 -d` — nothing is mounted, no privilege is needed, and files keep their owner.
When the job ends, the files under `/work` are read back with `debugfs rdump` (again without
mounting) and moved over the working directory, and the exit status is read from
`/.vjob/exit`.

Limits (docs/realjobs.md): the working directory may hold at most `stage_limit_mb`
(provisioning.stage_limit_mb); only regular files, directories and symbolic links are staged
(sockets, FIFOs and devices are skipped and named); files changed on the host while the job
runs are overwritten by the job's copy when it ends; files the job deleted stay on the host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from provisioning.guest_agent import agent
from vjob import log, proc
from vjob.errors import CommandError, InputError, VjobError

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
    """mkfs.ext4 and debugfs live in /usr/sbin, often not on a user's PATH (a job's)."""
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
        }


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
    except agent.JobError as exc:
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
    used = measure(workdir, limit_bytes)
    tmp = Path(tempfile.mkdtemp(prefix=".jobdisk-", dir=out.parent))
    try:
        stage = tmp / "stage"
        stage.mkdir(mode=0o700)
        staged: dict[str, list[object]] = {}
        skipped = _stage(workdir, stage / WORK, staged)
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
        proc.run([_tool("mkfs.ext4"), "-q", "-F", "-L", "vjob-job", "-d", str(stage), str(raw)], timeout_s=600,
                 job=str(out.name))  # fmt: skip
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


def collect(disk: Path, workdir: Path) -> Results:
    """Read the exit status and copy `/work` back over `workdir` (no mount; as the job's user).

    The scratch copy is made beside the disk (the VM directory, the pilot's own).
    """
    tmp = Path(tempfile.mkdtemp(prefix=".vjob-results-", dir=disk.parent))
    try:
        raw = tmp / "disk.raw"
        proc.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], timeout_s=600)
        exit_text = _debugfs(raw, f"cat /{CONTROL}/exit")
        exit_code = int(exit_text.strip()) if exit_text.strip().isdigit() else None
        staged = _staged(_debugfs(raw, f"cat /{CONTROL}/staged.json"))
        dumped = tmp / "out"
        dumped.mkdir(mode=0o700)
        _debugfs(raw, f"rdump /{WORK} {dumped}")
        raw.unlink()
        files = _merge(dumped / WORK, workdir, staged, Path())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Results(exit_code, files)


MAX_EXIT_BYTES = 16
"""`/.vjob/exit` holds one number and a newline; anything longer is not read."""


def read_exit(disk: Path, scratch_parent: Path) -> int | None:
    """The exit status the guest agent left on a job disk, read by root without trusting it
    (the user could have written that file too): debugfs (no mount) on a root-owned raw copy
    first says the file's type and size, and only a regular file of at most MAX_EXIT_BYTES is
    read (a sparse file of terabytes would otherwise be dumped). None unless it holds a number
    in 0..255 (the job never ended, or the file is not the agent's)."""
    tmp = Path(tempfile.mkdtemp(prefix=".vjob-exit-", dir=scratch_parent))
    try:
        raw = tmp / "disk.raw"
        proc.run(["qemu-img", "convert", "-q", "-U", "-f", "qcow2", "-O", "raw", str(disk), str(raw)], timeout_s=600)
        shown = _debugfs(raw, f"stat /{CONTROL}/exit")  # debugfs says "not found" on stderr, exits 0
        size = re.search(r"\bSize: (\d+)", shown)
        if not re.search(r"\bType: regular\b", shown) or size is None or int(size.group(1)) > MAX_EXIT_BYTES:
            return None
        value = _debugfs(raw, f"cat /{CONTROL}/exit")[: MAX_EXIT_BYTES + 1].strip()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return int(value) if re.fullmatch(r"[0-9]{1,3}", value) and int(value) <= 255 else None


def _debugfs(raw: Path, request: str) -> str:
    # A request is one debugfs command line: our own constant words and our own temporary
    # path (mkdtemp beside the disk; refused below if it holds a space or a quote).
    if any(c.isspace() for c in str(raw)) or any(c in str(raw) for c in "\"'"):
        raise VjobError(f"job disk: path {str(raw)[:120]!r} holds a space or quote: debugfs cannot take it")
    try:
        return proc.run([_tool("debugfs"), "-R", request, str(raw)], timeout_s=600)
    except CommandError as exc:
        raise VjobError(f"job disk {raw}: debugfs {request.split()[0]}: {exc}") from None


def _staged(text: str) -> dict[str, list[object]]:
    try:
        data = json.loads(text)
    except ValueError:
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
