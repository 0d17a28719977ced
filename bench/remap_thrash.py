"""Live remapping of a thrashing guest: seen through its balloon's swap statistics, moved at once.

Two libvirtds on this machine act as two node kinds of equal speed and different memory. A node
of the "small" kind holds each guest to --small-mib through the guest's virtio balloon (set by
the node after the boot, as the CPU cap of bench/remap_live.py is; nothing of it is in the
domain XML); the "big" kind gives the guest all of its --memory-mib. The guest swaps to its
disk and runs a memory-bound payload: a tmpfs file of --working-mib (numbered copies of the
guest's busybox: the same bytes every run) read --passes times, printing its checksum. On the
small node its working set does not fit: every pass evicts and reads back the file
(thrashing). Run 1 keeps it there. Run 2 starts it there with the big node free: every --tau
seconds the profiler samples the guest's balloon statistics (swap in, swap out),
`preemption.remap.decide` sees it thrash and moves it at once, whatever the gain (both kinds
compute alike: the gain is the migration's loss, negative), the driver migrates it (paused under TCG,
live on KVM: docs/remap.md, "The migration defect"), and
the big node lets its balloon go. Checksums must match; times compared. Last line: JSON.

    .venv/bin/python bench/remap_thrash.py [--passes 12] [--tau 5]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit import libvirtd
from devkit.bench_nodes import bench_nodes
from preemption.remap.models import SubCluster, migration_cost_s
from preemption.remap.online import CYCLES, profile_and_decide
from preemption.remap.policy import RemapParams
from provisioning import guest
from provisioning.driver import Driver, VMSpec
from provisioning.profiling import Profiler, window
from provisioning.vm_types import DriverError

VM = "vjob-remap-thrash"
PAYLOAD = """mkswap /dev/vda >/dev/null && swapon /dev/vda && echo "GUEST: swap on"
mkdir -p /w && mount -t tmpfs -o size={work}m tmpfs /w
sleep 4
sz=$(stat -c %s /bin/busybox); n=$(( {work} * 1048576 / sz )); j=0
while [ $j -lt $n ]; do j=$((j+1)); echo "chunk $j"; cat /bin/busybox; done > /w/data
echo "PAYLOAD START"
i=0
while [ $i -lt {passes} ]; do i=$((i+1)); sum=$(md5sum /w/data); echo "PASS $i"; done
echo "RESULT ${{sum%% *}}"
"""
NO_TIMER_CHECK = "no_timer_check"
"""Kernel option: on a loaded host (load average 10 on the 2 cores) the guest kernel's early
check of the IO-APIC timer failed once in five boots ("IO-APIC + timer doesn't work", a panic)."""
RESULT_RE = re.compile(rb"RESULT ([0-9a-f]{32})")
PASS_RE = re.compile(rb"PASS (\d+)")
START_RE = re.compile(rb"PAYLOAD START")


def console(driver: Driver) -> bytes:
    out = b""
    for node in ("a", "b"):
        try:
            out += driver.console_log(VM, node).read_bytes()
        except FileNotFoundError:
            continue
    return out


def balloon(driver: Driver, node: str, mib: int) -> None:
    """The node kind's memory for the guest: the balloon's target, set live (as the agent's
    remapping step does after a move, agent.remap_step.set_memory)."""
    driver.set_memory(VM, node, mib)


CRASH_RE = re.compile(rb"(Oops|BUG: |Kernel panic|general protection fault|kernel BUG at)[^\r\n]{0,80}")
MOVES = {"auto": None, "live": True, "paused": False}
"""How the guest is moved: as the driver chooses (paused under TCG, live on KVM: the migration
defect, docs/remap.md), or forced live, or forced paused for the whole copy."""


def crash(log: bytes) -> str | None:
    """The guest kernel's first crash line on its console, if it crashed."""
    found = CRASH_RE.search(log)
    return found.group(0).decode(errors="replace") if found else None


def passes(log: bytes) -> int:
    """The last pass the payload finished, as its console shows it (0: none yet)."""
    found = PASS_RE.findall(log)
    return int(found[-1]) if found else 0


def run(
    driver: Driver,
    spec: VMSpec,
    small_mib: int,
    remap: bool,
    tau: float,
    timeout: float,
    *,
    passes_after_move: int = 0,
    move: str = "auto",
    big_mib: int | None = None,
) -> dict[str, Any]:
    """One run to the payload's RESULT; with `passes_after_move` > 0 it stops instead once the
    guest, moved, has finished that many whole passes on the big node (tests/test_remap_live.py:
    it keeps running there, no need to wait for the end)."""
    for node in ("a", "b"):
        driver.delete(VM, node)
        driver.console_log(VM, node).unlink(missing_ok=True)
    driver.define(spec, "a")
    driver.boot(VM, "a")
    balloon(driver, "a", small_mib)
    farm = {
        "small": SubCluster("small", 1, 1, small_mib, 3.0, cycles={CYCLES: 1.0}),
        "big": SubCluster("big", 1, 1, big_mib or spec.memory_mib, 3.0, cycles={CYCLES: 1.0}),
    }
    params = RemapParams(tau_s=tau, beta=20, threshold_s=60.0, thrash_pages_s=200.0)
    prof = Profiler(driver.connection("a"))
    prof.enable(VM, perf=())
    booted = time.monotonic()
    while not START_RE.search(console(driver)):
        if b"payload exited" in console(driver):
            raise RuntimeError(f"payload failed: {console(driver)[-2000:]!r}")
        if time.monotonic() - booted > timeout:
            raise TimeoutError(f"the payload did not start within {timeout:.0f} s: {console(driver)[-2000:]!r}")
        time.sleep(0.2)
    started = time.monotonic()
    node, moved, decisions, windows = "a", None, [], []
    last = prof.sample([VM])[VM]
    while not RESULT_RE.search(console(driver)):
        if moved is not None and passes_after_move and passes(console(driver)) >= moved["pass"] + passes_after_move:
            break
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"no RESULT within {timeout:.0f} s")
        time.sleep(0.5)
        if time.monotonic() - last.t < tau:
            continue
        try:
            if not remap or node == "b":
                now = prof.sample([VM])[VM]
                w = window(last, now)
                last, ds = now, []
            else:
                before = last
                last, ds = profile_and_decide(
                    prof,
                    VM,
                    last,
                    "small",
                    farm,
                    {"small": 0, "big": 1},
                    params,
                    memory_mb=spec.memory_mib,
                    migrate_s=migration_cost_s(spec.memory_mib, 110.0),
                )
                w = window(before, last)
        except (DriverError, KeyError):  # the payload ended and the guest powered off meanwhile
            continue
        out = None if w.swap_out_pages_s is None else round(w.swap_out_pages_s)
        windows.append(
            {
                "node": node,
                "t": round(last.t - started, 1),
                "swap_in_pages_s": round(w.swap_in_pages_s),
                "swap_out_pages_s": out,
            }
        )
        decisions += [
            {"kind": d.kind, "reason": d.reason, "dst": list(d.dst), "gain_s": round(d.gain_s, 1)} for d in ds
        ]
        if ds:
            t0 = time.monotonic()
            at_pass = passes(console(driver))
            live = driver.migrate(VM, "a", "b", live=MOVES[move])
            balloon(driver, "b", spec.memory_mib)
            node = "b"
            moved = {
                "after_s": round(t0 - started, 1),
                "migrate_s": round(time.monotonic() - t0, 2),
                "pass": at_pass,
                "live": live,
            }
            prof = Profiler(driver.connection("b"))
            last = prof.sample([VM])[VM]
    found = RESULT_RE.findall(console(driver))
    return {
        "seconds": round(time.monotonic() - started, 1),
        "passes": passes(console(driver)),
        "result": found[-1].decode() if found else None,
        "moved": moved,
        "decisions": decisions,
        "windows": windows,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mib", type=int, default=256)
    parser.add_argument("--small-mib", type=int, default=128)
    parser.add_argument("--working-mib", type=int, default=112)
    parser.add_argument("--passes", type=int, default=12)
    parser.add_argument("--tau", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--only-remap", action="store_true", help="skip the run that stays (a quick check)")
    args = parser.parse_args()

    system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-remap-thrash-log-")))
    # a big node of its own: the shared second node (/var/tmp/vjob-nodeb) is stopped by whichever
    # test session started it, possibly in the middle of this bench
    second = libvirtd.start_second_node(Path("/var/tmp/vjob-nodet"), hostname="nodet", migration_ports=(49330, 49350))
    files = guest.build(payload=PAYLOAD.format(work=args.working_mib, passes=args.passes))
    nodes = {"a": system.uri, "b": second.uri}
    stay: dict[str, Any] | None = None
    try:
        with bench_nodes("vjob-remap-thrash", nodes, vms=[VM], disk_mib=256, timeout_s=180) as bench:
            driver = bench.driver
            spec = VMSpec(
                VM,
                bench.image,
                memory_mib=args.memory_mib,
                kernel=files.kernel,
                initrd=files.initrd,
                cmdline=f"{files.cmdline} {NO_TIMER_CHECK}",
            )
            try:
                if not args.only_remap:
                    stay = run(driver, spec, args.small_mib, False, args.tau, args.timeout)
                    print(f"stays on the small node: {stay}")
                moved = run(driver, spec, args.small_mib, True, args.tau, args.timeout)
                print(f"remapped to the big node: {moved}")
            except BaseException:
                print(f"guest console, last lines: {console(driver)[-1500:].decode(errors='replace')}")
                raise
    finally:
        libvirtd.stop(second)
        libvirtd.stop(system)

    def peak(r: dict[str, Any], node: str) -> float:
        return max((w["swap_in_pages_s"] for w in r["windows"] if w["node"] == node), default=0.0)

    doc = {
        "bench": "remap_thrash",
        "memory_mib": args.memory_mib,
        "small_mib": args.small_mib,
        "working_mib": args.working_mib,
        "passes": args.passes,
        "stay_s": stay["seconds"] if stay else None,
        "remapped_s": moved["seconds"],
        "speedup": round(stay["seconds"] / moved["seconds"], 2) if stay else None,
        "same_result": stay is None or (stay["result"] == moved["result"] and stay["result"] is not None),
        "moved": moved["moved"],
        "decisions": moved["decisions"],
        "swap_in_pages_s_small_peak": peak(moved, "a"),
        "swap_in_pages_s_big_peak": peak(moved, "b"),
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
