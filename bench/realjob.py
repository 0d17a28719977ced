"""Real jobs: image build time and size, and `vjob run` → the script's first line in the guest;
with --checkpoint, the checkpoint and restore of a 1 GiB guest running a memory-heavy job.

    .venv/bin/python bench/realjob.py [--rebuild]
    .venv/bin/python bench/realjob.py --checkpoint [--memory 1024] [--fill 600]

Prints one JSON line. `--rebuild` builds the image without the cache (about a minute); by
default the cached build is reused and the build time reported is the cache's recorded one
(the catalogue copy is timed). The first-line figure is from starting `vjob run` (root's
libvirt, the domain type as `auto` decides: TCG here) to the first byte of the script's stdout.

--checkpoint: the job fills `--fill` MiB of its memory with non-zero bytes (QEMU skips zero
pages, a real job's data is not zero), then the pilot gets SIGTERM — the RMS's checkpoint
signal: it saves the VM and exits — and a second `vjob run` of the same job restores it; the job
checks its data and ends. The pilot's own figures (save_seconds, save_bytes, restore_seconds)
are compared with a plain copy of the same state file (`cp`, then `sync`) timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioning import image_build, kvm_probe
from provisioning.images import Catalogue
from vjob.config import ProvisioningConfig
from vjob.store.db import Store

CHECKPOINT_JOB = """#!/bin/sh
python3 - "$1" <<'PY'
import hashlib, sys, time
n = int(sys.argv[1]) * 2**20
block = hashlib.sha256(b"vjob").digest() * 32  # 1 KiB of non-zero bytes
data = bytearray(block) * (n // len(block))  # one allocation: the guest has 1 GiB
want = hashlib.sha256(data[::4096]).hexdigest()  # one byte per page: cheap under TCG
print("filled", n >> 20, "MiB", flush=True)
for i in range(600):
    time.sleep(0.5)
    if i % 10 == 0:
        print("alive", i, hashlib.sha256(data[::4096]).hexdigest() == want, flush=True)
PY
"""
"""Fills its memory, then waits; the bench reads "filled" and checkpoints it."""


def _vjob_run(base: Path, work: Path, job_id: str, memory: int, out: Path, *args: str) -> subprocess.Popen[bytes]:
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
            "n1",
            "--os",
            "debian12",
            "--memory",
            str(memory),
            "--script",
            "job.sh",
            "--",
            *args,
        ],
        cwd=work,
        stdout=out.open("ab"),
        stderr=(out.with_suffix(".err")).open("ab"),
    )


def _wait_for(path: Path, text: bytes, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if path.exists() and text in path.read_bytes():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise SystemExit(f"bench: {text!r} not in {path} after {timeout_s:.0f} s")


def _delete_vm(base: Path, vm: str) -> None:
    """The job never ends by itself: its VM (saved again by the last SIGTERM) is deleted here."""
    from provisioning.driver import Driver  # heavy: libvirt-python
    from vjob.config import load

    cfg = load(base / "vjob.toml")
    driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
    try:
        driver.delete(vm, "n1")
    finally:
        driver.close()


def checkpoint(base: Path, memory: int, fill: int) -> dict[str, object]:
    """Save on SIGTERM and restore a `memory` MiB guest whose job holds `fill` MiB of data."""
    from vjob.pilot_files import PilotDir

    work = base / "work"
    work.mkdir()
    (work / "job.sh").write_text(CHECKPOINT_JOB)
    out = base / "ck.out"
    t0 = time.monotonic()
    pilot = _vjob_run(base, work, "bench-ck", memory, out, str(fill))
    _wait_for(out, b"filled", 900)
    filled_s = time.monotonic() - t0
    pilot.send_signal(signal.SIGTERM)
    pilot.wait(timeout=600)
    st = PilotDir(base / "data" / "pilots", "slurm", "bench-ck").read_state()
    assert st is not None and st.memory_path, "the pilot did not save the VM"
    state = Path(st.memory_path)
    copy = base / "copy.state"
    c0 = time.monotonic()
    subprocess.run(["cp", str(state), str(copy)], check=True, timeout=900)
    subprocess.run(["sync", str(copy)], check=True, timeout=900)
    copy_s = time.monotonic() - c0
    copy.unlink()
    again = _vjob_run(base, work, "bench-ck", memory, out, str(fill))
    r0 = time.monotonic()
    while time.monotonic() - r0 < 600:
        now = PilotDir(base / "data" / "pilots", "slurm", "bench-ck").read_state()
        if now is not None and now.restores >= 1 and now.state.value == "running":
            break
        time.sleep(0.2)
    resumed = PilotDir(base / "data" / "pilots", "slurm", "bench-ck").read_state()
    again.send_signal(signal.SIGTERM)
    again.wait(timeout=600)
    _delete_vm(base, "vjob-slurm-bench-ck")
    assert resumed is not None
    return {
        "bench": "realjob_checkpoint",
        "image": "debian12",
        "domain_type": kvm_probe.cached("qemu64") or "qemu",
        "memory_mib": memory,
        "job_data_mib": fill,
        "boot_and_fill_s": round(filled_s, 1),
        "save_s": round(st.save_seconds, 2),
        "state_mib": round(st.save_bytes / 2**20, 1),
        "restore_s": round(resumed.restore_seconds, 2),
        "copy_s": round(copy_s, 2),
        "save_restore_over_copy": round((st.save_seconds + resumed.restore_seconds) / copy_s, 2) if copy_s else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rebuild", action="store_true", help="build without the cache")
    parser.add_argument("--checkpoint", action="store_true", help="the checkpoint/restore figure instead")
    parser.add_argument("--memory", type=int, default=1024, help="guest memory in MiB (default 1024)")
    parser.add_argument("--cpus", type=int, default=1, help="the first-line guest's vCPUs (default 1)")
    parser.add_argument("--fill", type=int, default=600, help="MiB the job fills (--checkpoint; default 600)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vjob-bench-realjob-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        if args.rebuild:
            shutil.rmtree(image_build.image_cache() / image_build._cache_key([]), ignore_errors=True)
        store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
        store.upgrade()
        result = image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
        store.close()
        (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n')
        if args.checkpoint:
            print(json.dumps(checkpoint(base, args.memory, args.fill)))
            return 0
        work = base / "work"
        work.mkdir()
        (work / "job.sh").write_text("#!/bin/sh\necho first line\nexit 0\n")
        out = base / "out"
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
                "bench",
                "--node",
                "n1",
                "--os",
                "debian12",
                "--memory",
                str(args.memory),
                "--cpus",
                str(args.cpus),
                "--script",
                "job.sh",
            ],
            cwd=work,
            stdout=out.open("wb"),
            stderr=subprocess.DEVNULL,
        )
        first = None
        while pilot.poll() is None or first is None:
            if first is None and out.stat().st_size > 0:
                first = time.monotonic() - t0
            if pilot.poll() is not None and first is None:
                break
            time.sleep(0.05)
        total = time.monotonic() - t0
        line = {
            "bench": "realjob",
            "image": "debian12",
            "image_mb": round(result.size_bytes / 2**20, 1),
            "build_s": round(result.build_s, 1),
            "build_cached": result.cached,
            "domain_type": kvm_probe.cached("qemu64") or "qemu",
            "vcpus": args.cpus,
            "memory_mib": args.memory,
            "first_line_s": round(first, 2) if first is not None else None,
            "run_total_s": round(total, 2),
            "exit": pilot.returncode,
        }
        print(json.dumps(line))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
