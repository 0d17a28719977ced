"""Refit the VO model online from finished vjobs (docs/deadline.md, "Learned online").

Each observation is one job the agent watched run: its time limit (the agent's estimate of the
job's bare work — it knows no other), how long it really ran, and how many other jobs shared a
node with it. Its observed slowdown is actual / time limit: exactly the factor that would have
made the agent's prediction (time limit × slowdown) right. Per kind, a least-squares line
slowdown = 1 + base + pair·colocated through those samples replaces the prior's base and
diagonal once there are `min_samples` of them.

Why the bounds: job data is hostile and noisy. Each sample is clipped to [1, max_slowdown]
before the fit (a VM is never faster than bare metal; one job that ran for a year against a
one-minute limit weighs no more than one at max_slowdown), the fitted base to [0, max_slowdown
− 1] and the per-neighbour slope to [0, (max_slowdown − 1) / max_colocated]. So with m samples
alone on their node, one outlier moves the alone slowdown by at most (max_slowdown − 1) / m.

An observation without a kind (the agent cannot tell kinds apart) counts for every kind: the
agent and the hooks use a single slowdown (the worst kind alone) anyway. Observations of a kind
outside KINDS are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from preemption.deadline.vo_model import KINDS, VOModel
from vjob.errors import InputError

MIN_SAMPLES = 20
MAX_SLOWDOWN = 3.0
MAX_COLOCATED = 8


class Observed(Protocol):
    """What the refit reads of an observation (vjob.store.vo_observations.Observation)."""

    @property
    def kind(self) -> str | None: ...
    @property
    def colocated(self) -> int: ...
    @property
    def walltime_s(self) -> float: ...
    @property
    def actual_s(self) -> float: ...


def observed_slowdown(obs: Observed, *, max_slowdown: float = MAX_SLOWDOWN) -> float:
    """actual / time limit, clipped to [1, max_slowdown]."""
    return min(max_slowdown, max(1.0, obs.actual_s / obs.walltime_s))


def _fit_line(samples: list[tuple[int, float]], prior_slope: float, slope_max: float) -> tuple[float, float]:
    """(base, slope) of slowdown − 1 = base + slope·n by least squares, slope clamped; with a
    single co-location count the slope cannot be seen, so the prior's is kept."""
    m = len(samples)
    mean_n = sum(n for n, _ in samples) / m
    mean_s = sum(s for _, s in samples) / m
    var = sum((n - mean_n) ** 2 for n, _ in samples)
    if var > 0:
        slope = sum((n - mean_n) * (s - mean_s) for n, s in samples) / var
    else:
        slope = prior_slope
    slope = min(max(slope, 0.0), slope_max)
    return mean_s - slope * mean_n - 1.0, slope


def refit_vo_model(
    prior: VOModel,
    observations: Iterable[Observed],
    *,
    min_samples: int = MIN_SAMPLES,
    max_slowdown: float = MAX_SLOWDOWN,
    max_colocated: int = MAX_COLOCATED,
) -> VOModel:
    """The prior with each kind's base and diagonal pair refitted from `observations` where
    there are at least `min_samples`; off-diagonal pairs stay the prior's. `meta` gives the
    sample count per kind and which kinds were learned."""
    if min_samples < 1:
        raise InputError(f"refit_vo_model: min_samples = {min_samples!r}: must be >= 1")
    if not max_slowdown >= 1.0 or max_slowdown == float("inf"):
        raise InputError(f"refit_vo_model: max_slowdown = {max_slowdown!r}: must be a finite number >= 1")
    if max_colocated < 1:
        raise InputError(f"refit_vo_model: max_colocated = {max_colocated!r}: must be >= 1")
    per_kind: dict[str, list[tuple[int, float]]] = {k: [] for k in KINDS}
    for o in observations:
        if o.walltime_s <= 0 or o.actual_s <= 0:
            continue
        sample = (min(max(o.colocated, 0), max_colocated), observed_slowdown(o, max_slowdown=max_slowdown))
        for k in KINDS if o.kind is None else (o.kind,) if o.kind in KINDS else ():
            per_kind[k].append(sample)
    base = dict(prior.base)
    pair = {k: dict(row) for k, row in prior.pair.items()}
    learned = []
    slope_max = (max_slowdown - 1.0) / max_colocated
    for k, samples in per_kind.items():
        if len(samples) < min_samples:
            continue
        b, slope = _fit_line(samples, prior.pair[k][k], slope_max)
        base[k] = min(max(b, 0.0), max_slowdown - 1.0)
        pair[k][k] = slope
        learned.append(k)
    if not learned:
        return prior
    meta = {
        "samples": {k: len(v) for k, v in per_kind.items()},
        "learned": learned,
        "min_samples": min_samples,
        "max_slowdown": max_slowdown,
        "prior": prior.source,
    }
    return VOModel(base=base, pair=pair, source="learned", meta=meta)


__all__ = ["MAX_COLOCATED", "MAX_SLOWDOWN", "MIN_SAMPLES", "observed_slowdown", "refit_vo_model"]
