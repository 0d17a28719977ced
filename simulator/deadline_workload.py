"""Workloads for the deadline replay: the paper-like mix, or an SWF/Torque trace with deadlines.

The paper's workload is "mixed jobs with low, high CPU and memory requirements", ATLAS-like
(hours long, up to a day), its deadline the job's duration plus a 5 % buffer. As in the paper's
simulator the estimate is the duration (`over_estimate` > 0 draws walltime requests that
over-estimate it by up to that share, as real users do; docs/deadline.md shows what that does
to the x-factor).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from preemption.deadline.vo_model import KINDS
from vjob.errors import InputError


@dataclass(frozen=True, slots=True)
class DJob:
    """One job of the deadline replay (times in seconds)."""

    id: int
    submit: float
    duration: float
    """Bare-metal running time (what it takes on a physical node, alone)."""
    estimate: float
    """What the user declared (walltime request); predictions start from it."""
    deadline: float
    kind: str
    vms: int = 1
    cores: int = 1
    mem_gb: float = 1.0


# (kind, cores per VM, memory GB per VM, share): low/high CPU and low/high memory jobs.
PAPER_MIX: tuple[tuple[str, int, float, float], ...] = (
    ("cpu", 1, 1.0, 0.30),
    ("cpu", 2, 2.0, 0.20),
    ("mem", 1, 2.0, 0.30),
    ("mem", 1, 4.0, 0.20),
)


def paper_workload(
    hours: float,
    *,
    cores: int,
    load: float,
    buffer: float,
    seed: int,
    start: float = 0.0,
    first_id: int = 0,
    over_estimate: float = 0.0,
) -> list[DJob]:
    """Jobs until their bare durations sum to `hours` of work, arriving as a Poisson process
    sized so that they ask for `load` of the `cores` on physical nodes.

    Durations are log-normal with a median of 2 h, cut to 15 min..24 h (ATLAS-like)."""
    if hours <= 0 or cores < 1 or not (0 < load <= 2) or not (0 <= buffer <= 10):
        raise InputError(
            f"paper_workload: hours = {hours}, cores = {cores}, load = {load}, buffer = {buffer}: "
            "need hours > 0, cores >= 1, 0 < load <= 2, 0 <= buffer <= 10"
        )
    rng = random.Random(seed)
    kinds = [m for m in PAPER_MIX]
    weights = [m[3] for m in PAPER_MIX]
    mean_cores = sum(m[1] * m[3] for m in PAPER_MIX)
    mean_duration = _mean_lognormal_cut(math.log(7200), 1.0, 900, 86400)
    rate = load * cores / (mean_cores * mean_duration)  # jobs per second
    jobs: list[DJob] = []
    work = 0.0
    t = start
    while work < hours * 3600:
        t += rng.expovariate(rate)
        kind, c, mem, _ = rng.choices(kinds, weights)[0]
        duration = min(86400.0, max(900.0, rng.lognormvariate(math.log(7200), 1.0)))
        estimate = duration * (1 + rng.uniform(0, over_estimate)) if over_estimate > 0 else duration
        jobs.append(
            DJob(
                id=first_id + len(jobs),
                submit=t,
                duration=duration,
                estimate=estimate,
                deadline=t + estimate * (1 + buffer),
                kind=kind,
                cores=c,
                mem_gb=mem,
            )
        )
        work += duration
    return jobs


def _mean_lognormal_cut(mu: float, sigma: float, low: float, high: float, n: int = 20000) -> float:
    """Mean of a log-normal clipped to [low, high], by a fixed deterministic quadrature."""
    rng = random.Random(12345)
    return sum(min(high, max(low, rng.lognormvariate(mu, sigma))) for _ in range(n)) / n


def trace_jobs(workload: object, *, buffer: float, seed: int, max_vms: int) -> list[DJob]:
    """Deadline jobs from a replayed trace: deadline = submit + (1 + buffer) × requested time
    (the run time where the trace has no request); one single-core VM per requested processor
    (jobs asking for more than the machine are dropped), the kind drawn per job (the trace does
    not say what a job stresses)."""
    if not 0 <= buffer <= 10:
        raise InputError(f"--deadline-buffer = {buffer}: must be in 0..10")
    rng = random.Random(seed)
    jobs: list[DJob] = []
    submit = workload.submit  # type: ignore[attr-defined]
    runtime = workload.runtime  # type: ignore[attr-defined]
    nodes = workload.nodes  # type: ignore[attr-defined]
    walltime = workload.walltime  # type: ignore[attr-defined]
    t0 = float(submit[0]) if len(submit) else 0.0
    for i in range(len(submit)):
        vms = int(nodes[i])
        if vms > max_vms or vms < 1:
            continue
        run = float(runtime[i])
        est = float(walltime[i]) if walltime[i] > 0 else run
        est = max(est, 1.0)
        s = float(submit[i]) - t0
        jobs.append(
            DJob(
                id=i,
                submit=s,
                duration=run,
                estimate=est,
                deadline=s + est * (1 + buffer),
                kind=rng.choice(KINDS),
                vms=vms,
                cores=1,
                mem_gb=1.0,
            )
        )
    return jobs
