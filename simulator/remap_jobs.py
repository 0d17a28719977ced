"""The jobs of a heterogeneous replay (simulator/remap_engine.py): a trace's jobs given kinds,
or the paper's Lublin–Feitelson stream at a chosen load.

Why apart from the engine: what is replayed is chosen once per seed and shared by every
remapping and policy compared on it (simulator/remap_cli.py, bench/remap.py); the engine only
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.lublin import generate
from simulator.subclusters import Farm
from simulator.workload import Workload


@dataclass(frozen=True)
class RemapJobs:
    """The jobs of one replay: submit (s), size (cores), kind index, reference run time (s)."""

    submit: np.ndarray
    slots: np.ndarray
    kind: np.ndarray
    runtime: np.ndarray


def jobs_from_workload(workload: Workload, farm: Farm, seed: int) -> RemapJobs:
    """Kinds drawn by the farm's weights (seeded); sizes clipped to the largest sub-cluster."""
    rng = np.random.default_rng(seed)
    weights = np.array([k.weight for k in farm.kinds], dtype=float)
    kind = rng.choice(len(farm.kinds), size=len(workload), p=weights / weights.sum())
    biggest = max(s.slots for s in farm.subclusters)
    order = np.argsort(workload.submit, kind="stable")
    return RemapJobs(
        submit=workload.submit[order].astype(float),
        slots=np.clip(workload.nodes[order], 1, biggest).astype(int),
        kind=kind,
        runtime=np.maximum(1.0, workload.runtime[order].astype(float)),
    )


def at_load(jobs: RemapJobs, cores: int, load: float) -> RemapJobs:
    """The same jobs with arrivals stretched or squeezed to `load`: reference core-seconds
    asked over cores × span (the paper fed its farm a stream that kept a queue)."""
    span = float(jobs.submit.max() - jobs.submit.min())
    if span <= 0 or load <= 0:
        return jobs
    offered = float(np.sum(jobs.runtime * jobs.slots)) / (cores * span)
    submit = jobs.submit.min() + np.floor((jobs.submit - jobs.submit.min()) * offered / load)
    return RemapJobs(submit=submit, slots=jobs.slots, kind=jobs.kind, runtime=jobs.runtime)


def paper_stream(farm: Farm, jobs: int, seed: int, load: float, runtime_s: tuple[float, float]) -> RemapJobs:
    """A Lublin–Feitelson stream like the paper's: sizes up to the largest sub-cluster, run
    times clipped to `runtime_s` (its NPB kernels ran for minutes to about 1.5 h), kinds drawn
    with `seed`, arrivals at `load` of the farm's cores."""
    biggest = max(s.slots for s in farm.subclusters)
    workload = generate(biggest, jobs, seed=seed)
    workload.runtime[:] = np.clip(workload.runtime, *runtime_s)
    cores = sum(s.slots for s in farm.subclusters)
    return at_load(jobs_from_workload(workload, farm, seed), cores, load)
