"""bench/agent_tick.py's carry of real squeue --json's cost, and the pace it drives.

Why: the bench's stand-in squeue only copies a prepared file (0.85 s at 120,000 jobs), while
real Slurm 22.05's squeue spends 106 µs of CPU a job it prints (bench/squeue_real.py on the
dev cluster: 12.7 s of CPU, 13.5-29 s of wall time at 120,000 jobs). Timing the stand-in would
pace the reads by a cost no real site has. So the adapter's pace (plugins.slurm.json_pace) is
given this clock instead of the real one:

- each tick starts `interval_s` after the one before (the agent's loop), or where the last one
  ended if that is later; with `--wake` the tick's arrivals come at that start and wake the
  agent, so the tick starts as they come (arrivals stay one batch an interval: a woken tick
  whose read is not due yet does not bring the next batch sooner);
- a JSON read (a fetch or a full read) moves the clock by the wall time real squeue would take
  to print what it prints: every listed job on 22.05 (squeue --json ignores the filter), the
  asked jobs only on 23.11 (`--jobs=`), at `--squeue-json-wall-per-job` seconds a job. The
  agent's own part of the read (the cut and decode, ~0.1 s) is left out of that wall: it is
  under a hundredth of squeue's.
The host's CPU of a tick is then the agent's measured CPU plus the jobs squeue printed in that
tick × `--squeue-json-cpu-per-job`. An interactive arrival is put at the end of the tick before
(the worst place without a wake). `steady_cpu_s` is now a median over ticks with and without a
read (`steady_cpu_with_read_s`, `steady_cpu_without_read_s` apart); `--json-read-share 1` reads
at every tick, as the figures from before the pace did.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

SQUEUE_JSON_CPU_PER_JOB = 106e-6
"""squeue --json's CPU a job printed, real Slurm 22.05 on the dev cluster (bench/squeue_real.py,
fitted over 1,000-6,000 jobs: 105.8 µs)."""
SQUEUE_JSON_WALL_PER_JOB = 112.5e-6
"""Its wall time a job at the quiet end of what was measured (13.5 s at 120,000 jobs, load 1;
29 s at load 4): the shortest wall paces the reads the most often, so the host's CPU carried
is the highest of the measured range."""


class Carry:
    """The bench's clock for the pace, and the jobs real squeue would print, tick by tick."""

    def __init__(self, interval_s: float, wall_per_job: float, *, filtered: bool) -> None:
        self.interval_s = interval_s
        self.wall_per_job = wall_per_job
        self.filtered = filtered
        """Whether squeue honours `--jobs=` (23.02 and later): a fetch prints only those."""
        self.now = 0.0
        self.tick_start = -interval_s
        self.printed = 0
        """Jobs squeue --json printed in the current tick."""
        self.listed = 0
        self.arrived: dict[str, float] = {}
        """Interactive job id → when it was submitted (the clock at the cluster's move)."""
        self.latency: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wrap(self, incremental: Any, listed: Callable[[], int]) -> None:
        """Route the adapter's JSON reads through the carry (`listed`: the jobs squeue knows)."""
        fetch, read_all = incremental.fetch, incremental.read_all

        def carried_fetch(ids: set[str]) -> Iterable[Any]:
            out = list(fetch(ids))
            self._read(len(ids) if self.filtered else listed())
            return out

        def carried_read_all() -> Iterable[Any]:
            out = list(read_all())
            self._read(listed())
            return out

        incremental.fetch, incremental.read_all = carried_fetch, carried_read_all
        incremental.pace.clock = self

    def _read(self, jobs: int) -> None:
        self.printed += jobs
        self.now += jobs * self.wall_per_job

    def start_tick(self, *, woken: bool) -> None:
        """The next tick begins: at once when woken, else at the interval."""
        self.now = self.now if woken else max(self.now, self.tick_start + self.interval_s)
        self.tick_start = self.now
        self.printed = 0

    def arrive(self, job_ids: list[int], adapter: Any, wake: bool) -> None:
        """Interactive jobs submitted now; with `wake` they wake the agent (its loop calls
        `adapter.woken()` when job_submit.lua rewrites its wake file) and the tick starts at once:
        they are submitted at the interval's end, not where the last tick ended."""
        if wake and job_ids:
            self.now = max(self.now, self.tick_start + self.interval_s)
        for job_id in job_ids:
            self.arrived[str(job_id)] = self.now
        if wake and job_ids:
            adapter.woken()
        self.start_tick(woken=wake and bool(job_ids))

    def paced(self, look: Any) -> dict[str, Any]:
        """What the pace did in the tick (plugins.slurm.incremental.Look) and squeue's carry."""
        return {
            "json_read": look.read,
            "deferred": look.deferred,
            "stale": look.stale,
            "urgent": look.urgent,
            "squeue_json_jobs": self.printed,
        }

    def seen(self, ids: set[str]) -> None:
        """After a tick: the interactive arrivals the view now holds, with their latency."""
        for job_id in [j for j in self.arrived if j in ids]:
            self.latency.append(self.now - self.arrived.pop(job_id))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json-read-share", type=float, default=0.2, help="[slurm] json_read_share")
    parser.add_argument(
        "--json-read-share-woken", type=float, default=0.5, help="[slurm] json_read_share_woken (with --wake)"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="the agent's interval_s (the pace's clock)")
    parser.add_argument("--wake", action="store_true", help="each interactive arrival wakes the agent")
    parser.add_argument(
        "--squeue-json-cpu-per-job",
        type=float,
        default=SQUEUE_JSON_CPU_PER_JOB,
        help="real squeue --json's CPU a job printed, carried (bench/squeue_real.py, 22.05)",
    )
    parser.add_argument("--squeue-json-wall-per-job", type=float, default=SQUEUE_JSON_WALL_PER_JOB)


def summary(steady: list[dict[str, Any]], carry: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The pace's figures over the steady ticks (recalculation ticks included: a read is paced
    whatever the tick). The host's CPU a tick is a mean: a read comes every few ticks."""
    cpu_per_job = args.squeue_json_cpu_per_job
    with_read = sorted(t["cpu_s"] for t in steady if t["json_read"])
    without = sorted(t["cpu_s"] for t in steady if not t["json_read"])
    host = [t["cpu_s"] + t["squeue_json_jobs"] * cpu_per_job for t in steady]
    lat = sorted(carry["latency"])
    return {
        "json_read_share": args.json_read_share,
        "json_read_share_woken": args.json_read_share_woken,
        "wake": args.wake,
        "squeue_json_cpu_per_job": cpu_per_job,
        "squeue_json_wall_per_job": args.squeue_json_wall_per_job,
        "json_reads": sum(1 for t in steady if t["json_read"]),
        "json_read_tick_share": round(len(with_read) / len(steady), 3),
        "steady_cpu_without_read_s": without[len(without) // 2] if without else None,
        "steady_cpu_with_read_s": with_read[len(with_read) // 2] if with_read else None,
        "squeue_json_jobs_per_tick": round(sum(t["squeue_json_jobs"] for t in steady) / len(steady)),
        "host_cpu_per_tick_s": round(sum(host) / len(host), 3),
        "deferred_max": max(t["deferred"] for t in steady),
        "interactive_seen": len(lat),
        "interactive_unseen": carry["unseen"],
        "interactive_latency_median_s": round(lat[len(lat) // 2], 1) if lat else None,
        "interactive_latency_max_s": round(lat[-1], 1) if lat else None,
    }


__all__ = ["SQUEUE_JSON_CPU_PER_JOB", "SQUEUE_JSON_WALL_PER_JOB", "Carry", "add_options", "summary"]
