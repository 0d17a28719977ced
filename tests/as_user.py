"""A piece of a test run as another user: a forked child that dropped to `nobody`.

Why a fork and not `runuser … python`: this venv's interpreter lives under /root, which `nobody`
may not read, and the code under test must see the kernel's ids (SO_PEERCRED, file owners,
EACCES), not a flag saying who it pretends to be. One helper for every test that needs this
(tests/test_saline_hardening.py, tests/test_job_disk_crafted.py).
"""

from __future__ import annotations

import io
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CRASHED = 70
"""The child's exit code when `work` raised (the exception is named on its stderr)."""


def as_nobody(work: Callable[[], int | None], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`work()` in a child that became `nobody` (setgroups, setgid, setuid; in `cwd` first when
    given): its exit code (what `work` returns, None as 0, CRASHED when it raised) and what it
    wrote to sys.stdout and sys.stderr. Nothing of the child returns into pytest."""
    nobody = pwd.getpwnam("nobody")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = CRASHED
        try:
            os.close(out_r)
            os.close(err_r)
            if cwd is not None:
                os.chdir(cwd)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            sys.stdout = io.TextIOWrapper(io.FileIO(out_w, "w"), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(err_w, "w"), write_through=True)
            code = work() or 0
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException as exc:  # noqa: BLE001 - report, then leave the child
            os.write(err_w, f"child: {type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r) as out, os.fdopen(err_r) as err:
        stdout, stderr = out.read(), err.read()
    _, status = os.waitpid(pid, 0)
    return subprocess.CompletedProcess(["as nobody"], os.waitstatus_to_exitcode(status), stdout, stderr)
