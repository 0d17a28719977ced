"""Usage decay and the integer knobs on hand-worked numbers (ubis_priority/decay.py, integers.py).

Why: the two rules every RMS and the simulator share, pinned at their edges (no weight at all,
a range of one value, time running backwards) where mutation testing (devkit/mutation.py)
showed which edges no test looked at.
"""

from __future__ import annotations

import numpy as np
import pytest

from ubis_priority import decay_factor, decayed, integer_priority, pbs_priority, slurm_site_factor
from vjob.errors import InputError


def test_usage_halves_every_half_life_and_never_grows() -> None:
    assert decay_factor(0.0, 60.0) == 1.0
    assert decay_factor(60.0, 60.0) == 0.5 and decay_factor(120.0, 60.0) == 0.25
    assert decay_factor(-3600.0, 60.0) == 1.0  # a clock stepping back decays nothing, grows nothing
    assert decayed(8.0, 180.0, 60.0) == 1.0
    assert decay_factor(1.0, 0.5) == 0.25  # a half-life under a second is a half-life
    for bad in (0.0, -1.0):
        with pytest.raises(InputError, match=f"usage half-life = {bad}: must be > 0"):
            decay_factor(10.0, bad)


def test_priorities_map_linearly_onto_the_knob_from_its_bottom_to_its_top() -> None:
    p = np.array([0.0, 0.5, 1.0, 2.0, -1.0])
    assert integer_priority(p, 1.0, 0, 10).tolist() == [0, 5, 10, 10, 0]  # clipped to the range
    assert integer_priority(p, 2.0, -4, 4).tolist() == [-4, -2, 0, 4, -4]  # P / 2 of 8 steps
    assert integer_priority(p, 0.0, 3, 9).tolist() == [3] * 5  # every weight off: the bottom
    assert slurm_site_factor(np.array([0.0, 1.0]), 1.0, 1).tolist() == [0, 1]
    assert pbs_priority(np.array([0.0, 1.0]), 1.0).tolist() == [-1024, 1023]
    with pytest.raises(ValueError, match=r"range 5\.\.5: high must be above low"):
        integer_priority(p, 1.0, 5, 5)
    with pytest.raises(ValueError, match="site_factor_max = 0: must be >= 1"):
        slurm_site_factor(p, 1.0, 0)
