"""Slurm's own `squeue --json` on the real dev cluster, per job: the peer of the agent's tick.

Why: issue 37 asks the agent's steady tick to cost no more than Slurm's own `squeue --json` on the
same jobs. bench/agent_tick.py's stand-in prints a prepared file, which says nothing of what
slurmctld and squeue spend to make that document. Here the real Slurm 22.05 of the dev cluster
(deploy/devcluster) holds N pending batch jobs (a site's queue is mostly waiting jobs), and each
size is timed: `squeue --json` (wall, squeue's CPU, slurmctld's CPU during the call), the numeric
listing the agent reads each tick, and `sprio`. Per-job costs are fitted over the sizes
(least squares through the measured points) and carried to bench/agent_tick.py's 120,000 jobs.

A first job holds every node (exclusive, an hour's sleep), then the jobs are submitted as
root: they wait for resources with their priority computed, as sprio shows them (sprio leaves
out held jobs and jobs waiting for a begin time or a dependency), and never run. All are named
for this bench and cancelled
at the end (also after a failure). slurmctld's MaxJobCount (10,000 by default) bounds N.
Run it under the dev cluster's lock:
    flock /tmp/vjob-devcluster.lock env PYTHONPATH=. nice .venv/bin/python bench/squeue_real.py
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from devkit.devcluster import DevCluster, Settings
from devkit.devcluster_daemons import read_pid
from plugins.slurm.incremental import LISTING_ARGS

NAME = "vjob-squeue-bench"
SITE_JOBS = 120_000


def _clock_ticks(pid: int) -> int:
    """utime + stime of a process in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def timed(argv: list[str], env: dict[str, str], ctld: int) -> dict[str, float]:
    """One call: wall s, the client's CPU s, slurmctld's CPU s meanwhile, bytes printed."""
    hz = os.sysconf("SC_CLK_TCK")
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ctld0 = _clock_ticks(ctld)
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, env=env, check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
    return {
        "wall_s": wall,
        "client_cpu_s": client,
        "slurmctld_cpu_s": (_clock_ticks(ctld) - ctld0) / hz,
        "bytes": len(out.stdout),
    }


def submit(count: int, env: dict[str, str], workers: int = 4) -> None:
    """`count` held jobs, submitted by a few parallel loops of sbatch."""

    def batch(n: int) -> None:
        for _ in range(n):
            subprocess.run(
                ["sbatch", "-J", NAME, "-o", "/dev/null", "--wrap", "true"],
                env=env,
                check=True,
                capture_output=True,
            )

    share = [count // workers + (1 if k < count % workers else 0) for k in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(batch, share))


def block(env: dict[str, str]) -> None:
    """One job on every node, running, so that the bench's jobs wait for resources."""
    nodes = subprocess.run(["sinfo", "-h", "-o", "%D"], env=env, capture_output=True, text=True, check=True)
    count = sum(int(n) for n in nodes.stdout.split())
    argv = ["sbatch", "--parsable", "-J", NAME, "-N", str(count), "--exclusive", "-o", "/dev/null"]
    job = subprocess.run([*argv, "--wrap", "sleep 3600"], env=env, capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    for _ in range(60):
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True)
        if state.stdout.strip() == "RUNNING":
            return
        time.sleep(1)
    raise SystemExit(f"the blocking job {job_id} did not start within 60 s")


def queued(env: dict[str, str]) -> int:
    out = subprocess.run(["squeue", "-h", "-n", NAME, "-t", "PD", "-o", "%i"], env=env, capture_output=True, text=True)
    return len(out.stdout.split())


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line (intercept, slope per job) through (jobs, seconds)."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,3000,6000", help="queued jobs at each measurement")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    cluster = DevCluster()
    started = not cluster.is_up()
    if started:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
    env = {**os.environ, **cluster.env}
    ctld = read_pid(cluster.run / "slurmctld.pid")
    if ctld is None:
        raise SystemExit("the dev cluster's slurmctld has no pid file")
    rows = []
    try:
        block(env)
        for size in sizes:
            have = queued(env)
            if size > have:
                t0 = time.monotonic()
                submit(size - have, env)
                print(f"{size} jobs queued ({time.monotonic() - t0:.0f} s to submit)", file=sys.stderr)
            listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, check=True)
            total = len(listed.stdout.split())
            row: dict[str, object] = {"jobs_ours": size, "jobs_listed": total}
            for name, argv in (
                ("squeue_json", ["squeue", "--json"]),
                ("listing", ["squeue", *LISTING_ARGS]),
                ("sprio", ["sprio", "-h", "-o", "%i|%Y|%S|%P|%J|%N|%Q|%A|%F"]),
            ):
                runs = [timed(argv, env, ctld) for _ in range(args.repeat)]
                row[name] = {k: round(median([r[k] for r in runs]), 4) for k in runs[0]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        subprocess.run(["scancel", "-n", NAME], env=env, check=False)
        if started:
            cluster.down()
    carried: dict[str, dict[str, float]] = {}
    for name in ("squeue_json", "listing", "sprio"):
        carried[name] = {}
        for key in ("wall_s", "client_cpu_s", "slurmctld_cpu_s", "bytes"):
            base, per_job = fit([(int(r["jobs_listed"]), float(r[name][key])) for r in rows])  # type: ignore[index]
            carried[name][f"{key}_per_job"] = round(per_job, 9 if key != "bytes" else 1)
            carried[name][f"{key}_at_{SITE_JOBS}"] = round(base + per_job * SITE_JOBS, 3 if key != "bytes" else 0)
    print(
        json.dumps(
            {
                "bench": "squeue_real",
                "slurm": subprocess.run(
                    ["squeue", "--version"], env=env, capture_output=True, text=True
                ).stdout.strip()[:40],
                "cpus": os.cpu_count(),
                "load_avg": [round(x, 2) for x in os.getloadavg()[:2]],
                "sizes": rows,
                "carried_to_site": carried,
            }
        )
    )


if __name__ == "__main__":
    main()
