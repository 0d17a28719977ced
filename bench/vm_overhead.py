"""A real job's VM overhead: QEMU's resident memory beyond guest RAM, at two guest sizes.

    .venv/bin/python bench/vm_overhead.py [--sizes 512,1024] [--cpus 2]

Prints one JSON line. For each size, `vjob run --os debian12 --memory M --cpus N` (root's
libvirt, the domain type as `auto` decides: TCG here) runs a job that fills most of its memory
with non-zero bytes (a real job's data: QEMU cannot leave those pages untouched) and waits; the
bench then reads the QEMU process's /proc/PID/smaps several times and keeps the peak of

- `rss_mib`: the process's whole resident memory;
- `guest_ram_rss_mib`: the resident part of the guest-RAM mapping (the one anonymous mapping
  of exactly M MiB);
- `overhead_mib` = rss − guest-RAM resident: what QEMU holds beyond the guest's RAM (its code,
  heap, the TCG translation cache, device and I/O buffers). This is what `[provisioning]
  vm_overhead_mib` must cover, since the guest's RAM can become wholly resident;
- `rss_minus_ram_mib` = rss − M, the brief's first-order figure (below the overhead while some
  guest RAM was never touched).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit import libvirtd
from provisioning import image_build, kvm_probe
from provisioning.images import Catalogue
from vjob.config import ProvisioningConfig
from vjob.store.db import Store

FILL_JOB = """#!/bin/sh
echo "nproc $(nproc) $(grep MemTotal /proc/meminfo)"
python3 - "$1" <<'PY'
import sys, time
n = int(sys.argv[1]) * 2**20
data = bytearray(b"\\x5a") * n  # every page written: resident in QEMU
print("filled", n >> 20, "MiB", flush=True)
time.sleep(30)
print("done", len(data), flush=True)
PY
"""
"""Fills `$1` MiB, says so, holds it 30 s (while the bench reads smaps), then ends."""


def _qemu_pid(vm: str) -> int | None:
    res = subprocess.run(["pgrep", "-f", f"guest={vm},"], capture_output=True, text=True, check=False)
    pids = [int(p) for p in res.stdout.split()]
    return pids[0] if pids else None


def smaps(pid: int, ram_mib: int) -> tuple[int, int]:
    """(total Rss, Rss of the guest-RAM mapping) in KiB, from /proc/PID/smaps."""
    total = ram = 0
    size = rss = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Size":
            size = int(rest.split()[0])
        elif key == "Rss":
            rss = int(rest.split()[0])
            total += rss
            if size == ram_mib * 1024:
                ram = max(ram, rss)
    return total, ram


def measure(base: Path, memory: int, cpus: int) -> dict[str, object]:
    """One guest of `memory` MiB and `cpus` vCPUs: its peak overhead while its job holds its data."""
    work = base / f"work-{memory}"
    work.mkdir()
    (work / "job.sh").write_text(FILL_JOB)
    out = work / "out"
    job = f"bench-oh-{memory}"
    fill = max(64, memory - 200)
    t0 = time.monotonic()
    pilot = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vjob.cli",
            "--config",
            str(base / "vjob.toml"),
            "run",
            "--job-id",
            job,
            "--node",
            "n1",
            "--os",
            "debian12",
            "--memory",
            str(memory),
            "--cpus",
            str(cpus),
            "--script",
            "job.sh",
            "--",
            str(fill),
        ],
        cwd=work,
        stdout=out.open("wb"),
        stderr=(work / "err").open("wb"),
    )
    peak = (0, 0)
    guest = ""
    try:
        while pilot.poll() is None and time.monotonic() - t0 < 900:
            text = out.read_bytes() if out.exists() else b""
            if b"filled" in text and b"done" not in text:
                pid = _qemu_pid(f"vjob-slurm-{job}")
                if pid is not None:
                    total, ram = smaps(pid, memory)
                    if total - ram > peak[0] - peak[1]:
                        peak = (total, ram)
            guest = next((ln for ln in text.decode(errors="replace").splitlines() if ln.startswith("nproc")), guest)
            time.sleep(1.0)
    finally:
        if pilot.poll() is None:
            pilot.kill()
        pilot.wait(timeout=120)
    if pilot.returncode and not peak[0]:
        print((work / "err").read_text()[-2000:], file=sys.stderr)
    return {
        "memory_mib": memory,
        "vcpus": cpus,
        "filled_mib": fill,
        "guest": guest,
        "rss_mib": round(peak[0] / 1024, 1),
        "guest_ram_rss_mib": round(peak[1] / 1024, 1),
        "overhead_mib": round((peak[0] - peak[1]) / 1024, 1),
        "rss_minus_ram_mib": round(peak[0] / 1024 - memory, 1),
        "exit": pilot.returncode,
        "run_s": round(time.monotonic() - t0, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,1024", help="guest sizes in MiB, comma-separated (default 512,1024)")
    parser.add_argument("--cpus", type=int, default=2, help="vCPUs of each guest (default 2)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vjob-bench-overhead-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
        store.upgrade()
        image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
        store.close()
        (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n')
        daemons = libvirtd.start_system(base / "libvirtd")  # root's libvirtd, started here when not running
        try:
            runs = [measure(base, int(m), args.cpus) for m in args.sizes.split(",")]
        finally:
            if daemons.owned:
                libvirtd.stop(daemons)
        worst = max(float(str(r["overhead_mib"])) for r in runs)
        line = {
            "bench": "vm_overhead",
            "image": "debian12",
            "domain_type": kvm_probe.cached("qemu64") or "qemu",
            "runs": runs,
            "overhead_mib_max": worst,
            "suggested_vm_overhead_mib": -(-int(worst + 1) // 32) * 32,
        }
        print(json.dumps(line))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
