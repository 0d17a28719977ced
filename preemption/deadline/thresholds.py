"""The threshold X that x must stay below: static, adaptive (eq. 2) or from the CDF of past
successes. Pure: the caller keeps the history and the current X."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vjob.errors import InputError


@dataclass(frozen=True, slots=True)
class Bounds:
    """X_min < X < X_max: the paper's safeguard against the adaptive loop running away."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise InputError(f"deadline bounds: x_min = {self.low!r}, x_max = {self.high!r}: need x_min <= x_max")

    def clip(self, value: float) -> float:
        return min(self.high, max(self.low, value))


def adaptive_threshold(current: float, *, target: float, measured: float, delta_x: float, bounds: Bounds) -> float:
    """X_i = X_{i−1} ± Δx·|F_target − F_measured|, clipped to the bounds.

    The paper writes the step with an absolute value and says in words which way it goes: X is
    lowered when the failure rate is above the target (refuse more) and raised when below
    (accept more). The step is proportional to the error but scaled by a small Δx so one bad
    stretch does not throw X from one bound to the other."""
    for name, value in (("target", target), ("measured", measured)):
        if not (0.0 <= value <= 1.0):
            raise InputError(f"adaptive_threshold: {name} = {value!r}: a failure rate must be in 0..1")
    if not (math.isfinite(delta_x) and delta_x >= 0):
        raise InputError(f"adaptive_threshold: delta_x = {delta_x!r}: must be >= 0")
    step = delta_x * abs(target - measured)
    if measured > target:
        return bounds.clip(current - step)
    if measured < target:
        return bounds.clip(current + step)
    return bounds.clip(current)


def cdf_threshold(headrooms: Sequence[float], *, probability: float, bounds: Bounds, default: float) -> float:
    """The largest X such that at least `probability` of the past jobs would have met their
    deadline had they been admitted at x = X.

    A job's headroom h is the largest x at which it still made its deadline: 1 − actual remaining
    / predicted remaining, measured when it ends (the caller computes it; jobs killed at the
    deadline count with h at most their x). Success ⟺ x ≤ h, so P(success | x) = share of
    headrooms ≥ x: the threshold is read off that empirical CDF. Why headrooms and not the x of
    past successes: successes only ever had x < X, so a quantile of them can only move X down
    (censoring); the headroom does not depend on the X in force. No history: `default` (clipped).
    """
    if not (0.0 < probability <= 1.0):
        raise InputError(f"cdf_threshold: probability = {probability!r}: must be in (0, 1]")
    hs = sorted(h for h in headrooms if math.isfinite(h))
    if not hs:
        return bounds.clip(default)
    # at least ceil(p·n) headrooms must be >= X: X is the ceil(p·n)-th largest
    need = max(1, math.ceil(probability * len(hs) - 1e-12))
    return bounds.clip(hs[len(hs) - need])


def failure_rate(outcomes: Iterable[bool]) -> float:
    """Share of failures among recent outcomes (True = the job met its deadline); 0 when empty."""
    total = failed = 0
    for ok in outcomes:
        total += 1
        failed += not ok
    return failed / total if total else 0.0
