"""Slurm adapter costs on the development cluster: bring-up time and one observation, JSON vs text.

Brings the dev cluster up when it is not running (and down again at the end, only then),
fills the queue with held jobs, then times `adapter.jobs()` through `squeue --json` and through
`scontrol show job -o`, in the same run, and prints their ratio.
Usage: .venv/bin/python bench/slurm_adapter.py [--jobs 200] [--repeat 5]
Last line: {"bench": "slurm_adapter", "up_s": ..., "jobs": N, "json_s": ..., "text_s": ..., "text_over_json": ...}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rich.console import Console
from rich.progress import track
from rich.table import Table

from devkit.devcluster import DevCluster, Settings
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    console = Console(stderr=True)
    cluster = DevCluster()
    started = not cluster.is_up()
    t0 = time.monotonic()
    if started:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
    up_s = time.monotonic() - t0
    json_adapter = SlurmAdapter(SlurmCommands(conf=str(cluster.conf)), use_json=True)
    text_adapter = SlurmAdapter(SlurmCommands(conf=str(cluster.conf)), use_json=False)
    ids = []
    try:
        for _ in track(range(args.jobs), description="submitting held jobs", console=console):
            ids.append(json_adapter.submit(["--hold", "--job-name=bench", "--output=/dev/null"], "#!/bin/sh\ntrue\n"))
        timings: dict[str, list[float]] = {"json": [], "text": []}
        for _ in range(args.repeat):
            for name, adapter in (("json", json_adapter), ("text", text_adapter)):
                t = time.monotonic()
                seen = adapter.jobs()
                timings[name].append(time.monotonic() - t)
                assert len([j for j in seen if j.id in set(ids)]) == len(ids)
    finally:
        if ids:
            json_adapter.cmd.run("scancel", ids)
        if started:
            cluster.down()
    json_s, text_s = statistics.median(timings["json"]), statistics.median(timings["text"])
    table = Table(title=f"one observation of {args.jobs} jobs (median of {args.repeat})")
    table.add_column("path")
    table.add_column("seconds", justify="right")
    table.add_row("dev cluster up" + ("" if started else " (already up)"), f"{up_s:.3f}")
    table.add_row("squeue --json", f"{json_s:.3f}")
    table.add_row("scontrol show job -o", f"{text_s:.3f}")
    Console().print(table)
    print(
        json.dumps(
            {
                "bench": "slurm_adapter",
                "up_s": round(up_s, 3),
                "jobs": args.jobs,
                "json_s": round(json_s, 4),
                "text_s": round(text_s, 4),
                "text_over_json": round(text_s / json_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
