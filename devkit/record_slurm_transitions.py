"""Record real Slurm's listing line and `squeue --json` of jobs taken through every state change.

Why: plugins.slurm.incremental applies a job's state change from its listing line instead of
reading its JSON again; that is right only if the listing and the JSON of the same instant say
the same thing. This drives the development cluster (deploy/devcluster, Slurm 22.05 here)
through pending → running → suspended → running → requeued held → released → running → ended
(and a pending job held and released) and writes, for each step, the listing vjob runs
(`SLURM_TIME_FORMAT=%s squeue -h -t all -o ...`) and `squeue --json`, both as Slurm printed
them. A step is kept only when the listing read before and after the JSON agree (one instant).

Run as root, under the dev cluster's lock:
    flock /tmp/vjob-devcluster.lock .venv/bin/python -m devkit.record_slurm_transitions OUT_DIR
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devkit.devcluster import DevCluster, Settings
from plugins.slurm.incremental import LISTING_ARGS, LISTING_ENV


class Recorder:
    """The cluster's clients, and the steps written so far."""

    def __init__(self, cluster: DevCluster, out: Path) -> None:
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **cluster.env}
        self.out = out
        self.steps = 0

    def run(self, *argv: str, extra: dict[str, str] | None = None) -> str:
        done = subprocess.run(argv, env={**self.env, **(extra or {})}, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def listing(self) -> str:
        return self.run("squeue", *LISTING_ARGS, extra=dict(LISTING_ENV))

    def sbatch(self, *args: str) -> str:
        return self.run("sbatch", "--parsable", "-o", "/dev/null", *args).strip().split(";")[0]

    def words(self, ids: list[str]) -> dict[str, str]:
        """Job id → its state word now (from the listing)."""
        out = {}
        for line in self.listing().splitlines():
            fields = line.split("|")
            if fields[0].strip() in ids:
                out[fields[0].strip()] = fields[1].strip()
        return out

    def wait(self, ids: list[str], ok: Callable[[dict[str, str]], bool], what: str, limit_s: float = 60) -> None:
        end = time.monotonic() + limit_s
        while not ok(words := self.words(ids)):
            if time.monotonic() > end:
                raise RuntimeError(f"waiting for {what}: states {words}")
            time.sleep(0.2)

    def record(self, name: str, ids: list[str]) -> None:
        """The listing and squeue --json of one instant (the listing read on both sides)."""
        for _ in range(20):
            before = self.listing()
            doc = self.run("squeue", "--json")
            after = self.listing()
            if _heads(before, ids) == _heads(after, ids):
                self.steps += 1
                stem = f"{self.steps:02d}-{name}"
                (self.out / f"{stem}.listing.txt").write_text(before)
                (self.out / f"{stem}.squeue.json").write_text(doc)
                print(stem, _heads(before, ids), file=sys.stderr)
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name}: the listing kept moving")


def _heads(listing: str, ids: list[str]) -> list[str]:
    """The subject jobs' lines without the priority (it moves by itself)."""
    return sorted(line.rpartition("|")[0] for line in listing.splitlines() if line.split("|")[0].strip() in ids)


def record(cluster: DevCluster, out: Path) -> None:
    r = Recorder(cluster, out)
    blocker = r.sbatch("-N8", "--exclusive", "-t", "5", "--wrap", "sleep 600")
    r.wait([blocker], lambda w: w.get(blocker) == "RUNNING", "the blocker to run")
    one = r.sbatch("-N1", "-n2", "--mem=100M", "-t", "10", "--wrap", "sleep 900")
    two = r.sbatch("-N2", "--ntasks-per-node=1", "--mem-per-cpu=50M", "-t", "20", "--wrap", "sleep 900")
    later = r.sbatch("-N1", "-n1", "--begin=now+1hour", "-t", "30", "--wrap", "sleep 60")
    subjects = [one, two, later]
    time.sleep(1)
    r.record("pending", subjects)
    r.run("scontrol", "hold", later)
    r.record("held", subjects)
    r.run("scontrol", "release", later)
    r.record("released", subjects)
    r.run("scancel", blocker)
    r.wait([one, two], lambda w: w.get(one) == w.get(two) == "RUNNING", "the jobs to run")
    r.record("running", subjects)
    r.run("scontrol", "suspend", f"{one},{two}")
    r.wait([one, two], lambda w: w.get(one) == w.get(two) == "SUSPENDED", "suspended")
    r.record("suspended", subjects)
    r.run("scontrol", "resume", f"{one},{two}")
    r.wait([one, two], lambda w: w.get(one) == w.get(two) == "RUNNING", "resumed")
    r.record("resumed", subjects)
    r.run("scontrol", "requeuehold", f"{one},{two}")
    r.record("requeue-hold-asked", subjects)  # whatever Slurm shows at once (completing, requeued)
    r.wait([one, two], lambda w: all(w.get(j) not in ("RUNNING", "COMPLETING") for j in (one, two)), "requeued")
    r.record("requeued-held", subjects)
    r.run("scontrol", "release", f"{one},{two}")
    r.record("requeued-released", subjects)
    try:
        r.wait([one, two], lambda w: w.get(one) == w.get(two) == "RUNNING", "running again", limit_s=10)
    except RuntimeError:  # a requeued job waits for its begin time: started now, as vjob's start_now
        r.run("scontrol", "update", f"JobId={one},{two}", "StartTime=now")
        r.wait([one, two], lambda w: w.get(one) == w.get(two) == "RUNNING", "running again")
    r.record("running-again", subjects)
    r.run("scancel", one, two, later)
    r.record("cancel-asked", subjects)
    r.wait(subjects, lambda w: all(w.get(j) in (None, "CANCELLED") for j in subjects), "ended")
    r.record("ended", subjects)


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster()
    started = not cluster.is_up()
    try:
        if started:
            cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
        record(cluster, out)
    finally:
        if started:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
