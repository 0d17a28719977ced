"""Usage decay: the one rule by which recorded usage fades.

Why its own module: the state store's usage rows (`ubis_priority.usage`, read and written by
the live agent) and the simulator's per-user usage vector decay the same way, and a site admin
tuning `usage_half_life_s` in the simulator must be tuning what production runs. Usage halves
every `half_life_s` (exponential decay, as Slurm's PriorityDecayHalfLife); time never runs
backwards (a negative interval decays nothing).
"""

from __future__ import annotations

import math

from vjob.errors import InputError


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """What one node-second of usage is worth `elapsed_s` later: 0.5 ** (elapsed / half-life)."""
    if half_life_s <= 0:
        raise InputError(f"usage half-life = {half_life_s}: must be > 0")
    return math.pow(0.5, max(elapsed_s, 0.0) / half_life_s)


def decayed(node_seconds: float, elapsed_s: float, half_life_s: float) -> float:
    """`node_seconds` after `elapsed_s` of exponential decay (no growth for negative time)."""
    return node_seconds * decay_factor(elapsed_s, half_life_s)
