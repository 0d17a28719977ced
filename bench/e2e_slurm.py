"""Interactive start latency on a full Slurm cluster: with vjob vs Slurm alone.

The same scenario twice on the development cluster (devkit.demo_scenario): batch vjobs whose guests
count to BATCH_SECONDS and then end fill the 8 nodes, then an interactive `srun -N4` arrives.
With the vjob agent, the lowest-priority vjobs are checkpointed and the interactive job starts;
with Slurm alone (no agent, Slurm's own preemption off as in the dev cluster) it waits until
batch jobs end. The ratio therefore grows with the batch jobs' remaining run time, which here
is short (BATCH_SECONDS) so that the benchmark stays quick: on a real cluster, where batch jobs
run for hours, Slurm alone waits hours.

Brings the development cluster up if it is not running (and takes it down again). Last line:
{"bench": "e2e_slurm", "with_vjob_s": ..., "slurm_alone_s": ..., "ratio": ...}
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from devkit.demo_scenario import Scenario
from devkit.devcluster import DevCluster, Settings
from vjob import log


def one_run(cluster: DevCluster, work: Path, *, agent: bool, batch_seconds: int, console: Console) -> dict:
    sc = Scenario(cluster, work, agent=agent, batch_seconds=batch_seconds, say=lambda m: console.log(m))
    try:
        sc.prepare()
        if agent:
            sc.start_agent()
        sc.submit_batch()
        with console.status("booting the batch vjobs' guests"):
            sc.wait_guests_counting(at_least=5)
        with console.status(f"interactive srun ({'with vjob' if agent else 'Slurm alone'})"):
            started = sc.run_interactive(timeout_s=batch_seconds + 300)
        victims = sc.victims()
        resumed = sc.wait_resumed(victims) if agent else []
        return {"interactive_start_s": started, "victims": len(victims), "resumed": len(resumed)}
    finally:
        sc.cleanup()


def _plot(with_vjob_s: float, alone_s: float, batch_seconds: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(__file__).resolve().parents[1] / "out" / "e2e_slurm.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3))
    bars = ax.barh(["with vjob", "Slurm alone"], [with_vjob_s, alone_s], color=["tab:green", "tab:gray"])
    ax.bar_label(bars, fmt="%.1f s", padding=3)
    ax.set_xlabel("interactive job start latency (s)")
    ax.set_title(f"srun -N4 on a full 8-node cluster (batch guests run {batch_seconds} s)", fontsize=9)
    ax.set_xlim(0, alone_s * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-seconds", type=int, default=90, help="how long each batch guest counts (default 90)")
    args = p.parse_args(argv)
    console = Console(stderr=True)
    log.configure("warning", "console", sys.stderr)
    cluster = DevCluster()
    started_here = not cluster.is_up()
    if started_here:
        with console.status("bringing up the development cluster"):
            cluster.up(Settings(run_dir=cluster.root, agent="no"))
    work = Path(tempfile.mkdtemp(prefix="vjob-bench-e2e-", dir="/var/tmp"))
    work.chmod(0o711)  # QEMU (libvirt-qemu) must traverse to the VM disks
    try:
        with_vjob = one_run(cluster, work / "vjob", agent=True, batch_seconds=args.batch_seconds, console=console)
        alone = one_run(cluster, work / "alone", agent=False, batch_seconds=args.batch_seconds, console=console)
    finally:
        if started_here:
            cluster.down()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'run':<14}{'interactive start (s)':>24}{'victims':>10}{'resumed':>10}")
    for name, r in (("with vjob", with_vjob), ("Slurm alone", alone)):
        print(f"{name:<14}{r['interactive_start_s']:>24.2f}{r['victims']:>10}{r['resumed']:>10}")
    print(f"batch guests count for {args.batch_seconds} s; the interactive job arrives once all count >= 5")
    ratio = alone["interactive_start_s"] / with_vjob["interactive_start_s"]
    plot = _plot(with_vjob["interactive_start_s"], alone["interactive_start_s"], args.batch_seconds)
    print(f"plot: {plot}")
    print(
        json.dumps(
            {
                "bench": "e2e_slurm",
                "with_vjob_s": round(with_vjob["interactive_start_s"], 2),
                "slurm_alone_s": round(alone["interactive_start_s"], 2),
                "ratio": round(ratio, 2),
                "batch_seconds": args.batch_seconds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
