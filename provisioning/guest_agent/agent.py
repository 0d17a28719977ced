#!/usr/bin/python3 -I
"""The vjob guest agent: runs one batch job inside its VM, as its user, and records its exit.

Why this shape: a vjob guest boots for one job. The host (the pilot, provisioning.job_disk)
hands over the job on a small ext4 disk, the job disk (/dev/vdb): the job's working directory
under `/work` and its description under `/.vjob` (job.json: argv, environment, uid/gid, user
name, home, working directory, host name; `script`: the user's script). That disk is part of
the VM, so it travels with every checkpoint: a job resumed on another node still has its
files. The agent

* creates the job's user and group in the guest with the host's uid/gid (files the job writes
  then belong to the user when the pilot copies them back),
* shows the working directory at the job's own path (a bind mount of `/work`), so absolute
  paths in the script keep working,
* runs the script with the job's argv and environment as that user, stdin from /dev/null,
  stdout on the second serial port and stderr on the third (raw mode: bytes as written), which
  the host logs to files the pilot copies into the job's output,
* writes the exit status to `/.vjob/exit` on the job disk (128+N for a signal, like a shell),
  syncs and unmounts it; vjob-init then powers the guest off.

Everything in job.json came from the host but was written into a disk the user could have
prepared: it is checked here too (types, sizes, names), and the job never runs as root unless
its uid is 0 (a root job on the host).

Standard library only: it runs with the guest's python3, and nothing of vjob is installed there.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

JOB_DEVICE = "/dev/vdb"
MOUNT = Path("/vjob")
CONTROL = ".vjob"
WORK = "work"
STDOUT_TTY = "/dev/ttyS1"
STDERR_TTY = "/dev/ttyS2"
MAX_JOB_JSON = 4 << 20
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")
FORBIDDEN_CWD = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/vjob", "/run")
"""A working directory is bind-mounted at its host path: never over what the guest runs on."""


class JobError(Exception):
    """The job description is unusable; the message names the field."""


@dataclass(frozen=True)
class Job:
    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    user: str
    home: str
    cwd: str
    hostname: str


def check_path(field: str, value: object) -> str:
    """An absolute, normalised path without NUL or newline, up to 4096 bytes."""
    if not isinstance(value, str) or not value.startswith("/") or len(value.encode()) > 4096:
        raise JobError(f"{field}: {str(value)[:80]!r}: must be an absolute path")
    if "\0" in value or "\n" in value or os.path.normpath(value) != value or value.startswith("//"):
        raise JobError(f"{field}: {value[:80]!r}: must be a normalised path without NUL or newline")
    return value


def check_cwd(value: object) -> str:
    cwd = check_path("cwd", value)
    if cwd == "/" or any(cwd == p or cwd.startswith(p + "/") for p in FORBIDDEN_CWD):
        raise JobError(f"cwd: {cwd[:80]!r}: a job's working directory cannot be a system directory")
    return cwd


def parse_job(data: object) -> Job:
    """The job of a job.json document, every field checked."""
    if not isinstance(data, dict):
        raise JobError("job.json: must be an object")
    argv = data.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > 4096 or not all(isinstance(a, str) for a in argv):
        raise JobError("argv: must be a non-empty list of at most 4096 strings")
    if any("\0" in a for a in argv):
        raise JobError("argv: an argument holds a NUL byte")
    env = data.get("env")
    if not isinstance(env, dict) or len(env) > 4096:
        raise JobError("env: must be an object of at most 4096 variables")
    for key, value in env.items():
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,255}", key) or "\0" in value:
            raise JobError(f"env: {str(key)[:80]!r}: names are [A-Za-z_][A-Za-z0-9_]*, values strings without NUL")
    ids = {}
    for field in ("uid", "gid"):
        value = data.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
            raise JobError(f"{field}: {value!r}: must be an integer in 0..2^31-1")
        ids[field] = value
    user = data.get("user")
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise JobError(f"user: {str(user)[:80]!r}: must match {USER_RE.pattern}")
    hostname = data.get("hostname", "vjob")
    if not isinstance(hostname, str) or not HOST_RE.fullmatch(hostname):
        raise JobError(f"hostname: {str(hostname)[:80]!r}: must match {HOST_RE.pattern}")
    return Job(
        argv=list(argv),
        env=dict(env),
        uid=ids["uid"],
        gid=ids["gid"],
        user=user,
        home=check_path("home", data.get("home")),
        cwd=check_cwd(data.get("cwd")),
        hostname=hostname,
    )


def ensure_user(job: Job, etc: Path = Path("/etc")) -> None:
    """The job's user and group exist in the guest with the host's uid and gid.

    An existing entry with that uid (gid) is kept whatever its name: ids are what files carry.
    A name already taken by another uid gets the job's uid under a `vjob-` prefixed name.
    """
    if job.uid == 0:
        return
    group_file, passwd_file = etc / "group", etc / "passwd"
    groups = [line.split(":") for line in group_file.read_text().splitlines() if line.count(":") >= 3]
    if not any(g[2] == str(job.gid) for g in groups):
        name = job.user if not any(g[0] == job.user for g in groups) else f"vjob-g{job.gid}"
        with group_file.open("a") as fh:
            fh.write(f"{name}:x:{job.gid}:\n")
    users = [line.split(":") for line in passwd_file.read_text().splitlines() if line.count(":") >= 6]
    if not any(u[2] == str(job.uid) for u in users):
        name = job.user if not any(u[0] == job.user for u in users) else f"vjob-u{job.uid}"
        with passwd_file.open("a") as fh:
            fh.write(f"{name}:x:{job.uid}:{job.gid}::{job.home}:/bin/bash\n")


def _say(text: str) -> None:
    print(f"VJOB-GUEST: {text}", flush=True)


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


def _raw_tty(path: str) -> int:
    """A serial port opened for writing, in raw mode: the job's bytes reach the host as written."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    try:
        attrs = termios.tcgetattr(fd)
        attrs[1] &= ~termios.OPOST  # no \n -> \r\n
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except termios.error:
        pass
    return fd


def _make_dirs_for(job: Job) -> None:
    """The home and the working directory exist at their host paths, the job's own."""
    for path in (job.home, job.cwd):
        missing = []
        p = Path(path)
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=0o755)
            os.chown(d, job.uid, job.gid)


def run_job(job: Job, script: Path, *, stdout: int, stderr: int) -> int:
    """Run the job as its user; returns the exit status (128+N when killed by signal N)."""
    env = dict(job.env)
    env.update({"HOME": job.home, "USER": job.user, "LOGNAME": job.user, "VJOB_GUEST": "1"})
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    argv = [str(script), *job.argv[1:]]
    if not script.read_bytes().startswith(b"#!"):
        argv = ["/bin/sh", *argv]  # like a shell running a script without a #! line
    drop = {} if job.uid == 0 else {"user": job.uid, "group": job.gid, "extra_groups": [job.gid]}
    try:
        child = subprocess.Popen(
            argv, cwd=job.cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            start_new_session=True, **drop,
        )  # fmt: skip
    except OSError as exc:
        os.write(stderr, f"vjob: cannot start the job: {exc}\n".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    code = child.wait()
    return 128 - code if code < 0 else code


def main() -> int:
    MOUNT.mkdir(exist_ok=True)
    _run(["mount", "-t", "ext4", "-o", "nosuid,nodev", JOB_DEVICE, str(MOUNT)])
    control = MOUNT / CONTROL
    raw = (control / "job.json").read_bytes()
    if len(raw) > MAX_JOB_JSON:
        raise JobError(f"job.json: {len(raw)} bytes, more than {MAX_JOB_JSON}")
    job = parse_job(json.loads(raw))
    socket.sethostname(job.hostname)
    ensure_user(job)
    _make_dirs_for(job)
    _run(["mount", "--bind", str(MOUNT / WORK), job.cwd])
    script = control / "script"
    os.chmod(script, 0o755)
    stdout, stderr = _raw_tty(STDOUT_TTY), _raw_tty(STDERR_TTY)
    _say(f"starting the job as uid {job.uid} in {job.cwd} at uptime {time.clock_gettime(time.CLOCK_BOOTTIME):.2f}")
    code = run_job(job, script, stdout=stdout, stderr=stderr)
    _say(f"job exited with status {code}")
    for fd in (stdout, stderr):
        try:
            termios.tcdrain(fd)
        except termios.error:
            pass
    subprocess.run(["umount", "-l", job.cwd], check=False)
    tmp = control / ".exit.tmp"
    tmp.write_text(f"{code}\n")
    os.replace(tmp, control / "exit")
    os.sync()
    subprocess.run(["umount", str(MOUNT)], check=False)
    os.sync()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - PID 1's child: say why on the console, never hang
        _say(f"agent failed: {type(exc).__name__}: {exc}")
        sys.exit(1)
