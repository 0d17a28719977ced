"""An MPI ring in a multi-node vjob (two VMs unless `--vms`), checkpointed mid-run and resumed (issue 16; the bench of
tests/test_multinode_slurm.py's ring, without Slurm).

    .venv/bin/python bench/multinode_mpi.py [--rounds 40] [--checkpoint-at 8] [--memory 512] [--vms 2]

Root only (root's libvirt, `vjob image build`). The default image `debian12` has Debian's
`openmpi-bin` and `python3-mpi4py` (provisioning.image_build.BASE_PACKAGES; taken from the build
cache when there). A 2-VM vjob (`vjob run --nodes node1,node2`: both
"nodes" on this machine's libvirt, as on the dev cluster) runs
`mpirun --hostfile "$VJOB_NODEFILE" -np 2 python3 ring.py ROUNDS`: each round rank 0 sends a
counter to rank 1, which adds one and sends it back, adding one too (`ring.py ROUNDS STAGES WORK
IDLE`, as bench/planner_live.py's `--program mpi-ring` runs it: round r first computes WORK steps
of arithmetic on every rank when STAGES[r] is `C`, or sleeps IDLE seconds on every rank when it
is `I`). Every rank also appends each round to a file in its VM's /tmp (a tmpfs) and rank 0
prints, at the start and the end, every rank's boot id and, at the end, what its file holds: the
same boot id and every round show a VM restored, never rebooted. After `--checkpoint-at`
rounds the bench asks the pilot for a checkpoint as the agent does (both VMs paused, then
saved: one cut), ends the pilot as a requeue would (SIGTERM), starts the job's pilot again (both
VMs restored paused, then run together) and waits for the end: the final counter must be
2 × ROUNDS, the value of an uninterrupted run, and every round must be printed once.

Prints one JSON line: the image's size and build time (cached or not), the job's time to its
first round (boot of both VMs under TCG + mpirun's ssh launch), the cut (pause → all saved) and
restore (start → all running) times, and whether the result matched and every VM kept its memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from provisioning import image_build, kvm_probe, network
from provisioning.driver import Driver
from provisioning.images import Catalogue
from vjob.config import ProvisioningConfig
from vjob.store.db import Store

IMAGE = "debian12"
PACKAGES = ""
"""Open MPI and mpi4py are in the default image (bench/planner_live.py builds IMAGE with these)."""
RING = """\
import sys
import time

from mpi4py import MPI


def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
rounds = int(sys.argv[1])
stages = sys.argv[2] if len(sys.argv) > 2 else ""
work = int(sys.argv[3]) if len(sys.argv) > 3 else 0
idle = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
steps = f"/tmp/vjob-ring.{rank}"
open(steps, "w").close()
boots = comm.gather(boot_id(), root=0)
if rank == 0:
    for i, b in enumerate(boots):
        print(f"boot rank {i} {b}", flush=True)
counter = 0
for r in range(rounds):
    stage = stages[r % len(stages)] if stages else ""
    t0 = time.time()
    if stage == "C":
        s = 0
        for i in range(work):
            s = (s + i * 31 + 7) % 1000003
    elif stage == "I":
        time.sleep(idle)
    if rank == 0:
        comm.send(counter + 1, dest=1)
        counter = comm.recv(source=size - 1)
        print(f"round {r + 1} counter {counter}", flush=True)
        if stages:
            print(f"stage {stage} {time.time() - t0:.1f} s", flush=True)
        else:
            time.sleep(1)
    else:
        counter = comm.recv(source=rank - 1) + 1
        comm.send(counter, dest=(rank + 1) % size)
    with open(steps, "a") as f:
        f.write(f"{r + 1}\\n")
with open(steps) as f:
    mine = f.read().split()
ends = comm.gather((boot_id(), mine), root=0)
if rank == 0:
    for i, (b, got) in enumerate(ends):
        print(f"rank {i} boot {b} steps {' '.join(got)}", flush=True)
    print(f"final {counter}", flush=True)
"""
JOB = """#!/bin/bash
set -e
mpirun --allow-run-as-root --hostfile "$VJOB_NODEFILE" -np "$(wc -l < "$VJOB_NODEFILE")" python3 ring.py "$@"
"""


def _nodes(vms: int) -> str:
    return ",".join(f"node{i}" for i in range(1, vms + 1))


def _pilot(
    base: Path, work: Path, job_id: str, memory: int, out: Path, rounds: int, vms: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vjob.cli",
            "--config",
            str(base / "vjob.toml"),
            "run",
            "--job-id",
            job_id,
            "--node",
            "node1",
            "--nodes",
            _nodes(vms),
            "--os",
            IMAGE,
            "--memory",
            str(memory),
            "--script",
            "job.sh",
            "--",
            str(rounds),
        ],
        cwd=work,
        stdout=out.open("wb"),
        stderr=out.with_suffix(".err").open("wb"),
    )


def _wait_for(path: Path, pattern: bytes, timeout_s: float, pilot: subprocess.Popen[bytes]) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if path.exists() and re.search(pattern, path.read_bytes(), re.M):
            return time.monotonic() - t0
        if pilot.poll() is not None:
            raise SystemExit(f"bench: the pilot ended ({pilot.returncode}) before {pattern!r}; see {path}")
        time.sleep(0.5)
    raise SystemExit(f"bench: {pattern!r} not in {path} after {timeout_s:.0f} s")


def _events(err: Path, name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.read_text(errors="replace").splitlines() if f'"{name}"' in line]


def forget_job(driver: Driver, job_id: str, nodes: Sequence[str], vms: int) -> None:
    """A multi-node job's VMs (looked for on every node) and its bridge, whatever state a run
    left them in (also bench/planner_live.py's clean-up)."""
    for node in nodes:
        for rank in range(vms):
            driver.delete(f"vjob-slurm-{job_id}-{rank}", node)
    network.remove_bridge(driver.connection(nodes[0]), network.pilot_subnet_id("slurm", job_id))


def ring_outcome(text: str, rounds: int, ranks: int = 2) -> dict[str, object]:
    """What rank 0 printed: the final counter against an uninterrupted ring's (ranks × rounds),
    and whether every round was printed once, in order, with its right value."""
    counters = [int(m.group(1)) for m in re.finditer(r"^round \d+ counter (\d+)$", text, re.M)]
    final = re.search(r"^final (\d+)$", text, re.M)
    value = int(final.group(1)) if final else None
    ok = value == ranks * rounds and counters == [ranks * i for i in range(1, rounds + 1)]
    return {"final": value, "expected": ranks * rounds, "ok": ok}


def ring_memory(text: str, rounds: int, ranks: int = 2) -> dict[str, object]:
    """Whether every rank's VM kept its memory: the boot id each rank had at the start (printed
    before any checkpoint) is the one it has at the end, and its tmpfs file holds every round
    once, in order (a rebooted VM would have an empty /tmp and a new boot id)."""
    start = dict(re.findall(r"^boot rank (\d+) (\S+)$", text, re.M))
    end = {r: (b, steps.split()) for r, b, steps in re.findall(r"^rank (\d+) boot (\S+) steps ?(.*)$", text, re.M)}
    want = [str(i) for i in range(1, rounds + 1)]
    kept = len(start) == len(end) == ranks and all(
        r in start and end.get(r) == (start[r], want) for r in map(str, range(ranks))
    )
    return {"boot_ids": start, "memory_kept": kept}


def _forget(base: Path, job_id: str, vms: int) -> None:
    from vjob.config import load

    cfg = load(str(base / "vjob.toml"))
    with Driver(cfg.provisioning, data_dir=cfg.data_path) as driver:
        forget_job(driver, job_id, ["node1"], vms)


def ring(base: Path, rounds: int, at: int, memory: int, vms: int = 2) -> dict[str, object]:
    from vjob.pilot_files import PilotDir, PilotState

    work = base / "work"
    work.mkdir()
    (work / "job.sh").write_text(JOB)
    (work / "ring.py").write_text(RING)
    job_id = f"9{os.getpid()}"  # fresh: no state of an older job under this id
    pdir = PilotDir(base / "data" / "pilots", "slurm", job_id)
    first, second = base / "run1.out", base / "run2.out"
    t0 = time.monotonic()
    pilot = _pilot(base, work, job_id, memory, first, rounds, vms)
    again: subprocess.Popen[bytes] | None = None
    try:
        first_round_s = _wait_for(first, rb"^round 1 ", 1800, pilot)
        _wait_for(first, rb"^round %d " % at, 600, pilot)
        pdir.request_checkpoint("bench-mpi", "bench")
        deadline = time.monotonic() + 600
        while (st := pdir.read_state()) is None or st.state is not PilotState.SAVED:
            if time.monotonic() > deadline or pilot.poll() is not None:
                raise SystemExit(f"bench: no checkpoint; see {first.with_suffix('.err')}")
            time.sleep(0.2)
        pilot.send_signal(signal.SIGTERM)  # the requeue
        pilot.wait(timeout=120)
        again = _pilot(base, work, job_id, memory, second, rounds, vms)
        code = again.wait(timeout=1800)
        total_s = time.monotonic() - t0
    finally:
        for p in (pilot, again):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=120)
        _forget(base, job_id, vms)
    text = second.read_text(errors="replace")
    outcome = ring_outcome(text, rounds, vms)
    cuts = _events(first.with_suffix(".err"), "coordinated checkpoint")
    restored = _events(second.with_suffix(".err"), "multi-node job restored")
    return {
        "rounds": rounds,
        "checkpoint_at_round": at,
        "exit": code,
        **outcome,
        "memory_kept": ring_memory(text, rounds, vms)["memory_kept"],
        "first_round_s": round(first_round_s, 1),
        "cut_consistent": bool(cuts) and all(c.get("consistent") for c in cuts),
        "pause_to_saved_s": cuts[0].get("pause_to_saved_s") if cuts else None,
        "restore_to_running_s": restored[0].get("restore_to_running_s") if restored else None,
        "total_s": round(total_s, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="ring rounds (default 40, one a second)")
    parser.add_argument("--checkpoint-at", type=int, default=8, help="checkpoint after this round (default 8)")
    parser.add_argument("--memory", type=int, default=512, help="MiB per VM (default 512)")
    parser.add_argument("--vms", type=int, default=2, help="VMs (ranks) of the job, one per node (default 2)")
    args = parser.parse_args()
    if not 2 <= args.vms <= 8:
        raise SystemExit(f"bench: --vms {args.vms}: must be between 2 and 8")
    if not 1 <= args.checkpoint_at < args.rounds:
        raise SystemExit("bench: --checkpoint-at must be at least 1 and below --rounds")
    base = Path(tempfile.mkdtemp(prefix="vjob-bench-mpi-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
        store.upgrade()
        catalogue = Catalogue(store, ProvisioningConfig(), data_dir=base / "data")
        built = image_build.build(catalogue, IMAGE, packages=PACKAGES)
        store.close()
        (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n')
        line: dict[str, object] = {
            "bench": "multinode_mpi",
            "vms": args.vms,
            "domain_type": kvm_probe.cached("qemu64") or "qemu",
            "image": IMAGE,
            "image_mb": round(built.size_bytes / 2**20, 1),
            "build_s": round(built.build_s, 1),
            "build_cached": built.cached,
        }
        line.update(ring(base, args.rounds, args.checkpoint_at, args.memory, args.vms))
        print(json.dumps(line))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
