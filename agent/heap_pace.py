"""The cyclic garbage collector paced to the agent's ticks: long-lived objects frozen between them.

Why: at a site's size (10,000 nodes, 120,000 jobs) nearly all the objects the collector tracks
in the agent's process (the jobs, the listing's records, the store's rows) are kept from tick
to tick. CPython starts a full pass whenever the objects promoted since the last one exceed a
quarter of the long-lived ones, and a tick's own temporary lists and records, alive across a
few young passes, count among them: in bench/agent_tick.py's run at full size (5 steady
ticks, `gc.callbacks` timing each pass) two full passes came in the first two steady ticks,
0.43 and 0.51 s of CPU each, half the tick's budget, landing in whichever step was running (a
decide of 0.80 s took 1.31 s).

So as each tick starts, what the previous ones left is moved to the permanent generation
(`gc.freeze`), which no pass scans: a full pass then scans only the objects made since (the
same run: one or two passes a tick, 0.02-0.12 s each, about 0.07 s a tick in all; the steady
ticks' decide part 0.36-0.44 s in the bench's next run at full size, no outlier). Objects
frozen are still freed as soon as nothing refers to them; only garbage made of reference
cycles waits, so every `thaw_every` ticks the frozen objects are handed back (`gc.unfreeze`)
and collected at once, a full pass over the whole heap (left to the collector's own pace, a
small site's tick might not reach one before the next freeze): memory held by cycles is
bounded by that many ticks'.
"""

from __future__ import annotations

import gc

THAW_EVERY = 30
"""Ticks between two thaws: about the Slurm adapter's full resync (`resync_every`), whose
tick is allowed ten times a steady one's CPU; one pass over the whole heap every 30 ticks
costs ~0.02 s a tick at a site's size."""


class HeapPace:
    """Freezes the heap at each tick's start, thaws it every `thaw_every` ticks."""

    def __init__(self, thaw_every: int = THAW_EVERY) -> None:
        if thaw_every < 1:
            raise ValueError(f"thaw_every = {thaw_every}: must be >= 1")
        self.thaw_every = thaw_every
        self.ticks = 0
        """Ticks started since the last thaw."""

    def tick_starts(self) -> None:
        """A tick starts: what is alive now is the agent's state, frozen; or, every
        `thaw_every` ticks, everything frozen so far is handed back to the collector."""
        self.ticks += 1
        if self.ticks >= self.thaw_every:
            self.ticks = 0
            gc.unfreeze()
            gc.collect()
        else:
            gc.freeze()


__all__ = ["THAW_EVERY", "HeapPace"]
