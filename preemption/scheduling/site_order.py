"""How vjob's order and the site's own priority (Slurm's multifactor) combine, pure.

Why not vjob's whole order on the knob: Slurm adds the site factor unweighted to the site's
multifactor sum, so an order spread over 0..1,000,000 swamps the fair share, age and QOS
terms the site keeps (at most the sum of its PriorityWeight* values). Here vjob owns two
things and the site the rest:

* **the tier**, in bands above the site's whole span: a band is wider than everything the
  site's factors and vjob's own part can add, so an interactive job within the cap, a
  checkpointed vjob and a batch job keep vjob's tier order whatever their fair share. The
  lowest tier (batch) has the second band, not the first: a job outside vjob's queue (held
  by its user or an admin) keeps the knob's lowest value and stays below every queued one;
* **a share of the order within a tier**: the job's UBIS priority (P/Σw, 0..1) times
  W = S × share / (1 − share), S the site's span. vjob's part is then one more term of the
  multifactor sum, weighted so that it owns `share` of the within-tier range: 0 leaves the
  tier to the site, 0.5 weighs UBIS as much as all the site's factors together. `share` = 1
  is the former rule (vjob's whole order, evenly spread: `tick._rank_priorities`).

Under `tier_order = "submit"` vjob has no opinion inside a tier (its order is submission,
which the site's age factor and Slurm's tie-break by job id already give): its part is 0.

The pass must walk the order the RMS will follow, or its head (the job the guard protects,
whose reservation Slurm's backfill then keeps) would not be the job Slurm starts first:
`walk_order` sorts each tier by what the RMS will hold, own priority plus the site factor
sent, and keeps vjob's order where those are equal (Slurm breaks such ties by job id, and so
does vjob's order after submission time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from vjob.model import Job
from vjob.rms import PriorityKnob

TIERS = 4
"""vjob's tiers (policies.TIER_NAMES): each gets its own band of the knob."""
_EXACT = 2**52
"""Own priorities below this in size, and values sent below it, add up exactly in int64 and
convert to float64 exactly."""


@dataclass(frozen=True)
class SiteOrder:
    """The site's own priority of the queued jobs, as the RMS computes it without vjob.

    `own`: job id → the RMS's priority minus vjob's site factor (Slurm: sprio's PRIORITY − SITE);
    a job missing (held jobs have none, a job submitted after the read) counts as 0.
    `span`: the most the site's own factors can give a job (Slurm: the sum of the
    PriorityWeight* in slurm.conf)."""

    own: Mapping[str, int]
    span: int

    def __post_init__(self) -> None:
        if self.span < 0:
            raise ValueError(f"site priority span = {self.span}: must be >= 0")


def vjob_width(span: int, share: float) -> int:
    """W, the part of a tier's range vjob's own order spans: `share` of it, the site the rest."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"order share = {share}: must be at least 0 and below 1 here")
    return round(span * share / (1.0 - share))


def band(span: int, share: float) -> int:
    """The width of one tier's band: wider than the site's span and vjob's part together."""
    return vjob_width(span, share) + span + 1


def needed_range(span: int, share: float) -> int:
    """The knob's range (high − low) the tier bands need (the first band is left to the jobs
    outside the queue); the adapter checks it fits."""
    return (TIERS + 1) * band(span, share) - 1


def site_value(tier: int, fraction: float, share: float, span: int, low: int = 0, step: int = 1) -> int:
    """The integer vjob sends for one job: its tier's band (tier 0 the highest, batch the
    second lowest) plus its share of the order within the tier. `fraction`: its UBIS priority
    over Σw (0..1), 0 when vjob has no opinion inside the tier. The RMS then holds this plus
    the job's own priority. `step`: vjob's part moves in whole steps (the knob's `min_step`),
    so that every change is worth a command and the agent can send each value exactly (the
    pass assumes the RMS holds these very values; queue time moves UBIS priorities a little
    every tick)."""
    if not 0 <= tier < TIERS:
        raise ValueError(f"tier {tier}: must be in 0..{TIERS - 1}")
    frac = min(1.0, max(0.0, fraction))
    part = int(vjob_width(span, share) * frac / step) * step  # rounded down: never above W
    return low + (TIERS - tier) * band(span, share) + part


def site_values(
    queue: Sequence[Job], tiers: Mapping[str, int], fractions: Mapping[str, float], knob: PriorityKnob, span: int
) -> dict[str, int]:
    """`site_value` of every queued job; the knob's range must hold the bands (`needed_range`).
    In arrays (`band_values`): at a site's size the queue is 100,000 jobs and one call of
    `site_value` each cost the agent half a second a tick."""
    ids = [j.id for j in queue]
    tier = np.fromiter(map(tiers.__getitem__, ids), dtype=np.int64, count=len(ids))
    if fractions:
        frac = np.fromiter(map(fractions.get, ids, repeat(0.0)), dtype=np.float64, count=len(ids))
    else:
        frac = np.zeros(len(ids), dtype=np.float64)
    return dict(zip(ids, band_values(tier, frac, knob, span).tolist(), strict=True))


def band_values(tier: np.ndarray, frac: np.ndarray, knob: PriorityKnob, span: int) -> np.ndarray:
    """`site_value` of each job from its tier and its UBIS fraction, as arrays (the same
    arithmetic, float64 as Python's floats); ValueError when the knob's range cannot hold the
    bands or a tier is outside them."""
    if needed_range(span, knob.share) > knob.high - knob.low:
        raise ValueError(
            f"the tier bands need a range of {needed_range(span, knob.share)} for a site span of {span}"
            f" at order share {knob.share}; the knob has {knob.high - knob.low}"
        )
    if tier.size and (int(tier.min()) < 0 or int(tier.max()) >= TIERS):
        bad = int(tier.min()) if int(tier.min()) < 0 else int(tier.max())
        raise ValueError(f"tier {bad}: must be in 0..{TIERS - 1}")
    frac = np.minimum(1.0, np.maximum(0.0, frac))
    step = knob.min_step
    part = (vjob_width(span, knob.share) * frac / step).astype(np.int64) * step  # rounded down
    return knob.low + (TIERS - tier) * band(span, knob.share) + part


def ubis_fractions(
    ids: Sequence[str], tier: np.ndarray, priorities: Mapping[str, float], max_priority: float, tiers_rated: str
) -> np.ndarray:
    """Each job's UBIS priority over the largest possible one (`priorities[id] / max_priority`,
    float64 as Python's division), for the jobs vjob rates: `tiers_rated` "all", "interactive"
    (tier 0 only) or "none" (`tier_order = "submit"`); 0 for the others, and for all when
    `max_priority` is not positive."""
    if tiers_rated == "none" or max_priority <= 0:
        return np.zeros(len(ids), dtype=np.float64)
    frac = np.fromiter(map(priorities.__getitem__, ids), dtype=np.float64, count=len(ids)) / max_priority
    if tiers_rated == "interactive":
        frac[tier != 0] = 0.0
    return frac


def walk_positions(values: np.ndarray, ids: Sequence[str], own: Mapping[str, int]) -> np.ndarray | None:
    """`walk_order` as positions in the queue (`ids`, the values sent from `band_values`, the
    own priorities `own`, 0 where missing): what the RMS will hold, highest first, a stable
    sort, in arrays. None when a value or an own priority is beyond ±2**52: only there could
    the int64 sum and its float64 differ from walk_order's Python sums (then use those)."""
    try:  # a list first: faster than `np.fromiter` over the look-ups (0.03 against 0.05 s at 100,000)
        mine = np.array(list(map(own.get, ids, repeat(0))), dtype=np.int64) if ids else np.zeros(0, dtype=np.int64)
    except OverflowError:
        return None
    for part in (values, mine):
        if part.size and (int(part.min()) <= -_EXACT or int(part.max()) >= _EXACT):
            return None
    return np.argsort(-(values + mine).astype(np.float64), kind="stable")


def walk_order(ordered: Sequence[Job], sent: Mapping[str, int], own: Mapping[str, int]) -> list[Job]:
    """`ordered` (vjob's order) sorted by what the RMS will hold, highest first: the value
    sent plus the job's own priority; equal totals keep vjob's order (a stable sort; totals
    stay far below 2**53, exact in float64)."""
    total = np.fromiter((sent[j.id] + own.get(j.id, 0) for j in ordered), dtype=np.float64, count=len(ordered))
    return [ordered[k] for k in np.argsort(-total, kind="stable").tolist()]
