"""A few jobs' JSON on Slurm 22.05 (squeue --json ignores the filter): the pipe stream against the memfd's tail.

The agent's incremental observation fetches, each tick, the JSON of the jobs new since the last
one (~20 at a site's size). On 20.11-22.05 squeue prints every job whatever it is asked, so the
former fetch streamed the whole output through a pipe and scanned all of it
(plugins.slurm.json_stream); the new one lets squeue write into a memfd and searches from its
end (plugins.slurm.json_tail). Both are run here on the same stand-in squeue (devkit.slurm_standin,
the 22.05 recording's fullest job, 3.7 KB as Slurm prints it, laid out as Slurm lays it out),
each in its own process (its peak memory is its own), alternately, `--reps` times each: the
agent's CPU (user + system) for the fetch, the stand-in's CPU, wall, the bytes the agent read,
peak RSS. The jobs asked for: `--new` jobs appended since the base (slurmctld appends new jobs)
and, with `--moved`, that many jobs changed in place somewhere in the list.
Run it `nice -n 19`. Last line: one JSON object.
Usage: PYTHONPATH=. nice -n 19 .venv/bin/python bench/json_fetch.py [--jobs 120000] [--new 20] [--moved 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.slurm_standin import SlurmStandIn
from plugins.slurm import json_stream
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.json_fields import Reuse
from plugins.slurm.json_tail import Fetch

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixtures" / "slurm" / "debian-22.05-squeue.json"


def _text(item: dict[str, Any]) -> str:
    return "    " + json.dumps(item, indent=2).replace("\n", "\n    ")


def build(work: Path, args: argparse.Namespace) -> list[int]:
    """The stand-in over `--jobs` jobs and the ids to ask for (new ones last, moved ones in place)."""
    doc = json.loads(FIXTURE.read_text())
    template = max(doc["jobs"], key=lambda j: len(json.dumps(j)))
    standin = SlurmStandIn(work / "bin", version="22.05.8", meta=doc["meta"])
    base = args.jobs - args.new
    standin.write_base((str(i), _text(dict(template, job_id=i, name=f"job-{i}"))) for i in range(1, base + 1))
    moved = random.Random(37).sample(range(1, base + 1), args.moved)
    delta: dict[str, str | None] = {str(i): _text(dict(template, job_id=i, job_state="RUNNING")) for i in moved}
    delta.update({str(i): _text(dict(template, job_id=i)) for i in range(base + 1, args.jobs + 1)})
    standin.write_delta(delta)
    return [*moved, *range(base + 1, args.jobs + 1)]


def _cpu(who: int) -> float:
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


def run(method: str, work: Path, wanted: set[int]) -> dict[str, Any]:
    """One fetch, in this process: the agent's CPU, the stand-in's, wall, bytes read, jobs found."""
    cmd = SlurmCommands(bin_dir=str(work / "bin"), timeout_s=600)
    fetch = Fetch()
    own, kids, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    if method == "tail":
        found = fetch.jobs(cmd, ["--json"], wanted, source="squeue --json", reuse=Reuse())
        read = fetch.last_read
    else:
        chunks = json_stream.command_chunks(cmd, "squeue", ["--json"])
        counted = []
        found = json_stream.jobs((counted.append(len(c)) or c for c in chunks), source="squeue --json", keep=wanted)
        read = sum(counted)
    return {
        "cpu_s": round(_cpu(resource.RUSAGE_SELF) - own, 4),
        "standin_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - kids, 3),
        "wall_s": round(time.monotonic() - wall, 3),
        "read_mb": round(read / 1e6, 3),
        "found": len(found),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def child(method: str, work: Path, wanted: list[int]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", method, "--work", str(work), "--ids", ",".join(map(str, wanted))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120_000)
    parser.add_argument("--new", type=int, default=20, help="jobs appended since the base, asked for")
    parser.add_argument("--moved", type=int, default=0, help="jobs changed in place, asked for too")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.child, Path(args.work), {int(i) for i in args.ids.split(",") if i})))
        return
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="vjob-json-fetch-"))
    try:
        wanted = build(work, args)
        runs: dict[str, list[dict[str, Any]]] = {"stream": [], "tail": []}
        for _ in range(args.reps):
            for method in runs:
                runs[method].append(child(method, work, wanted))
                print(f"{method}: {json.dumps(runs[method][-1])}", file=sys.stderr)
        size = sum(f.stat().st_size for f in (work / "bin").glob("jobs.*"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    print(
        json.dumps(
            {
                "bench": "json_fetch",
                "jobs": args.jobs,
                "asked": len(wanted),
                "new": args.new,
                "moved": args.moved,
                "json_mb": round(size / 1e6),
                "stream": med["stream"],
                "tail": med["tail"],
                "tail_over_stream_cpu": round(med["tail"]["cpu_s"] / med["stream"]["cpu_s"], 4),
                "load_avg": [round(load, 2), round(os.getloadavg()[0], 2)],
            }
        )
    )


if __name__ == "__main__":
    main()
