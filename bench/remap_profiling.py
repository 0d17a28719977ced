"""Benchmark: the cost of ARRIVE-F's online profiling on a real QEMU guest (libvirt domain stats).

Boots the counter guest (128 MiB) on qemu:///system, turns on the statistics the host offers,
samples it every --interval seconds for --seconds, and reports the host time one sample costs
and its share of a profiling window τ (the paper's goal: about 3 % of the job's time). The last
line is one JSON object: {"bench": "remap_profiling", "sample_ms", "share_of_tau_pct", ...}.

    .venv/bin/python bench/remap_profiling.py [--uri qemu:///system] [--seconds 20] [--interval 1]
"""

from __future__ import annotations

import argparse
import json
import time

from devkit.bench_nodes import bench_nodes
from devkit.guest_probe import wait_for_counter
from provisioning import guest
from provisioning.driver import VMSpec
from provisioning.profiling import Profiler, window

VM = "vjob-bench-profiling"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", default="qemu:///system")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--tau", type=float, default=50.0)
    args = parser.parse_args()

    files = guest.build()
    with bench_nodes("vjob-bench-prof", {"a": args.uri}, vms=[VM]) as bench:
        driver = bench.driver
        spec = VMSpec(VM, bench.image, memory_mib=128, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline)
        driver.delete(VM, "a")
        driver.define(spec, "a")
        driver.boot(VM, "a")
        wait_for_counter(driver.console_log(VM, "a"), 2, 120)
        prof = Profiler(driver.connection("a"))
        events = prof.enable(VM)
        first = prof.sample([VM])[VM]
        prof.overhead_s, prof.samples = 0.0, 0
        cpu0 = time.process_time()
        end = time.monotonic() + args.seconds
        last = first
        while time.monotonic() < end:
            time.sleep(args.interval)
            last = prof.sample([VM])[VM]
        cpu = time.process_time() - cpu0
        w = window(first, last)
    sample_ms = prof.overhead_s / prof.samples * 1e3
    doc = {
        "bench": "remap_profiling",
        "uri": args.uri,
        "samples": prof.samples,
        "sample_ms": round(sample_ms, 3),
        "profiler_cpu_ms_per_sample": round(cpu / prof.samples * 1e3, 3),
        "share_of_tau_pct": round(100 * (prof.overhead_s / prof.samples) / args.tau, 5),
        "share_at_interval_pct": round(100 * (prof.overhead_s / prof.samples) / args.interval, 4),
        "perf_events": events,
        "guest_cpu_share": round(w.cpu_share, 3),
        "guest_net_packets": w.net_packets,
        "guest_swap_in_pages_s": w.swap_in_pages_s,
        "perf_counts": dict(w.perf),
    }
    print(f"{prof.samples} samples of {VM}: {sample_ms:.2f} ms each; perf events {events or 'none offered'}")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
