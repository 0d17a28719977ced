"""The x-factor of a job (the paper's eq. 1): how far past its deadline it is projected to end,
as a share of what it still has to run. Negative: it ends early; 0: just in time."""

from __future__ import annotations

import math

from vjob.errors import InputError

# A job with (almost) nothing left to run is not divided by ~0: its x is taken at this floor.
MIN_REMAINING_S = 1.0


def x_factor(remaining_s: float, time_to_deadline_s: float) -> float:
    """x = (remaining − time to deadline) / remaining.

    Why relative and not absolute: the same 10 minutes late means little for a day-long job and
    everything for a 15-minute one; X is then one number for every job size."""
    if not math.isfinite(remaining_s) or remaining_s < 0:
        raise InputError(f"x_factor: remaining_s = {remaining_s!r}: must be a finite number >= 0")
    if not math.isfinite(time_to_deadline_s):
        raise InputError(f"x_factor: time_to_deadline_s = {time_to_deadline_s!r}: must be finite")
    remaining = max(remaining_s, MIN_REMAINING_S)
    return (remaining - time_to_deadline_s) / remaining
