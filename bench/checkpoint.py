"""Checkpoint speed: save + restore of real QEMU guests against a plain copy of the same bytes.

Why a copy as the yardstick: a save writes the guest's touched memory to disk and a restore
reads it back, so a plain copy (read + write + fsync) of a file of the same size on the same
disk is the physical limit here; the ratio says how far libvirt/QEMU are from it, and stays
meaningful on a loaded two-core machine where absolute seconds vary from run to run.

Each size boots the counter guest with part of its RAM filled with random data (so the state
is not mostly zero pages), waits for it to count, saves it, copies the state file, restores
it and checks that the counter continued. The driver's save and restore include hashing the
state file (sha256, to refuse a corrupt one); the hash alone is reported too. Starts libvirtd
(under tini) if it is not running and stops what it started. Prints a table, writes a PNG, and ends with one JSON line.

    .venv/bin/python bench/checkpoint.py [--sizes 128,256] [--out out]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from devkit import guest_probe, libvirtd
from devkit.guest_probe import wait_for_counter
from provisioning import guest, transfer
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig

FILL_SHARE = 0.5
"""Share of the guest's RAM filled with random data before the checkpoint."""


def plain_copy(src: Path, dst: Path) -> float:
    """Seconds to copy `src` to `dst` and fsync it (what a save must at least cost)."""
    started = time.perf_counter()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 4 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    return time.perf_counter() - started


def measure(driver: Driver, files: guest.GuestFiles, image: Path, mib: int, work: Path) -> dict[str, float]:
    name = f"vjob-bench-ckpt-{mib}"
    fill = int(mib * FILL_SHARE)
    spec = VMSpec(name, image, memory_mib=mib, kernel=files.kernel, initrd=files.initrd,
                  cmdline=f"{files.cmdline} vjob_fill={fill}")  # fmt: skip
    driver.delete(name, "local")
    driver.define(spec, "local")
    driver.boot(name, "local")
    log = driver.console_log(name, "local")
    try:
        wait_for_counter(log, 2, 180)
        started = time.perf_counter()
        snap = driver.save(name, "local")
        save_s = time.perf_counter() - started
        copy_s = plain_copy(snap.memory_path, work / f"copy-{mib}.bin")
        started = time.perf_counter()
        transfer.sha256_file(snap.memory_path)
        hash_s = time.perf_counter() - started
        (work / f"copy-{mib}.bin").unlink()
        before = guest_probe.last_counter(log) or 0
        started = time.perf_counter()
        driver.restore(name, "local")
        restore_s = time.perf_counter() - started
        wait_for_counter(log, before + 1, 60)
        continued = guest_probe.counters(log)[before] == before + 1 and guest_probe.boots(log) == 1
    finally:
        driver.delete(name, "local")
    size = snap.size_bytes
    return {
        "mib": mib,
        "state_bytes": size,
        "save_s": save_s,
        "restore_s": restore_s,
        "copy_s": copy_s,
        "hash_s": hash_s,
        "save_mb_s": size / 1e6 / save_s,
        "restore_mb_s": size / 1e6 / restore_s,
        "copy_mb_s": size / 1e6 / copy_s,
        "ratio_to_copy": (save_s + restore_s) / copy_s,
        "continued": continued,
    }


def plot(rows: list[dict[str, float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.25
    xs = range(len(rows))
    for k, (key, label) in enumerate([("save_s", "save"), ("restore_s", "restore"), ("copy_s", "plain copy")]):
        ax.bar([x + (k - 1) * width for x in xs], [r[key] for r in rows], width, label=label)
    ax.set_xticks(list(xs), [f"{int(r['mib'])} MiB\n({r['state_bytes'] / 1e6:.0f} MB state)" for r in rows])
    ax.set_ylabel("seconds")
    ax.set_title("Checkpoint of a real QEMU guest vs a plain copy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256", help="guest memory sizes in MiB")
    parser.add_argument("--out", type=Path, default=Path("out"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console(stderr=True)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vjob-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    daemons = libvirtd.start_system(work / "log")
    rows = []
    try:
        files = guest.build()
        image = work / "empty.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
        cfg = ProvisioningConfig(nodes={"local": daemons.uri}, operation_timeout_s=300)
        with Driver(cfg, data_dir=work) as driver, Progress(console=console, transient=True) as progress:
            task = progress.add_task("checkpointing guests", total=len(sizes))
            for mib in sizes:
                progress.update(task, description=f"{mib} MiB guest: boot, save, copy, restore")
                rows.append(measure(driver, files, image, mib, work))
                progress.advance(task)
    finally:
        libvirtd.stop(daemons)
        shutil.rmtree(work, ignore_errors=True)
    table = Table("guest", "state", "save", "restore", "plain copy", "sha256", "(save+restore)/copy", "continued")
    for r in rows:
        table.add_row(
            f"{r['mib']} MiB",
            f"{r['state_bytes'] / 1e6:.0f} MB",
            f"{r['save_s']:.2f} s ({r['save_mb_s']:.0f} MB/s)",
            f"{r['restore_s']:.2f} s ({r['restore_mb_s']:.0f} MB/s)",
            f"{r['copy_s']:.2f} s ({r['copy_mb_s']:.0f} MB/s)",
            f"{r['hash_s']:.2f} s",
            f"{r['ratio_to_copy']:.2f}",
            str(r["continued"]),
        )
    Console().print(table)
    png = args.out / "checkpoint.png"
    plot(rows, png)
    print(f"plot: {png}")
    figures = {
        "bench": "checkpoint",
        "mib": [r["mib"] for r in rows],
        "state_mb": [round(r["state_bytes"] / 1e6, 1) for r in rows],
        "save_s": [round(r["save_s"], 3) for r in rows],
        "restore_s": [round(r["restore_s"], 3) for r in rows],
        "copy_s": [round(r["copy_s"], 3) for r in rows],
        "hash_s": [round(r["hash_s"], 3) for r in rows],
        "save_mb_s": [round(r["save_mb_s"], 1) for r in rows],
        "restore_mb_s": [round(r["restore_mb_s"], 1) for r in rows],
        "ratio_to_copy": [round(r["ratio_to_copy"], 2) for r in rows],
        "continued": all(bool(r["continued"]) for r in rows),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
