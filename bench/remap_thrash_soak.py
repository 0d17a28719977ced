"""How often a moved guest survives its migration: the thrashing case of tests/test_remap_live.py
repeated --runs times, counting the guest kernels that crash after the move.

Why a bench: the defect it was written for (issue 20: a guest crashing right after a live
migration under TCG, about 1 run in 13 in the test) is too rare for one run to say anything;
each way of moving (`--move auto|live|paused`, bench/remap_thrash.py) needs tens of runs. Each
run boots the guest on node a with its balloon at 128 MiB, waits for the first profiling window
to see it thrash, moves it to node b, gives it its memory back there and lets it run
--passes-after passes of its payload. `--payload dirty` is the control: no swap and no balloon,
the guest's CPU rewriting a file in RAM, moved 5 s after its payload starts. A run counts as a
crash when the guest's console shows an Oops, a BUG or a panic. Its own second libvirtd
(--node-dir, --ports) and initrd, so that several can run at once (--vm-suffix). Found: the
live copy under TCG is the cause, not the balloon or the swap (docs/remap.md, "The migration
defect"). `--free-page-reporting on` gives the guest's balloon free page reporting (the domain
XML of `[provisioning] free_page_reporting`; each run records whether the domain had it): how
it was re-tested before being turned on by default. Last line: JSON.

    nice -n 10 .venv/bin/python bench/remap_thrash_soak.py --runs 30 --move live --payload dirty
    nice -n 10 .venv/bin/python bench/remap_thrash_soak.py --runs 30 --free-page-reporting on
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt
import remap_thrash as bench  # bench/ is this script's directory, first on sys.path

from devkit import libvirtd
from devkit.bench_nodes import bench_nodes
from provisioning import guest
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig
from vjob.model import VMState

DIRTY_PAYLOAD = """mkdir -p /w && mount -t tmpfs -o size={work}m tmpfs /w
sleep 4
sz=$(stat -c %s /bin/busybox); n=$(( {work} * 1048576 / sz ))
echo "PAYLOAD START"
i=0
while [ $i -lt {passes} ]; do i=$((i+1)); j=0
  while [ $j -lt $n ]; do j=$((j+1)); echo "chunk $j $i"; cat /bin/busybox; done > /w/data
  echo "PASS $i"; done
"""
"""The control: no swap and no balloon, the guest's CPU rewriting a --working-mib file in tmpfs
(in RAM) over and over — memory dirtied as fast as the thrashing guest's, by the CPU alone."""


REPORTING = ProvisioningConfig().free_page_reporting
"""vjob's own balloon setting, the default of --free-page-reporting."""


def dirty_run(driver: Driver, spec: VMSpec, move: str, after_s: float, passes_after: int) -> dict[str, Any]:
    """Boot, let the payload dirty memory for `after_s`, migrate, wait for `passes_after` passes
    on node b (no profiling: nothing here thrashes, the move is made by hand)."""
    for node in ("a", "b"):
        driver.delete(bench.VM, node)
        driver.console_log(bench.VM, node).unlink(missing_ok=True)
    driver.define(spec, "a")
    driver.boot(bench.VM, "a")
    deadline = time.monotonic() + 120.0
    while not bench.START_RE.search(bench.console(driver)):
        if time.monotonic() > deadline:
            raise TimeoutError("the payload did not start within 120 s")
        time.sleep(0.2)
    time.sleep(after_s)
    t0 = time.monotonic()
    at_pass = bench.passes(bench.console(driver))
    live = driver.migrate(bench.VM, "a", "b", live=bench.MOVES[move])
    moved = {"migrate_s": round(time.monotonic() - t0, 2), "pass": at_pass, "live": live}
    while bench.passes(bench.console(driver)) < at_pass + passes_after:
        if time.monotonic() > deadline + 120.0 or bench.crash(bench.console(driver)):
            raise TimeoutError(f"no pass {at_pass + passes_after} on b")
        time.sleep(0.5)
    return {"moved": moved}


def _reporting(driver: Driver, node: str) -> bool | None:
    """Whether the guest's running domain on `node` has free page reporting (None: no domain):
    the run is counted under the balloon it really had."""
    try:
        xml = driver.connection(node).lookupByName(bench.VM).XMLDesc(0)
    except libvirt.libvirtError:
        return None
    return any(b.get("freePageReporting") == "on" for b in ET.fromstring(xml).findall("./devices/memballoon"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--move", choices=("auto", "live", "paused"), default="auto")
    parser.add_argument("--passes-after", type=int, default=2)
    parser.add_argument(
        "--payload",
        choices=("thrash", "dirty"),
        default="thrash",
        help="dirty: the control, a guest writing memory hard with no swap and no balloon",
    )
    parser.add_argument(
        "--boot-mib",
        type=int,
        default=256,
        help="memory at boot; 128: no balloon to inflate on a (it swaps all the same)",
    )
    parser.add_argument("--node-dir", default="/var/tmp/vjob-node20")
    parser.add_argument("--ports", default="49360-49379", help="the second node's migration ports")
    parser.add_argument("--vm-suffix", default="", help="a VM name of its own, to run beside another soak")
    parser.add_argument(
        "--free-page-reporting",
        choices=("on", "off"),
        default="on" if REPORTING else "off",
        help="free page reporting on the balloon (provisioning.free_page_reporting)",
    )
    args = parser.parse_args()
    low, high = (int(p) for p in args.ports.split("-"))

    if args.vm_suffix:
        bench.VM = f"{bench.VM}-{args.vm_suffix}"
    system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-remap-soak-log-")))
    second = libvirtd.start_second_node(Path(args.node_dir), hostname="nodes", migration_ports=(low, high))
    # an initrd of its own (a comment in the payload): soaks side by side must not share one file,
    # which each libvirtd relabels for its own QEMU and gives back when its domain stops
    text = DIRTY_PAYLOAD if args.payload == "dirty" else bench.PAYLOAD
    files = guest.build(payload=text.format(work=112, passes=10_000) + f"# soak {args.vm_suffix}\n")
    runs: list[dict[str, Any]] = []
    try:
        with bench_nodes(
            "vjob-remap-soak", {"a": system.uri, "b": second.uri}, vms=[bench.VM], disk_mib=256, timeout_s=180
        ) as on:
            on.driver.config.free_page_reporting = args.free_page_reporting == "on"
            spec = VMSpec(
                bench.VM,
                on.image,
                memory_mib=args.boot_mib,
                kernel=files.kernel,
                initrd=files.initrd,
                cmdline=f"{files.cmdline} {bench.NO_TIMER_CHECK}",
            )
            for i in range(1, args.runs + 1):
                t0 = time.monotonic()
                row: dict[str, Any] = {"run": i}
                try:
                    if args.payload == "dirty":
                        out = dirty_run(on.driver, spec, args.move, 5.0, args.passes_after)
                    else:
                        out = bench.run(
                            on.driver,
                            spec,
                            128,
                            remap=True,
                            tau=5.0,
                            timeout=120.0,
                            passes_after_move=args.passes_after,
                            move=args.move,
                            big_mib=256,
                        )
                    row["moved"] = out["moved"]
                except Exception as exc:  # noqa: BLE001 - a run that fails is what is counted
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                log = bench.console(on.driver)
                row["crash"] = bench.crash(log)
                try:
                    running = on.driver.state(bench.VM, "b") is VMState.RUNNING
                except Exception:  # noqa: BLE001 - no domain on b: not running there
                    running = False
                row["reporting"] = _reporting(on.driver, "b" if running else "a")
                row["ok"] = row["crash"] is None and "error" not in row and running
                row["seconds"] = round(time.monotonic() - t0, 1)
                if not row["ok"]:
                    Path(args.node_dir, f"console-{args.move}-{i}.log").write_bytes(log)
                runs.append(row)
                print(json.dumps(row), flush=True)
    finally:
        libvirtd.stop(second)
        libvirtd.stop(system)
    bad = [r for r in runs if not r["ok"]]
    print(
        json.dumps(
            {
                "bench": "remap_thrash_soak",
                "move": args.move,
                "boot_mib": args.boot_mib,
                "payload": args.payload,
                "free_page_reporting": args.free_page_reporting,
                "runs": len(runs),
                "crashes": sum(1 for r in runs if r["crash"]),
                "failures": len(bad),
                "failed_runs": [{k: r.get(k) for k in ("run", "crash", "error")} for r in bad],
            }
        )
    )


if __name__ == "__main__":
    main()
