"""Running an external command the one way vjob does it.

Why one helper: every adapter and driver calls out (squeue, qstat, oarsub, qemu-img, rsync,
apt-get download), and each call must take an argument list (never a shell string built from
job data), have a timeout, and turn a failure, a hang or a missing program into a CommandError
that names the command (and the job or VM it was for) in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from vjob.errors import CommandError, CommandUnavailable


def run(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    job: str | None = None,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    shown: Sequence[str] | None = None,
    hint: str = "",
    missing_hint: str = "",
    as_ids: tuple[int, int] | None = None,
    pass_fds: Sequence[int] = (),
) -> str:
    """Run `cmd` and return its standard output, or raise CommandError.

    `shown` is how the command is named in errors (e.g. without an absolute path); `job` names
    the job or VM it concerns; `hint` is added to a time-out message (e.g. "is slurmctld up?"),
    `missing_hint` to a command-not-found one (e.g. "set [pbs] bin_dir or PATH").
    `as_ids` (uid, gid): run it as that account, without supplementary groups (root running a
    tool on a file a user made, e.g. qemu-img on a job disk); `pass_fds`: descriptors it
    inherits (the file it works on, as `/proc/self/fd/N`, when the account cannot reach its path).
    """
    argv = [str(c) for c in cmd]
    name = list(shown) if shown is not None else argv
    try:
        res = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            check=False,
            pass_fds=tuple(pass_fds),
            **({"user": as_ids[0], "group": as_ids[1], "extra_groups": []} if as_ids is not None else {}),
        )
    except subprocess.TimeoutExpired:
        extra = f" ({hint})" if hint else ""
        raise CommandUnavailable(name, f"no answer within {timeout_s:g} s; killed{extra}", job=job) from None
    except FileNotFoundError:
        where = f": {missing_hint}" if missing_hint else ""
        raise CommandUnavailable(name, f"command not found{where}", job=job) from None
    except PermissionError:
        raise CommandError(name, "not executable by this user", job=job) from None
    except OSError as exc:
        raise CommandError(name, f"cannot run: {exc.strerror or exc}", job=job) from None
    if res.returncode != 0:
        lines = (res.stderr.strip() or res.stdout.strip() or "(no message)").splitlines()
        raise CommandError(name, f"exit status {res.returncode}: {' / '.join(lines[-3:])[-400:]}", job=job)
    return res.stdout


def alive(pid: int | None) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not count)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int, *, grace_s: float = 20.0, sig: int = signal.SIGTERM) -> None:
    """Stop a process we started (only ever a pid from our own pid files): `sig`, up to
    `grace_s` seconds for it to go (reaping it if it is our child), then SIGKILL."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        if not alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
