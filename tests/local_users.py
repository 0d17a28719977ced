"""The local users the tests run things as (`vjrun`, `vjobtest`, ...), made when missing.

Why one helper: .ci/run runs the tests that need no service on two pytest-xdist workers, and on a
fresh machine two of them may find a user missing at the same moment. `useradd` holds the
password file's lock, so one of them makes the user and the other exits 9 ("already exists"):
that is the outcome asked for, not a failure.
"""

from __future__ import annotations

import pwd
import subprocess

USERADD_EXISTS = 9
"""useradd(8)'s exit status when the name is taken."""


def ensure(name: str) -> pwd.struct_passwd:
    """The passwd entry of `name`, made first (a home, bash) when there is none (root only)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    made = subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], capture_output=True, text=True, timeout=30)
    if made.returncode not in (0, USERADD_EXISTS):
        raise RuntimeError(f"useradd {name} exited {made.returncode}: {made.stderr.strip()}")
    return pwd.getpwnam(name)
