"""What a domain's memory ceiling costs a guest, and whether its balloon follows the node kind.

The remapping defines a vjob's domain with a ceiling (`<memory>`: the farm's largest node kind's
memory per slot) and boots it with what its job asked (`<currentMemory>`); after a move the agent
sets the balloon to the destination kind's memory (agent.remap_step.set_memory). The guest's
kernel sizes itself for the ceiling (its page structures, ~1.6 % of it, come out of what it was
asked), so this measures, on real QEMU with the counter guest: for each ceiling, the guest's
memory as it reports it (balloon statistics: `available` = MemTotal, `usable` ≈ MemAvailable)
and the QEMU process's RSS after the boot at the asked size, after the balloon is let out to the
ceiling (a move to a big kind) and after it is taken back (a move home). Last line: JSON.

    .venv/bin/python bench/remap_memory.py [--asked-mib 128] [--ceilings 128,512]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit import libvirtd
from devkit.bench_nodes import bench_nodes
from provisioning import guest
from provisioning.driver import Driver, VMSpec

VM = "vjob-remap-memory"


def reading(driver: Driver, want_mib: int, timeout_s: float = 60.0) -> dict[str, int]:
    """The guest's balloon statistics (MiB) once the balloon has reached `want_mib` and the guest
    reports its memory; the QEMU process's RSS too."""
    dom = driver.connection("a").lookupByName(VM)
    deadline = time.monotonic() + timeout_s
    stats: dict[str, int] = {}
    while time.monotonic() < deadline:
        stats = dom.memoryStats()
        if stats.get("actual") == want_mib * 1024 and "available" in stats:
            time.sleep(6)  # one more statistics period after the balloon settled
            stats = dom.memoryStats()
            break
        time.sleep(1)
    else:
        raise TimeoutError(f"balloon did not reach {want_mib} MiB: {stats}")
    return {k: int(stats[k]) // 1024 for k in ("actual", "available", "usable", "rss") if k in stats}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--asked-mib", type=int, default=128)
    parser.add_argument("--ceilings", default="128,512")  # 2048: the guest panics at boot
    args = parser.parse_args()
    ceilings = [int(c) for c in args.ceilings.split(",")]

    system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-remap-memory-log-")))
    files = guest.build()
    rows: list[dict[str, Any]] = []
    try:
        with bench_nodes("vjob-remap-memory", {"a": system.uri}, vms=[VM], timeout_s=180) as bench:
            driver = bench.driver
            try:
                for ceiling in ceilings:
                    spec = VMSpec(
                        VM,
                        bench.image,
                        memory_mib=args.asked_mib,
                        max_memory_mib=ceiling,
                        kernel=files.kernel,
                        initrd=files.initrd,
                        cmdline=files.cmdline,
                    )
                    driver.define(spec, "a")
                    t0 = time.monotonic()
                    driver.boot(VM, "a")
                    row: dict[str, Any] = {"ceiling_mib": ceiling, "booted": reading(driver, args.asked_mib)}
                    row["boot_to_stats_s"] = round(time.monotonic() - t0, 1)
                    if ceiling > args.asked_mib:
                        driver.set_memory(VM, "a", ceiling)
                        row["let_out"] = reading(driver, ceiling)
                        driver.set_memory(VM, "a", args.asked_mib)
                        row["taken_back"] = reading(driver, args.asked_mib)
                    print(row, flush=True)
                    rows.append(row)
                    driver.delete(VM, "a")
            except BaseException:
                log = driver.console_log(VM, "a")
                tail = log.read_bytes()[-8000:].decode(errors="replace") if log.exists() else "-"
                print(f"guest console, last lines: {tail}")
                raise
    finally:
        libvirtd.stop(system)
    base = rows[0]["booted"]["available"]
    print(
        json.dumps(
            {
                "asked_mib": args.asked_mib,
                "rows": rows,
                "memtotal_lost_mib": {r["ceiling_mib"]: base - r["booted"]["available"] for r in rows},
            }
        )
    )


if __name__ == "__main__":
    main()
