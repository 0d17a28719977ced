"""The small file through which the agent tells the submit hooks the current X.

Why a file: job_submit.lua runs inside slurmctld under its job lock (and the PBS hook inside the
server): no network, no database, one small local read. One line, key=value:

    x=0.250000 slowdown=1.100000 at=1764100000 stale=600

x is the threshold, slowdown the VO model's factor for a job alone in a VM (the hook predicts
time limit × slowdown), at the POSIX time it was written, stale the agent's `[deadline]
stale_after_s` in whole seconds: the hooks take their staleness limit from the file so that
they parse no configuration (a file without it, from an older agent, is stale after
DEFAULT_STALE_S). A hook fails open: a missing, unreadable, malformed or stale file (older than
`stale`, or from the future) means no deadline check — a broken agent must not stop the
cluster accepting jobs.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from vjob.errors import InputError

THRESHOLD_NAME = "vjob-deadline.threshold"
_LINE = re.compile(
    r"x=(-?\d{1,3}(?:\.\d{1,9})?) slowdown=(\d{1,3}(?:\.\d{1,9})?) at=(\d{1,12})(?: stale=(\d{1,5}))?\n?"
)
MAX_BYTES = 256
DEFAULT_STALE_S = 600
"""The limit for a file that does not carry one; the default of [deadline] stale_after_s."""
MAX_STALE_S = 86400


@dataclass(frozen=True, slots=True)
class Published:
    x: float
    slowdown: float
    at: int
    stale_after_s: int = DEFAULT_STALE_S


def format_line(x: float, slowdown: float, at: float, stale_after_s: float = DEFAULT_STALE_S) -> str:
    if not (math.isfinite(x) and -100 < x < 100):
        raise InputError(f"threshold x = {x!r}: must be a finite number in (-100, 100)")
    if not (math.isfinite(slowdown) and 0 < slowdown < 100):
        raise InputError(f"threshold slowdown = {slowdown!r}: must be in (0, 100)")
    stale = math.ceil(stale_after_s) if math.isfinite(stale_after_s) else 0
    if not 1 <= stale <= MAX_STALE_S:
        raise InputError(f"threshold stale_after_s = {stale_after_s!r}: must be in [1, {MAX_STALE_S}]")
    return f"x={x:.6f} slowdown={slowdown:.6f} at={int(at)} stale={stale}\n"


def write_threshold(
    path: str | os.PathLike[str], x: float, slowdown: float, at: float, *, stale_after_s: float = DEFAULT_STALE_S
) -> Path:
    """Replace the file atomically (rename), world-readable: slurmctld's user reads it.

    The temporary file has a random name and is created with O_EXCL | O_NOFOLLOW: a file or
    link planted under a predictable name (the pid's) would otherwise be opened, written and
    renamed into place, leaving whoever planted it able to rewrite the threshold."""
    p = Path(path)
    line = format_line(x, slowdown, at, stale_after_s)
    tmp = p.with_name(f".{p.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.write(fd, line.encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def read_threshold(path: str | os.PathLike[str], *, now: float) -> Published | None:
    """What a hook would use: None when missing, malformed, stale (older than the file's own
    `stale`) or from the future (fail open). The same rules as job_submit.lua's and the PBS
    hook's readers, so `vjob status` shows what the hooks see."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        return None
    m = _LINE.fullmatch(raw.decode("ascii", "replace"))
    if not m:
        return None
    stale = int(m.group(4)) if m.group(4) else DEFAULT_STALE_S
    pub = Published(float(m.group(1)), float(m.group(2)), int(m.group(3)), stale)
    if pub.slowdown <= 0 or not 1 <= stale <= MAX_STALE_S or now - pub.at > stale or pub.at - now > 60:
        return None
    return pub
