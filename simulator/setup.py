"""The UBIS experimental set-up: interactive jobs injected into a batch trace, OS images drawn.

Why separate from the readers: the same trace is replayed under many set-ups (the paper's grid
of interactive fractions, sizes and caps), and each set-up must be reproducible from its seed
alone, whatever policy then replays it.

UBIS section IV: a given fraction of *all* jobs is interactive; their sizes follow a Poisson
law of mean 50, 100 or 150 nodes (capped at the machine, at least 1), their durations are
uniform in 10–120 minutes, and they arrive uniformly over the trace's span, interleaved with
the batch jobs. Every job asks for one of `os_count` OS images (equal shares by default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from simulator.workload import Workload, concat
from vjob.errors import InputError

_NODE_TYPE = re.compile(r"cl_([A-Za-z0-9_-]+)")


@dataclass(frozen=True)
class UbisSetup:
    """What to inject and how to assign OS images; every field has the paper's meaning."""

    interactive_frac: float = 0.0
    """Share of all jobs (after injection) that are interactive, 0..1 (exclusive of 1)."""
    interactive_mean_size: float = 100.0
    """Mean of the Poisson law of interactive job sizes, in nodes."""
    interactive_min_s: float = 600.0
    interactive_max_s: float = 7200.0
    os_count: int = 2
    os_weights: tuple[float, ...] | None = None
    """Relative share of each OS image among jobs; None = equal shares."""
    os_from_properties: bool = False
    """Take the job's OS from the node type in its trace properties (wagap's `cl_NAME`)."""
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.interactive_frac < 1:
            raise InputError(f"--interactive-frac = {self.interactive_frac}: must be in 0..1 (exclusive of 1)")
        if self.interactive_mean_size <= 0:
            raise InputError(f"--interactive-mean-size = {self.interactive_mean_size}: must be > 0 (nodes)")
        if not 0 < self.interactive_min_s <= self.interactive_max_s:
            raise InputError(
                f"interactive durations {self.interactive_min_s}..{self.interactive_max_s} s: need 0 < min <= max"
            )
        if self.os_count < 1:
            raise InputError(f"--os-count = {self.os_count}: must be >= 1")
        if self.os_weights is not None and (
            len(self.os_weights) != self.os_count or min(self.os_weights) < 0 or sum(self.os_weights) <= 0
        ):
            raise InputError(f"os_weights = {self.os_weights}: need {self.os_count} non-negative shares, not all 0")


def apply(workload: Workload, nodes: int, setup: UbisSetup) -> Workload:
    """`workload` (batch) plus the injected interactive jobs, with an OS image per job.

    Trace jobs larger than the machine cannot run on it: they are dropped and counted in
    `skipped["too_big"]`. Submit times are shifted so the first job arrives at 0.
    """
    if nodes < 1:
        raise InputError(f"--nodes = {nodes}: must be >= 1")
    rng = np.random.default_rng(setup.seed)
    base = workload.sorted_by_submit()
    fits = base.nodes <= nodes
    if not fits.all():
        skipped = dict(base.skipped)
        base = base.take(fits)
        skipped["too_big"] = skipped.get("too_big", 0) + int((~fits).sum())
        base.skipped = skipped
    base.interactive = np.zeros(len(base), dtype=bool)
    base.os = _batch_os(base, setup, rng)
    if setup.interactive_frac == 0 or len(base) == 0:
        return _shift(base)
    count = round(setup.interactive_frac / (1.0 - setup.interactive_frac) * len(base))
    start, end = float(base.submit.min()), float(base.submit.max())
    submit = np.sort(rng.uniform(start, max(end, start + 1.0), count)).round()
    size = np.clip(rng.poisson(setup.interactive_mean_size, count), 1, nodes)
    runtime = rng.uniform(setup.interactive_min_s, setup.interactive_max_s, count).round()
    first_id = int(base.job_id.max()) + 1
    injected = Workload.from_columns(
        {
            "job_id": np.arange(first_id, first_id + count),
            "submit": submit,
            "runtime": runtime,
            "nodes": size,
            "os": rng.choice(setup.os_count, size=count, p=_os_probabilities(setup)),
            "interactive": np.ones(count, dtype=bool),
        },
        properties=[""] * count if base.properties is not None else None,
    )
    return _shift(concat(base, injected))


def _os_probabilities(setup: UbisSetup) -> np.ndarray:
    weights = np.asarray(setup.os_weights or [1.0] * setup.os_count, dtype=np.float64)
    return weights / weights.sum()


def _batch_os(base: Workload, setup: UbisSetup, rng: np.random.Generator) -> np.ndarray:
    drawn = rng.choice(setup.os_count, size=len(base), p=_os_probabilities(setup))
    if not setup.os_from_properties or base.properties is None:
        return drawn
    names: dict[str, int] = {}
    out = drawn.copy()
    for i, text in enumerate(base.properties):
        m = _NODE_TYPE.search(text)
        if m:
            out[i] = names.setdefault(m.group(1), len(names)) % setup.os_count
    return out


def _shift(w: Workload) -> Workload:
    if len(w):
        w.submit = w.submit - w.submit.min()
    return w
