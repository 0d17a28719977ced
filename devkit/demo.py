"""`deploy/demo`: the README's main command, vjob on Slurm end to end, and its report.

Why this module only runs and reports: the scenario (devkit.demo_scenario), the jobs it
submits (devkit.demo_jobs) and the claims its figures are held to (devkit.demo_outcome) are
shared with the benchmark (`bench/e2e_slurm.py`) and the tests, so that the figures the README
quotes are the ones the tests check. Here: bring the development cluster up if needed, run the
scenario once with the real image by default, print the timeline and what each victim did, and
end with one JSON line; the exit status is 0 only when every claim holds (issue 32).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from devkit.demo_jobs import REAL_IMAGE, TINY_IMAGE
from devkit.demo_outcome import Outcome
from devkit.demo_scenario import Scenario
from devkit.devcluster import DevCluster, Settings
from vjob import log

if TYPE_CHECKING:
    from rich.console import Console

REPO = Path(__file__).resolve().parents[1]


def run_demo(work: Path, *, keep_cluster: bool = False, plot: Path | None = None, image: str = REAL_IMAGE) -> Outcome:
    """The README's main command: cluster up, scenario, timeline, cluster down (if we started it)."""
    from rich.console import Console

    t_start = time.monotonic()
    console = Console(stderr=True)
    log.configure("warning", "console", sys.stderr)
    cluster = DevCluster()
    started_here = not cluster.is_up()
    if started_here:
        with console.status("bringing up the development cluster (munge, slurmctld, 8 slurmd, libvirtd)"):
            cluster.up(Settings(run_dir=cluster.root, agent="no"), progress=lambda m: console.log(m))
    sc = Scenario(cluster, work, image=image, say=lambda m: console.log(m))
    try:
        out, problems = _run_scenario(sc, console)
    finally:
        try:
            sc.cleanup()
            if started_here and not keep_cluster:
                with console.status("taking the development cluster down"):
                    cluster.down()
        except Exception as exc:  # noqa: BLE001 - the run's own outcome or error matters more
            console.log(f"clean-up incomplete: {exc}")
    _print_report(out, problems)
    out.elapsed_s = time.monotonic() - t_start
    if plot is not None:
        plot_timeline(out, plot)
        print(f"  timeline plot: {plot}")
    return out


def _run_scenario(sc: Scenario, console: Console) -> tuple[Outcome, dict[str, str]]:
    """The scenario's steps, each under a status line; its outcome and each real job's output check."""
    problems: dict[str, str] = {}
    sc.prepare()
    sc.start_agent()
    sc.submit_batch()
    with console.status(f"booting the batch vjobs' guests ({sc.image}; QEMU)"):
        sc.wait_guests_counting()
    with console.status(f"interactive job: srun -N{sc.interactive_nodes} on a full cluster"):
        started = sc.run_interactive()
    victims = sc.victims()
    with console.status(f"waiting for the victims {', '.join(victims)} to resume"):
        resumed = sc.wait_resumed(victims)
        time.sleep(3)
    if sc.real:
        with console.status("the batch jobs run to their end"):
            sc.wait_finished()
        problems = sc.check_outputs()
    out = sc.outcome(started, victims, resumed)
    if sc.real:
        out.outputs_identical = bool(problems) and not any(problems.values())
    return out, problems


def _print_report(out: Outcome, problems: dict[str, str]) -> None:
    """The timeline, each victim's progress around its checkpoint, each job's check, the no-preemption wait."""
    print("timeline (seconds from the interactive job's submission):")
    for line in out.timeline.lines():
        print(f"  {line}")
    for v in out.victims:
        before, after = out.counters.get(v, (0, 0))
        what = "progress step" if out.image != TINY_IMAGE else "guest counter"
        print(
            f"  job {v}: {what} {before} before its checkpoint, {after} after its resume; "
            f"checkpoint {out.checkpoint_seconds.get(v, 0):.2f} s; Pn = {out.preempt_counts.get(v, 0)}"
        )
    print(f"  {out.local_resumes} of {len(out.resumed)} resumes were local (on the node of their checkpoint)")
    for job, problem in problems.items():
        print(f"  job {job}: {problem or 'result.txt identical to an uninterrupted run, every progress line once'}")
    if out.no_preemption_wait_s is not None:
        print(
            f"  without preemption the interactive job would have waited {out.no_preemption_wait_s:.1f} s "
            f"(this run's batch jobs' remaining run time); it started after {out.interactive_start_s:.2f} s, "
            f"{out.interactive_start_s / max(out.no_preemption_wait_s, 1e-9):.3f} x that"
        )


def plot_timeline(out: Outcome, path: Path) -> None:
    """A PNG of the timeline: one row per event, seconds on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = sorted(out.timeline.events)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(events) + 1.2))
    for row, (t, text) in enumerate(events):
        ax.plot([t], [row], "o", color="tab:red" if "checkpoint" in text else "tab:blue")
        ax.annotate(text, (t, row), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("seconds since the interactive job was submitted")
    ax.set_title("vjob on Slurm: interactive job preempts batch vjobs by VM checkpoint")
    ax.set_xlim(min(t for t, _ in events) - 2, max(t for t, _ in events) * 1.6 + 5)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`deploy/demo`: one JSON line on stdout; exit 1 with one line on stderr when a claim fails."""
    import argparse
    import json
    import tempfile

    p = argparse.ArgumentParser(prog="deploy/demo", description="vjob on Slurm, end to end")
    p.add_argument("--work", type=Path, help="working directory (default: a new temporary one)")
    p.add_argument("--keep-cluster", action="store_true", help="leave a cluster this demo started running")
    p.add_argument("--plot", type=Path, default=REPO / "out" / "demo_timeline.png", help="timeline PNG to write")
    p.add_argument(
        "--image",
        default=REAL_IMAGE,
        help=f"{REAL_IMAGE} (default): ordinary batch scripts in a real Debian guest, results checked; "
        f"{TINY_IMAGE}: the tiny counter guest (faster boot)",
    )
    p.add_argument("--debug", action="store_true", help="a failure prints its traceback too")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="vjob-demo-", dir="/var/tmp"))
    try:
        out = run_demo(work, keep_cluster=args.keep_cluster, plot=args.plot, image=args.image)
    except KeyboardInterrupt:
        print("deploy/demo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, as every vjob command (README: exit codes)
        if args.debug:
            raise
        print(f"deploy/demo: failed: {exc} (work directory {work})", file=sys.stderr)
        return 1
    print(json.dumps(out.json_line()))
    if problems := out.problems():
        print(f"deploy/demo: failed: {'; '.join(problems)} (work directory {work})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
