"""One trial: the trace split in time, a point of the space replayed, its objectives measured.

Why split in time and not at random: a site tunes on its past and runs on its future; the
held-back part (the last 30 % of the span by default) is what `vjob tune show` reports, like
the training phase of the deadline paper. Both parts get the same injected interactive jobs
(the set-up is drawn once over the whole trace, then cut), and each part starts on an empty
machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.cli import read_trace
from simulator.metrics import summary
from simulator.replay import ClusterModel
from simulator.setup import UbisSetup, apply
from simulator.tune.space import configs, measure
from simulator.workload import Workload
from vjob.errors import InputError


@dataclass(frozen=True)
class Spec:
    """What every worker of a study replays; stored with the study (JSON), so workers started
    anywhere (a Slurm array task) replay exactly what the study was created with."""

    trace: str
    nodes: int
    objectives: list[str]
    policy: str = "ubis"
    interactive_frac: float = 0.0
    interactive_mean_size: float = 100.0
    os_count: int = 2
    seed: int = 1
    max_jobs: int | None = None
    cap_mode: str = "preempt"
    train_fraction: float = 0.7
    lenient: bool = False
    backfill_depth: int = 500
    priority_refresh_s: float = 0.0
    priority: dict[str, Any] = field(default_factory=dict)
    scheduling: dict[str, Any] = field(default_factory=dict)
    bounds: dict[str, list[float]] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)
    """Parameters searched among a few values (`[scheduling] tier_order`), with those values."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Spec:
        return cls(**doc)


_PARTS: dict[tuple[Any, ...], tuple[Workload, Workload]] = {}


def parts(spec: Spec) -> tuple[Workload, Workload]:
    """(train, test) jobs of `spec`, cached per process: every trial of a worker reuses them."""
    key = (
        spec.trace,
        spec.nodes,
        spec.interactive_frac,
        spec.interactive_mean_size,
        spec.os_count,
        spec.seed,
        spec.max_jobs,
        spec.train_fraction,
        spec.lenient,
    )
    if key not in _PARTS:
        _PARTS[key] = split(spec)
    return _PARTS[key]


def split(spec: Spec) -> tuple[Workload, Workload]:
    workload = read_trace(spec.trace, lenient=spec.lenient)
    if spec.max_jobs:
        workload = workload.take(slice(0, spec.max_jobs))
    if len(workload) == 0:
        raise InputError(f"--trace {spec.trace}: no jobs in the trace (empty, or every line skipped)")
    setup = UbisSetup(
        interactive_frac=spec.interactive_frac,
        interactive_mean_size=spec.interactive_mean_size,
        os_count=spec.os_count,
        seed=spec.seed,
    )
    jobs = apply(workload, spec.nodes, setup).sorted_by_submit()
    if len(jobs) < 2:
        raise InputError(f"--trace {spec.trace}: {len(jobs)} job fits {spec.nodes} nodes; need at least 2 to split")
    cut = float(jobs.submit.max()) * spec.train_fraction
    train_mask = jobs.submit < cut
    if train_mask.all() or not train_mask.any():
        raise InputError(
            f"--train-fraction {spec.train_fraction:g}: leaves one part of {spec.trace} empty "
            "(its jobs are all submitted at once)"
        )
    return _from_zero(jobs.take(train_mask)), _from_zero(jobs.take(~train_mask))


def _from_zero(w: Workload) -> Workload:
    w.submit = w.submit - w.submit.min()
    return w


def evaluate(
    spec: Spec, params: dict[str, float | str], part: str = "train", policy: str | None = None
) -> dict[str, Any]:
    """The summary (simulator.metrics.summary) of `params` replayed on `part` of the trace,
    with `objectives`: the spec's objectives measured on it."""
    # heavy: numba (the engine compiles its passes on import)
    from simulator.engine import simulate

    train, test = parts(spec)
    jobs = train if part == "train" else test
    model = ClusterModel(
        nodes=spec.nodes,
        os_count=spec.os_count,
        backfill_depth=spec.backfill_depth if spec.backfill_depth > 0 else None,
        priority_refresh_s=spec.priority_refresh_s,
    )
    prio, sched = configs(params, spec.priority, spec.scheduling)
    result = simulate(jobs, model, policy or spec.policy, prio, None, sched, spec.cap_mode)
    doc = summary(result)
    doc["objectives"] = {name: measure(doc, name) for name in spec.objectives}
    return doc


def jobs_per_part(spec: Spec) -> tuple[int, int]:
    train, test = parts(spec)
    return len(train), len(test)
