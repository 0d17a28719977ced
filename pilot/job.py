"""The job as this process sees it: its script, arguments, user, environment and nodes.

Why read here, in the job, rather than passed in by the RMS's hook: the pilot runs as the job's
user inside its allocation, so the kernel's word (uid, gid, working directory) and the RMS's
environment are the truth about the job; what the hook passed (the script, base64 under the
Slurm wrapper) is only its content. Every field is checked (provisioning.job_disk
.check_description) before a guest sees it.
"""

from __future__ import annotations

import base64
import binascii
import os
import pwd
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from pilot.members.launch import launcher
from plugins.member_launch import NODE_NAME
from plugins.slurm.images import requested_image
from provisioning import job_disk
from vjob.errors import InputError, UsageError
from vjob.rms import JobEnvironment

MAX_SCRIPT_READ = 8 << 20
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


def read_script(script: str | None, encoded: bool) -> bytes:
    """The job's script from `--script FILE` ('-': stdin), base64-decoded when `encoded`."""
    if not script:
        raise UsageError("vjob run: a real image runs a script: give --script FILE (or - for stdin)")
    try:
        data = sys.stdin.buffer.read(MAX_SCRIPT_READ) if script == "-" else Path(script).read_bytes()
    except OSError as exc:
        raise InputError(f"--script {script}: cannot read: {exc.strerror}") from None
    if encoded:
        try:
            data = base64.b64decode(b"".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"--script {script}: not valid base64") from None
    return data


def script_args(raw: list[str]) -> list[str]:
    """The script's arguments: what follows `--` on vjob run's line."""
    return raw[1:] if raw and raw[0] == "--" else list(raw)


def job_description(script: bytes, args: list[str], node: str) -> job_disk.JobDescription:
    """The job as the guest agent runs it: this process's user (the kernel's word, not the
    environment's), its working directory, environment and the node name as host name."""
    uid, gid = os.getuid(), os.getgid()
    try:
        pw = pwd.getpwuid(uid)
        user, home = pw.pw_name, os.path.normpath(pw.pw_dir or "/")
    except KeyError:
        user, home = f"u{uid}", "/"
    if not USER_NAME.fullmatch(user):
        user = f"u{uid}"
    if home == "/":
        home = f"/home/{user}"
    env = {k: v for k, v in os.environ.items() if ENV_NAME.fullmatch(k) and "\0" not in v}
    env.update({"VJOB_IMAGE_GUEST": "1", "VJOB_NODE": node})
    host = node if NODE_NAME.fullmatch(node) else "vjob"
    job = job_disk.JobDescription(
        script=script,
        args=args,
        env=env,
        uid=uid,
        gid=gid,
        user=user,
        home=home,
        cwd=os.path.normpath(os.getcwd()),
        hostname=host,
    )
    return job_disk.check_description(job)


def member_job(data: object) -> job_disk.JobDescription:
    """A member's job description from its leader: every field typed, the user this process's."""
    if not isinstance(data, dict):
        raise InputError("job: must be an object")
    try:
        job = job_disk.JobDescription(
            script=b"",
            args=[str(a) for a in data["args"]],
            env={str(k): str(v) for k, v in data["env"].items()},
            uid=int(data["uid"]),
            gid=int(data["gid"]),
            user=str(data["user"]),
            home=str(data["home"]),
            cwd=str(data["cwd"]),
            hostname=str(data["hostname"]),
            network=dict(data["network"]),
            mounts=dict(data["mounts"]) if data.get("mounts") is not None else None,  # pilot.site_mounts
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"job: a field is missing or mistyped: {exc}") from None
    if job.uid != os.getuid():
        raise InputError(f"job.uid = {job.uid}: this member pilot runs as uid {os.getuid()}")
    return job_disk.check_description(job)


def job_nodes(rms: str, given: str | None, node: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's nodes, this one first (it runs the script): `given` (--nodes), else the
    RMS's list (Slurm: the hostlist in $SLURM_JOB_NODELIST; PBS, OAR: the node file, one line per
    slot; plugins/<rms>/member_launch.py)."""
    if given:
        names = [n.strip() for n in given.split(",") if n.strip()]
    else:
        names = launcher(rms).allocation_nodes(os.environ if environ is None else environ)
    for n in names:
        if not NODE_NAME.fullmatch(n):
            raise InputError(f"node list: {n[:80]!r} is not a node name")
    unique = list(dict.fromkeys(names))
    if len(unique) <= 1:
        return [node]  # a job of one node, whatever name the RMS's list gives it
    if node not in unique:
        raise InputError(f"node {node}: not in the job's node list {','.join(unique)[:200]}; give --node or --nodes")
    return [node, *(n for n in unique if n != node)]


def restart_count(job_id_given: bool, env: JobEnvironment) -> int | None:
    """How often the RMS restarted this job; None when we cannot know (--job-id given by hand
    outside a job, or an RMS that exports no restart counter)."""
    in_job = not job_id_given and bool(env.job_id_from(os.environ))
    return env.restarts_from(os.environ, in_job=in_job)


def script_image(env: JobEnvironment) -> str:
    """The `#VJOB os=` line of the job's batch script (the file our parent shell runs)."""
    if env.script_name is None:
        return ""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    for arg in argv[1:]:
        path = Path(arg.decode(errors="replace"))
        if path.name == env.script_name and path.is_file():
            return requested_image(script=path.read_text(errors="replace"))
    return ""
