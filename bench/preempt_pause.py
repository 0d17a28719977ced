"""Interactive start behind a victim that holds memory: pause-first against save-first
(issue 37 item 2, docs/preempt-pause.md).

On a one-node Slurm cluster of its own (4 CPUs, 12 GiB, its own port and run directory; the
dev cluster's lock held), an ordinary user's batch vjob (debian12, qemu:///session) fills
80 % of a 1, 2 and 4 GiB guest with distinct pages; an interactive `srun` of the same user then
needs the node's CPUs, and the vjob agent preempts the victim, save-first then pause-first,
both modes measured for each size in the same run. Prints one JSON line: per mode and size the
interactive start (from launching srun to its command running), the save's time and size,
whether the interactive job ran before the save ended, the measured s/GiB and the start
extrapolated to a 64 GiB victim.

    flock /tmp/vjob-devcluster.lock .venv/bin/python bench/preempt_pause.py [--sizes 1024,2048,4096]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit.devcluster import DevCluster, Settings
from devkit.preempt_pause import PauseRun, clean_user_vms
from tests.services import user_pilot

USER = "vjrun"
PORT = 6907
"""A controller port of its own: the shared dev cluster (6817) is not touched."""


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs, the save rate they measured (s per GiB of state written) and both modes'
    interactive start extrapolated to a 64 GiB victim: save-first waits for a state of 64 GiB
    times the state/guest ratio measured at the largest size, at the measured rate, plus what
    its runs spent besides the save; pause-first's start does not grow with the size measured
    here (its largest start is quoted as is), where the node's memory held both jobs (a run
    whose interactive job had to wait for the save is not extrapolated)."""
    rates = [r["save_seconds"] / (r["save_bytes"] / 2**30) for r in runs if r["save_bytes"]]
    rate = sum(rates) / len(rates) if rates else None
    saves = [r for r in runs if r["mode"] == "save"]
    pauses = [r["interactive_start_s"] for r in runs if r["mode"] == "pause" and r["started_before_saved"]]
    out: dict[str, Any] = {"runs": runs, "save_s_per_gib": round(rate, 2) if rate else None}
    if rate and saves:
        big = max(saves, key=lambda r: r["guest_mib"])
        ratio = big["save_bytes"] / (big["guest_mib"] * 2**20)
        besides = min(r["interactive_start_s"] - r["save_seconds"] for r in saves)
        out["state_per_guest_gib"] = round(ratio, 3)
        out["save_first_start_64gib_s"] = round(64 * ratio * rate + besides, 1)
    if pauses:
        out["pause_first_start_max_s"] = max(pauses)
        out["pause_first_start_64gib_s"] = max(pauses)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024,2048,4096", help="guest sizes in MiB")
    ap.add_argument("--modes", default="save,pause")
    ap.add_argument(
        "--interactive-mem",
        type=int,
        default=512,
        help="MiB the interactive job asks (node: 12288): above 12288 minus the victim's, it must wait for the save",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    top = Path(tempfile.mkdtemp(prefix="vjob-ppbench-", dir="/var/tmp"))
    top.chmod(0o755)
    cluster = DevCluster(top / "cluster")
    site = top / "site"
    site.mkdir(mode=0o755)
    work = top / "work"
    work.mkdir(mode=0o755)
    results = []
    t_all = time.monotonic()
    try:
        cluster.up(
            Settings(run_dir=cluster.root, nodes=1, cpus=4, memory_mb=12288, agent="no", libvirt=False, port=PORT)
        )
        bindir = user_pilot.prepare(site)
        user_pilot.write_config(site)
        run = PauseRun(cluster, site, bindir, USER, work)
        run.images()
        for size in sizes:
            for mode in args.modes.split(","):
                run.start_agent(pause_first=mode == "pause")
                try:
                    out = run.preempt_once(mode, size, ticks=3600, mem_mib=args.interactive_mem)
                finally:
                    run.stop_agent()
                run.cancel(out.victim)
                print(f"{mode} {size} MiB: {out}", file=sys.stderr, flush=True)
                results.append(out.__dict__)
                time.sleep(3)
                clean_user_vms(USER)
    finally:
        try:
            cluster.down()
        finally:
            clean_user_vms(USER)
            shutil.rmtree(top, ignore_errors=True)
    line = {"bench": "preempt_pause", "load_avg": [round(x, 2) for x in os.getloadavg()], **summarize(results)}
    line["wall_s"] = round(time.monotonic() - t_all, 1)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
