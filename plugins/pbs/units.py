"""The one reader of PBS durations and sizes, for Torque, OpenPBS, Moab and their accounting logs.

Why one: two copies (the adapter's and the accounting reader's) had drifted apart — one took
`D:HH:MM:SS` and fractions, the other neither; one took petabytes, one returned 0 MiB for
`1kb` and the other 1 — so the same job had a different walltime and memory in the agent and
in the simulator. Both call these now.

Formats (Torque and OpenPBS `pbs_resources(7)`, Moab `showq`):

* duration: `SS`, `MM:SS`, `HH:MM:SS`, `D:HH:MM:SS` (Moab, Torque's `-l walltime`), each part
  digits only, the last one with an optional fraction (`3600.5`);
* size: digits, then an optional multiplier `k m g t p` (powers of 1024) and an optional
  unit `b` (byte) or `w` (word = 8 bytes), case-insensitive: `4gb`, `512mb`, `17592kb`, `1G`,
  `2tw`; a bare number is in `bare` units (bytes for PBS, MiB for Moab's `MEM:`).

Every value is user-reachable (a job's `-l` resources), so the grammar is strict
(`re.fullmatch`: no trailing newline, sign, `nan` or exponent), digit strings are capped (a
5000-digit number would otherwise hit Python's int-conversion limit with a ValueError) and
results are bounded, so a caller always gets a finite number or an InputError naming the
field and the value.
"""

from __future__ import annotations

import re

from vjob.errors import InputError

MAX_DIGITS = 18
"""Digits allowed per number: more than any real walltime or memory size, far below int limits."""
MAX_DURATION_S = 100 * 366 * 86400.0
"""A century: any longer walltime is garbage, not a request."""
MAX_SIZE_MB = 1 << 40
"""An exbibyte in MiB: larger sizes are garbage, not a request."""

_NUMBER = rf"([0-9]{{1,{MAX_DIGITS}}})"
_DURATION = re.compile(rf"(?:(?:(?:{_NUMBER}:)?{_NUMBER}:)?{_NUMBER}:)?([0-9]{{1,{MAX_DIGITS}}}(?:\.[0-9]{{1,9}})?)")
_SIZE = re.compile(rf"{_NUMBER}[ \t]*([kmgtp]?)([bw]?)", re.IGNORECASE)
_FACTOR_MB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2, "p": 1024.0**3}


def _shown(value: object) -> str:
    """The value as an error message shows it: repr'd and cut, so no user text can forge a line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def duration_s(value: object, *, where: str) -> float:
    """Seconds of a PBS duration (`23:59:00`, `335:34:49`, `1:00:00:00`, `1:30`, `3600`)."""
    text = value.strip(" \t") if isinstance(value, str) else ""
    match = _DURATION.fullmatch(text) if len(text) <= 4 * (MAX_DIGITS + 1) + 10 else None
    if not isinstance(value, str) or match is None:
        raise InputError(f"{where} = {_shown(value)}: not a duration like HH:MM:SS, D:HH:MM:SS or seconds")
    days, hours, minutes, seconds = match.groups()
    total = float(seconds) + 60 * int(minutes or 0) + 3600 * int(hours or 0) + 86400 * int(days or 0)
    if total > MAX_DURATION_S:
        raise InputError(f"{where} = {_shown(value)}: longer than a century")
    return total


def size_mb(value: object, *, where: str, bare: str = "b") -> int:
    """MiB of a PBS size (`4gb`, `17592kb`, `512mb`, `1024`), rounded to the nearest MiB.

    `bare` is the unit of a number without one: `b` (bytes, PBS) or `m` (MiB, Moab's MEM).
    """
    text = value.strip(" \t") if isinstance(value, str) else ""
    match = _SIZE.fullmatch(text) if len(text) <= MAX_DIGITS + 8 else None
    if not isinstance(value, str) or match is None:
        raise InputError(f"{where} = {_shown(value)}: not a size like 4gb, 512mb or 17592kb")
    number, multiplier, unit = int(match.group(1)), match.group(2).lower(), match.group(3).lower()
    if not multiplier and not unit:
        multiplier = {"b": "", "m": "m"}[bare]
    megabytes = number * _FACTOR_MB[multiplier] * (8 if unit == "w" else 1)
    if megabytes > MAX_SIZE_MB:
        raise InputError(f"{where} = {_shown(value)}: larger than an exbibyte")
    return round(megabytes)
