"""What a PBS job id, user, queue and node name may look like, checked with `re.fullmatch`.

Why here and strict: these names go from qstat/pbsnodes output into argument lists (`qalter
-p 5 JOB`), VM names (`vjob-pbs-JOB`), the store and log lines. `re.match` with `^...$` would
let `12.server\\n` through (`$` also matches before a trailing newline), so every check is a
`fullmatch` over ASCII classes, with a length cap. A name that fails is an InputError naming
the field and the value (repr'd and cut), never passed on.

The Torque submit filter and the OpenPBS hook keep their own copies of JOB_ID and the image
name pattern (they run without vjob installed); tests/test_pbs_names.py holds them equal.
"""

from __future__ import annotations

import re

from vjob.errors import InputError

JOB_ID = re.compile(r"[0-9]{1,18}(\[[0-9]{0,9}\])?(\.[A-Za-z0-9][A-Za-z0-9._-]{0,235})?")
"""`123`, `123.server.domain`, `673175[]`, `673175[19].server` — nothing that starts with '-'."""
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\$?")
"""POSIX-portable user names (and Samba machine accounts ending in `$`)."""
QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""PBS queue names: alphanumeric first, at most 15 characters on Torque, more on OpenPBS."""
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,253}")
"""Host names (RFC 1123 labels and dots) as pbsnodes and exec_host print them; `_` for vnodes."""
OS_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""An OS image name: no shell metacharacter, no option-looking name, no path."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check(pattern: re.Pattern[str], value: object, *, field: str, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InputError(f"{field} = {_shown(value)}: not {what}")
    return value


def job_id(value: object, *, field: str = "job id") -> str:
    """The job id, or InputError when it is not PBS id syntax."""
    return _check(JOB_ID, value, field=field, what="a PBS job id like 123 or 123.server")


def user(value: object, *, field: str = "user") -> str:
    return _check(USER, value, field=field, what="a user name (letters, digits, . _ -)")


def queue(value: object, *, field: str = "queue") -> str:
    return _check(QUEUE, value, field=field, what="a PBS queue name (letters, digits, . _ -)")


def node(value: object, *, field: str = "node") -> str:
    return _check(NODE, value, field=field, what="a node name (letters, digits, . _ -)")


def is_os_image(value: object) -> bool:
    """Whether `value` may name an OS image (the filter and hook refuse other names)."""
    return isinstance(value, str) and OS_IMAGE.fullmatch(value) is not None
