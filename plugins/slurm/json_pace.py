"""Pacing the reads of Slurm's job JSON by their own measured cost.

Why: on Slurm 20.11-22.05 `squeue --json` ignores every filter, so reading even one new job's
JSON makes squeue print every job it knows. Measured on real 22.05 (bench/squeue_real.py):
106 µs of squeue's CPU a job, 12.7 s of CPU and 13.5-29 s of wall time at 120,000 jobs. Read at
every tick that sees a new job, that would keep squeue busy all the time on a large site and
cost the host far more than the agent itself. So a read (a fetch of the new and changed jobs,
or a full read) is timed, and the next fetch is due only once the time since that read ended
is at least what the next fetch is expected to take × (1/share − 1): squeue --json busy at
most `share` of the time. The expected cost is the last fetch's wall time (before any fetch,
the first full read's): on 22.05 a fetch prints everything and costs what a full read does;
where `--jobs=` is honoured (23.02 and later, a few jobs printed) a fetch is cheap, so the same
rule makes it due at nearly every tick, and the periodic full read (the resync) does not hold
the next fetches back for minutes. One rule, not a version switch.

What must not wait makes the next read due sooner: a wake (job_submit.lua rewrites its wake
file when it accepts an interactive job; the agent's loop tells the adapter) paces it to the
looser `woken_share` instead (at 0.5, the read may follow the last one after as long as that
one took: on 22.05 at 120,000 jobs an interactive job is seen within two squeue runs, and
interactive jobs coming every tick keep squeue busy half the time, not all of it; 1: at once),
and a state change the listing shows but cannot put in by itself is read at once
(plugins.slurm.incremental decides that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Pace:
    """When the next JSON read is due, from the wall time of the last one.

    `share` 1 (the default here) makes every read due at once: the pace is the adapter's choice
    (`[slurm] json_read_share`). `clock` is any monotonic clock in seconds (a test's or the
    bench's own, which carries real squeue's measured cost)."""

    share: float = 1.0
    clock: Callable[[], float] = field(default=time.monotonic)
    woken_share: float = 1.0
    """The share a wake paces the next read to (1: at once)."""
    last_end: float | None = None
    """When the last read ended (None: none yet)."""
    last_wall: float = 0.0
    """What the next fetch is expected to take (wall time, `clock`'s seconds): the last fetch's,
    or the last full read's while no fetch has run."""
    fetched: bool = False
    """A fetch has been timed (its wall time, not a full read's, is the expected cost since)."""
    forced: bool = False
    """A wake came since the last read: the next read is paced to `woken_share`."""
    reads: int = 0
    """Reads timed so far (fetches and full reads)."""

    def __post_init__(self) -> None:
        for name, value in (("json read share", self.share), ("json read share woken", self.woken_share)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} {value!r}: must be above 0 and at most 1")

    def wake(self) -> None:
        """Something that must not wait may have come (an interactive job): the next read is
        paced to `woken_share` until one has run."""
        self.forced = True

    def wait_s(self) -> float:
        """How long after the last read ended the next fetch is due (sooner after a wake)."""
        share = self.woken_share if self.forced else self.share
        return self.last_wall * (1.0 / share - 1.0)

    def due(self) -> bool:
        """Whether a fetch may run now."""
        if self.last_end is None:
            return True
        return self.clock() - self.last_end >= self.wait_s()

    def timed(self, read: Callable[[], T], *, full: bool = False) -> T:
        """`read()`, its wall time kept for the pace (an exception keeps the last one: a read
        that failed is tried again at the next tick, as before). A `full` read ends the idle
        time like any read but sets the expected cost only while no fetch has been timed."""
        start = self.clock()
        out = read()
        end = self.clock()
        self.last_end = end
        if not full or not self.fetched:
            self.last_wall = max(0.0, end - start)
        self.fetched = self.fetched or not full
        self.forced = False
        self.reads += 1
        return out


__all__ = ["Pace"]
