"""The mapping of UBIS priorities (floats in 0..Σw) to the integers an RMS accepts.

Why a linear map of the fraction P/Σw: the order of jobs is what the RMS must reproduce, and
a linear map keeps it (ties aside, from rounding) while a weight change moves every job by
the same rule. Σw = 0 (every weight switched off) maps every job to the bottom of the range.

- Slurm: the site factor (`scontrol update job=ID SiteFactor=N`), 0..site_factor_max
  (`[slurm] site_factor_max`, default 1,000,000); multifactor adds the site factor to the
  job priority as it is, without a weight.
- PBS (Torque and OpenPBS `qalter -p`): -1024..1023.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

PBS_MIN = -1024
PBS_MAX = 1023


def fraction(priority: NDArray[np.float64], max_priority: float) -> NDArray[np.float64]:
    """P / Σw clipped to 0..1 (0 when every weight is 0)."""
    if max_priority <= 0:
        return np.zeros_like(priority, dtype=np.float64)
    return np.clip(priority / max_priority, 0.0, 1.0)


def integer_priority(priority: NDArray[np.float64], max_priority: float, low: int, high: int) -> NDArray[np.int64]:
    """Integers low..high: the lowest UBIS priority at `low`, the highest at `high`, rounded.

    The one mapping every RMS knob uses (an adapter declares its range, vjob.rms.PriorityKnob)."""
    if high <= low:
        raise ValueError(f"integer priority range {low}..{high}: high must be above low")
    return (low + np.rint(fraction(priority, max_priority) * (high - low))).astype(np.int64)


def slurm_site_factor(priority: NDArray[np.float64], max_priority: float, site_factor_max: int) -> NDArray[np.int64]:
    """Site factors 0..site_factor_max (the Slurm adapter's knob)."""
    if site_factor_max < 1:
        raise ValueError(f"site_factor_max = {site_factor_max}: must be >= 1")
    return integer_priority(priority, max_priority, 0, site_factor_max)


def pbs_priority(priority: NDArray[np.float64], max_priority: float) -> NDArray[np.int64]:
    """PBS job priorities -1024..1023 (the PBS adapter's knob)."""
    return integer_priority(priority, max_priority, PBS_MIN, PBS_MAX)
