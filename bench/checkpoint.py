"""Checkpoint speed: save + restore of a job's real QEMU guests against a plain copy of the same bytes.

Why a copy as the yardstick: a save writes the guests' touched memory to disk and a restore
reads it back, so a plain copy (read + write + fsync) of files of the same size on the same
disk, in the same run, is the physical limit here; the ratio says how far libvirt/QEMU (and
our integrity hashing) are from it, and stays meaningful on a loaded two-core machine where
absolute seconds vary from run to run.

For each number of VMs (`--vms 1,4`), each page-cache policy (`--modes cold,bypass`) and each
balloon (`--balloons reporting,stats`) the counter guests are booted with half their RAM
filled with random data (held) and a quarter more touched and freed again (`--churn`: a job
whose memory use went down), checkpointed together (`provisioning.coordinated`: all paused,
then saved in parallel), the state files are copied, and the guests are restored together
and checked to have continued. `stats` is a virtio balloon for statistics only; `reporting`
adds free page reporting (the guest hands freed memory back to QEMU, which then saves it as
zero pages): the domain XML the driver writes with `[provisioning] free_page_reporting` off or
on; the default is vjob's own setting (docs/provisioning.md).
Every configuration is measured `--reps` times, the repetitions interleaved (rep 1 of every
configuration, then rep 2, ...) so that a load spike hits one repetition rather than one
configuration; the table shows medians, and the spread of the copy. The page cache is
handled the same way for both sides:
- `cold`: caches dropped (`/proc/sys/vm/drop_caches`) before the save, the copy and the
  restore; the copy fsyncs, the save's state files are fsynced inside its timing;
- `bypass`: the save and restore use VIR_DOMAIN_SAVE_BYPASS_CACHE (O_DIRECT) and the copy
  reads and writes with O_DIRECT.
The driver's save and restore include sha256 of every state (to refuse a corrupt one): the
hash alone is reported too, and so is `start`, libvirt starting one such guest paused with no
state to load (a restore's floor: a QEMU process, its monitor, its devices). Figures are per
GiB of guest memory, with the bytes written per GiB of guest memory, and the load average at
the start and the end. Starts libvirtd (under tini) if it is not running and stops what it
started; with `--node-dir` a private libvirtd of its own instead (another session's test may
stop the shared one in the middle of a run). Prints a table and ends with one JSON line.

    .venv/bin/python bench/checkpoint.py [--vms 1,4] [--mib 512] [--modes cold,bypass]
        [--balloons reporting,stats] [--churn 0.25] [--reps 3] [--node-dir /var/tmp/vjob-node-ckpt]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import libvirt
from rich.console import Console
from rich.table import Table

from devkit import guest_probe, libvirtd
from devkit.guest_probe import wait_for_counter
from provisioning import coordinated, guest, transfer
from provisioning.coordinated import Member
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig

FILL_SHARE = 0.5
"""Share of each guest's RAM filled with random data before the checkpoint (and held)."""
WAIT_COUNTER = 4
"""Counter value awaited before the checkpoint: the guest reports freed pages about 2 s after
they are freed (the kernel's page_reporting delay), the churn ends right before the counter
starts."""
NODE = "local"
GIB = 1 << 30
BLOCK = 4 << 20
"""Copy block (bytes): a multiple of the 4 KiB O_DIRECT alignment."""


def drop_caches() -> None:
    """Write back and drop the page cache, so the next read comes from the disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def plain_copy(sources: list[Path], work: Path, *, direct: bool) -> float:
    """Seconds to copy every file of `sources` into `work` and fsync it (a save's floor).

    `direct`: read and write with O_DIRECT through an aligned buffer (no page cache at all).
    """
    flag = os.O_DIRECT if direct else 0
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
    started = time.perf_counter()
    for i, src in enumerate(sources):
        dst = work / f"copy-{i}.bin"
        fin = os.open(src, os.O_RDONLY | flag)
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        try:
            while True:
                n = os.readv(fin, [buf])
                if n <= 0:
                    break
                if n % 4096 and direct:  # the last block of a file that is not 4 KiB-aligned
                    os.close(fout)
                    fout = os.open(dst, os.O_WRONLY)
                    os.lseek(fout, 0, os.SEEK_END)
                os.write(fout, memoryview(buf)[:n])
                if n < BLOCK:
                    break
            os.fsync(fout)
        finally:
            os.close(fin)
            os.close(fout)
    elapsed = time.perf_counter() - started
    for i in range(len(sources)):
        (work / f"copy-{i}.bin").unlink()
    return elapsed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _start_paused(driver: Driver, name: str, image: Path, files: guest.GuestFiles, mib: int) -> float:
    """Seconds for libvirt to start a guest like the bench's paused, with nothing to load."""
    driver.delete(name, NODE)
    driver.define(
        VMSpec(name, image, memory_mib=mib, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline), NODE
    )
    dom = driver.connection(NODE).lookupByName(name)
    try:
        started = time.perf_counter()
        dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
        return time.perf_counter() - started
    finally:
        driver.delete(name, NODE)


DEFAULT_BALLOON = "reporting" if ProvisioningConfig().free_page_reporting else "stats"
"""The balloon of vjob's own domains (`[provisioning] free_page_reporting`)."""
Config = tuple[int, str, str]
"""One configuration: number of VMs, page-cache mode, balloon."""


def measure(
    driver: Driver, files: guest.GuestFiles, image: Path, config: Config, mib: int, churn: float, work: Path
) -> dict:
    vms, mode, balloon = config
    names = [f"vjob-bench-ckpt-{mode}-{balloon}-{vms}-{i}" for i in range(vms)]  # a console log per run
    members = [Member(n, NODE) for n in names]
    bypass = mode == "bypass"
    fill, churned = int(mib * FILL_SHARE), int(mib * churn)
    for name in names:
        driver.delete(name, NODE)
        driver.console_log(name, NODE).unlink(missing_ok=True)  # an old log would show old counters
        spec = VMSpec(
            name,
            image,
            memory_mib=mib,
            kernel=files.kernel,
            initrd=files.initrd,
            cmdline=f"{files.cmdline} vjob_fill={fill} vjob_churn={churned}",
        )
        driver.config.free_page_reporting = balloon == "reporting"  # the domain XML vjob writes with it
        driver.define(spec, NODE)
        driver.boot(name, NODE)
    try:
        for name in names:
            wait_for_counter(driver.console_log(name, NODE), WAIT_COUNTER, 300)
        if not bypass:
            drop_caches()
        started = time.perf_counter()
        cut = coordinated.checkpoint(driver, members, bypass_cache=bypass)
        for snap in cut.snapshots.values():
            _fsync(snap.memory_path)
        save_s = time.perf_counter() - started
        states = [cut.snapshots[n].memory_path for n in names]
        state_bytes = sum(cut.snapshots[n].size_bytes for n in names)
        if not bypass:
            drop_caches()
        copy_s = plain_copy(states, work, direct=bypass)
        drop_caches()
        started = time.perf_counter()
        for path in states:
            transfer.sha256_file(path)
        hash_s = time.perf_counter() - started
        before = {n: guest_probe.last_counter(driver.console_log(n, NODE)) or 0 for n in names}
        if not bypass:
            drop_caches()
        started = time.perf_counter()
        coordinated.restore(driver, members, bypass_cache=bypass)
        restore_s = time.perf_counter() - started
        continued = True
        for n in names:
            log = driver.console_log(n, NODE)
            wait_for_counter(log, before[n] + 1, 120)
            continued &= guest_probe.counters(log)[before[n]] == before[n] + 1 and guest_probe.boots(log) == 1
        start_s = _start_paused(driver, f"{names[0]}-start", image, files, mib)
    finally:
        for name in names:
            driver.delete(name, NODE)
    guest_gib = vms * mib / 1024
    return {
        "vms": vms,
        "mode": mode,
        "balloon": balloon,
        "guest_gib": guest_gib,
        "state_bytes": state_bytes,
        "save_s": save_s,
        "restore_s": restore_s,
        "copy_s": copy_s,
        "hash_s": hash_s,
        "start_s": start_s,
        "pause_to_saved_s": cut.pause_to_saved_s,
        "ratio_to_copy": (save_s + restore_s) / copy_s,
        "checkpoint_s_per_gib": (save_s + restore_s) / guest_gib,
        "copy_s_per_gib": copy_s / guest_gib,
        "written_gib_per_guest_gib": state_bytes / GIB / guest_gib,
        "continued": continued,
    }


NUMERIC = [
    "state_bytes",
    "save_s",
    "restore_s",
    "copy_s",
    "hash_s",
    "start_s",
    "pause_to_saved_s",
    "ratio_to_copy",
    "checkpoint_s_per_gib",
    "copy_s_per_gib",
    "written_gib_per_guest_gib",
]


def summarize(runs: list[dict]) -> dict:
    """The medians of one configuration's repetitions, and the spread of its copy.

    The ratio is the median of each repetition's own ratio (checkpoint and copy timed in the
    same minute), not a ratio of medians.
    """
    row = {k: runs[0][k] for k in ("vms", "mode", "balloon", "guest_gib")}
    for key in NUMERIC:
        row[key] = statistics.median(r[key] for r in runs)
    row["copy_s_min_max"] = [min(r["copy_s"] for r in runs), max(r["copy_s"] for r in runs)]
    row["ratio_min_max"] = [min(r["ratio_to_copy"] for r in runs), max(r["ratio_to_copy"] for r in runs)]
    row["continued"] = all(r["continued"] for r in runs)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example: .venv/bin/python bench/checkpoint.py --vms 1,4 --mib 512 --modes cold,bypass --reps 3",
    )
    parser.add_argument("--vms", default="1,4", help="numbers of VMs checkpointed together, comma-separated")
    parser.add_argument("--mib", type=int, default=512, help="memory of each guest in MiB (half filled)")
    parser.add_argument("--modes", default="cold,bypass", help="page-cache policies to measure: cold, bypass")
    parser.add_argument(
        "--balloons",
        default=DEFAULT_BALLOON,
        help=f"balloons to compare: reporting (free page reporting), stats; default: vjob's ({DEFAULT_BALLOON})",
    )
    parser.add_argument("--churn", type=float, default=0.25, help="share of each guest's RAM touched, then freed")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every configuration, interleaved")
    parser.add_argument("--node-dir", default="", help="a private libvirtd kept here (others may stop the shared one)")
    args = parser.parse_args()
    counts = [int(s) for s in args.vms.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    balloons = [b for b in args.balloons.split(",") if b]
    if not set(modes) <= {"cold", "bypass"}:
        parser.error(f"--modes {args.modes!r}: cold and/or bypass")
    if not set(balloons) <= {"reporting", "stats"}:
        parser.error(f"--balloons {args.balloons!r}: reporting and/or stats")
    if not (0 <= args.churn and FILL_SHARE + args.churn <= 0.8):
        parser.error(f"--churn {args.churn}: between 0 and {0.8 - FILL_SHARE:.2f} (the guest must hold fill and churn)")
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")
    configs = [(v, m, b) for v in counts for m in modes for b in balloons]
    console = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="vjob-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    if args.node_dir:
        daemons = libvirtd.start_second_node(Path(args.node_dir), hostname="ckpt", migration_ports=(49500, 49519))
    else:
        daemons = libvirtd.start_system(work / "log")
    runs: dict[Config, list[dict]] = {c: [] for c in configs}
    load_start = os.getloadavg()[0]
    try:
        files = guest.build()
        image = work / "empty.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
        cfg = ProvisioningConfig(nodes={NODE: daemons.uri}, operation_timeout_s=600)
        with Driver(cfg, data_dir=work) as driver:
            for rep in range(args.reps):
                for vms, mode, balloon in configs:
                    console.print(f"rep {rep + 1}/{args.reps}: {vms} x {args.mib} MiB, {mode}, {balloon}")
                    run = measure(driver, files, image, (vms, mode, balloon), args.mib, args.churn, work)
                    runs[(vms, mode, balloon)].append(run)
                    console.print(
                        f"  {run['state_bytes'] / 1e6:.0f} MB, save {run['save_s']:.2f} s, restore "
                        f"{run['restore_s']:.2f} s, copy {run['copy_s']:.2f} s: {run['ratio_to_copy']:.2f}x, "
                        f"load {os.getloadavg()[0]:.1f}"
                    )
    finally:
        libvirtd.stop(daemons)
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()[0]
    rows = [summarize(runs[c]) for c in configs]
    table = Table(
        "VMs",
        "mode",
        "balloon",
        "state",
        "save",
        "restore",
        "copy (min–max)",
        "sha256",
        "start",
        "ckpt s/GiB",
        "copy s/GiB",
        "(save+restore)/copy (min–max)",
        "written/GiB",
        "continued",
        title=f"medians of {args.reps} interleaved repetitions",
    )
    for r in rows:
        table.add_row(
            f"{r['vms']} x {args.mib} MiB",
            r["mode"],
            r["balloon"],
            f"{r['state_bytes'] / 1e6:.0f} MB",
            f"{r['save_s']:.2f} s",
            f"{r['restore_s']:.2f} s",
            f"{r['copy_s']:.2f} s ({r['copy_s_min_max'][0]:.2f}–{r['copy_s_min_max'][1]:.2f})",
            f"{r['hash_s']:.2f} s",
            f"{r['start_s']:.2f} s",
            f"{r['checkpoint_s_per_gib']:.2f}",
            f"{r['copy_s_per_gib']:.2f}",
            f"{r['ratio_to_copy']:.2f} ({r['ratio_min_max'][0]:.2f}–{r['ratio_min_max'][1]:.2f})",
            f"{r['written_gib_per_guest_gib']:.2f} GiB",
            str(r["continued"]),
        )
    Console(width=200).print(table)
    figures: dict = {"bench": "checkpoint", "mib_per_vm": args.mib, "churn": args.churn, "reps": args.reps}
    for key in ["vms", "mode", "balloon", *NUMERIC, "copy_s_min_max", "ratio_min_max"]:
        figures[key] = [_rounded(r[key]) for r in rows]
    figures["continued"] = all(bool(r["continued"]) for r in rows)
    figures["load_avg_1min"] = [round(load_start, 2), round(load_end, 2)]
    print(json.dumps(figures))


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


if __name__ == "__main__":
    main()
