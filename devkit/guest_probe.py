"""Reading the guests' console logs: did the job continue, or restart? Did a guest panic?

Why in the dev kit: the counter guest (`provisioning.guest`) exists to prove checkpoints in
tests, benchmarks and the demo. Its init prints `COUNTER n` once per second and
`GUEST: booted` once per boot; after a save/restore, a resume elsewhere or a migration the
next line must be `COUNTER n+1` with a single boot. Nothing in the runtime packages reads
these lines. The demo also reads any guest's console for a kernel panic (`guest_panic`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from vjob.errors import VjobError
from vjob.pilot_files import PilotStatus, vms_of

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


def split_counters(console_log: Path, offset: int) -> tuple[list[int], list[int]]:
    """The guest's counters printed before byte `offset` of its console log, and after."""
    seq = counters(console_log)
    printed_before = console_log.read_bytes()[:offset].count(b"COUNTER ") if seq else 0
    return seq[:printed_before], seq[printed_before:]


def guest_panic(st: PilotStatus) -> str:
    """What a kernel panic on the console of one of the pilot's VMs (a multi-node job's members
    too) said ("VM NAME: kernel panic while booting: LINE"), else "". Why: that VM is gone and
    its job never starts (its first VM waits for it up to 600 s), so the demo says so at once."""
    if not st.console_log:
        return ""
    for vm, _node in vms_of(st):
        console = Path(st.console_log).with_name(f"{vm}.console.log")
        try:
            text = console.read_text(errors="replace")
        except OSError:
            continue
        if (at := text.find("Kernel panic")) >= 0:
            return f"VM {vm}: kernel panic while booting: {text[at:].splitlines()[0][:160]!r}"
    return ""
