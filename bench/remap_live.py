"""Live remapping on the dev cluster: a CPU-bound vjob on a slow node moved when a fast node frees.

Two libvirtds on this machine act as two node kinds: node a is "slow" (the node caps each
guest's QEMU at --slow-quota of a core through its cgroup's CFS quota, as a site would cap an
old node kind; nothing of it is in the domain XML), node b is "fast" (its libvirtd runs in a
namespace without cgroups: no cap). The guest runs a CPU-bound payload (an arithmetic loop of
--iterations steps printing its checksum). Run 1 keeps it on a. Run 2 starts it on a with b
free: every --tau seconds the profiler samples it (provisioning.profiling), the profile is
priced on both kinds (CPU time and the clock ratio: this host offers no perf events),
`preemption.remap.decide` decides, and the driver live-migrates it to b. The two checksums
must be identical; the run times are compared. Last line: JSON.

    .venv/bin/python bench/remap_live.py [--iterations 400000] [--slow-quota 0.33] [--tau 10]
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
from provisioning.profiling import Profiler
from provisioning.vm_types import DriverError

VM = "vjob-remap-live"
PAYLOAD = """s=7
i=0
echo "PAYLOAD START"
while [ $i -lt {n} ]; do i=$((i+1)); s=$(( (s*31 + i) % 1000003 )); done
echo "RESULT $s"
"""
RESULT_RE = re.compile(rb"RESULT (\d+)")


def quota(driver: Driver, node: str, share: float | None) -> None:
    """The slow node kind's CPU cap, set by the node on the guest's cgroup (cfs quota) — not in
    the domain XML, so the guest carries nothing of it when it migrates (None: no cap)."""
    pid = int(Path(f"/run/libvirt/qemu/{VM}.pid").read_text().strip()) if node == "a" else None
    if pid is None:
        return
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            # The main thread sits in libvirt's emulator/ child, the vCPU threads in vcpuN/: the
            # cap goes on their common parent, the domain's own cgroup, or the vCPU runs uncapped.
            if base.name == "emulator":
                base = base.parent
            (base / "cpu.cfs_period_us").write_text("100000")
            (base / "cpu.cfs_quota_us").write_text(str(-1 if share is None else int(100_000 * share)))
            return
    raise RuntimeError(f"QEMU {pid} of {VM}: no cpu cgroup")


def result(driver: Driver) -> int | None:
    for node in ("a", "b"):
        try:
            found = RESULT_RE.findall(driver.console_log(VM, node).read_bytes())
        except FileNotFoundError:
            continue
        if found:
            return int(found[-1])
    return None


def run(driver: Driver, spec: VMSpec, slow_quota: float, remap: bool, tau: float, timeout: float) -> dict[str, Any]:
    for node in ("a", "b"):
        driver.delete(VM, node)
        for p in (driver.console_log(VM, node),):
            p.unlink(missing_ok=True)
    driver.define(spec, "a")
    driver.boot(VM, "a")
    quota(driver, "a", slow_quota)
    started = time.monotonic()
    farm = {
        "slow": SubCluster("slow", 1, 1, 4096, 3.0 * slow_quota, cycles={CYCLES: 1.0}),
        "fast": SubCluster("fast", 1, 1, 4096, 3.0, cycles={CYCLES: 1.0}),
    }
    params = RemapParams(tau_s=tau, beta=20, threshold_s=1.0)
    prof = Profiler(driver.connection("a"))
    node, moved_at, decisions = "a", None, []
    last = prof.sample([VM])[VM]
    while result(driver) is None:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"no RESULT within {timeout:.0f} s")
        time.sleep(0.5)
        if not remap or node == "b" or time.monotonic() - last.t < tau:
            continue
        try:
            last, ds = profile_and_decide(
                prof,
                VM,
                last,
                "slow",
                farm,
                {"slow": 0, "fast": 1},
                params,
                migrate_s=migration_cost_s(spec.memory_mib, 110.0),
            )
        except (DriverError, KeyError):  # the payload ended and the guest powered off meanwhile
            continue
        decisions += [{"kind": d.kind, "reason": d.reason, "gain_s": round(d.gain_s, 1)} for d in ds]
        if ds:
            t0 = time.monotonic()
            driver.migrate(VM, "a", "b")
            node, moved_at = "b", {"after_s": round(t0 - started, 1), "migrate_s": round(time.monotonic() - t0, 2)}
    return {
        "seconds": round(time.monotonic() - started, 1),
        "result": result(driver),
        "moved": moved_at,
        "decisions": decisions,
        "profile_overhead_ms": round(1e3 * prof.overhead_s / max(1, prof.samples), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=400_000)
    parser.add_argument("--slow-quota", type=float, default=0.33)
    parser.add_argument("--tau", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-remap-live-log-")))
    second = libvirtd.start_second_node(Path("/var/tmp/vjob-nodeb"))
    files = guest.build(payload=PAYLOAD.format(n=args.iterations))
    try:
        with bench_nodes("vjob-remap-live", {"a": system.uri, "b": second.uri}, vms=[VM]) as bench:
            spec = VMSpec(
                VM, bench.image, memory_mib=128, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline
            )
            stay = run(bench.driver, spec, args.slow_quota, False, args.tau, args.timeout)
            print(f"stays on the slow node: {stay}")
            moved = run(bench.driver, spec, args.slow_quota, True, args.tau, args.timeout)
            print(f"remapped to the fast node: {moved}")
    finally:
        libvirtd.stop(second)
        libvirtd.stop(system)
    doc = {
        "bench": "remap_live",
        "iterations": args.iterations,
        "slow_quota": args.slow_quota,
        "stay_s": stay["seconds"],
        "remapped_s": moved["seconds"],
        "speedup": round(stay["seconds"] / moved["seconds"], 2),
        "same_result": stay["result"] == moved["result"] and stay["result"] is not None,
        "moved": moved["moved"],
        "decisions": moved["decisions"],
        "profile_overhead_ms": moved["profile_overhead_ms"],
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
