"""The planner's clock: a budget counted from the moment the process started.

Why from the process start and not from the first line of `vjob plan`: an operator who runs
`vjob plan --time-limit 60` waits for the process, and Python's start-up with the imports it
needs (pydantic, numpy, OR-Tools) takes 0.5–2 s on a loaded machine before any planner code
runs. The kernel knows when the process started (`/proc/self/stat`, field 22, in clock ticks
since boot); converted to the `time.perf_counter()` scale (both count from boot on Linux,
CLOCK_BOOTTIME against CLOCK_MONOTONIC, equal on a machine that never suspended) it is one
monotonic deadline for every phase. Elsewhere (no /proc) the budget starts at the first call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_started() -> float:
    """When this process started, as a time.perf_counter() value (now when it cannot be known)."""
    now = time.perf_counter()
    try:
        stat = Path("/proc/self/stat").read_text(encoding="ascii")
        # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    if not 0.0 <= age < 3600.0:  # a clock that disagrees: do not trust it
        return now
    return now - age


def default_workers() -> int:
    """CP-SAT workers for this machine: the CPUs this process may use, at most 8.

    More workers than CPUs only time-slice the same cores (the portfolio's extra workers then
    slow the ones that find solutions); beyond 8 CP-SAT gains little on these models.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))
