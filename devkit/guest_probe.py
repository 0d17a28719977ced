"""Reading the tiny counter guest's console log: did the job continue, or restart?

Why in the dev kit: the counter guest (`provisioning.guest`) exists to prove checkpoints in
tests, benchmarks and the demo. Its init prints `COUNTER n` once per second and
`GUEST: booted` once per boot; after a save/restore, a resume elsewhere or a migration the
next line must be `COUNTER n+1` with a single boot. Nothing in the runtime packages reads
these lines.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from vjob.errors import VjobError

_COUNTER_RE = re.compile(rb"^COUNTER (\d+)", re.MULTILINE)


def last_counter(console_log: Path) -> int | None:
    """The last `COUNTER n` the guest printed in `console_log`, or None before the first."""
    try:
        data = console_log.read_bytes()
    except FileNotFoundError:
        return None
    found = _COUNTER_RE.findall(data)
    return int(found[-1]) if found else None


def counters(console_log: Path) -> list[int]:
    """Every counter value in the log, in order (to check n → n+1 across a checkpoint)."""
    try:
        return [int(v) for v in _COUNTER_RE.findall(console_log.read_bytes())]
    except FileNotFoundError:
        return []


def boots(console_log: Path) -> int:
    """How many times the guest booted according to its log (1 means it never restarted)."""
    try:
        return console_log.read_bytes().count(b"GUEST: booted")
    except FileNotFoundError:
        return 0


def wait_for_counter(console_log: Path, at_least: int, timeout_s: float) -> int:
    """Wait until the guest's counter reaches `at_least`; returns the value seen."""
    deadline = time.monotonic() + timeout_s
    value: int | None = None
    while time.monotonic() < deadline:
        value = last_counter(console_log)
        if value is not None and value >= at_least:
            return value
        time.sleep(0.1)
    raise VjobError(f"guest console {console_log}: counter {value} did not reach {at_least} within {timeout_s:.0f} s")
