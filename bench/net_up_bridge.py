"""net.up and net.down with guests on an operator's bridge against NAT, in the same run.

    .venv/bin/python bench/net_up_bridge.py [--runs 5]   # as root

Prints one JSON line. Makes a scratch Linux bridge standing in for the operator's (no address,
no port: nothing is sent anywhere), then times the node service's own operations (the request
checked by the protocol, the operation run in this process, as the service runs it) for a job of
1 and of 8 VMs, `[guest] network = "nat"` and `"bridge"` alternately, medians of `--runs`; the
bridge mode adds one tap per VM on the operator's bridge and the job's nftables bridge table.
Fields: `<mode>_<vms>vm_up_ms`, `..._down_ms`, and the ratios bridge / nat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioning.node_service import net_rules, network_ops, protocol, site
from provisioning.node_service.grant import Grant
from vjob.config.composed import parse

JOB = "940077"
BRIDGE = f"vjbench{os.getpid()}"[:15]


def _call(op: str, nodes: tuple[str, ...], **fields: int) -> None:
    grant = Grant("slurm", JOB, 65534, 65534, "nobody", nodes[0], nodes, 2, 512)
    req = protocol.check({"op": op, "job": JOB, "node": nodes[0], **fields}, network_ops.OPERATIONS)
    network_ops.OPERATIONS[op].run(grant, req.fields)


def measure(runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for vms in (1, 8):
        nodes = tuple(f"n{i}" for i in range(1, vms + 1))
        times: dict[str, tuple[list[float], list[float]]] = {"nat": ([], []), "bridge": ([], [])}
        for _ in range(runs):
            for mode in ("nat", "bridge"):  # alternately: the machine's load falls on both
                extra = {"bridge": BRIDGE} if mode == "bridge" else {}
                site.install(parse({"guest": {"network": mode, **extra}}))
                t0 = time.perf_counter()
                _call("net.up", nodes, vms=vms, first_vm_id=1)
                t1 = time.perf_counter()
                _call("net.down", nodes)
                times[mode][0].append((t1 - t0) * 1000)
                times[mode][1].append((time.perf_counter() - t1) * 1000)
        for mode, (ups, downs) in times.items():
            out[f"{mode}_{vms}vm_up_ms"] = round(statistics.median(ups), 1)
            out[f"{mode}_{vms}vm_down_ms"] = round(statistics.median(downs), 1)
        out[f"up_ratio_{vms}vm"] = round(out[f"bridge_{vms}vm_up_ms"] / out[f"nat_{vms}vm_up_ms"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/net_up_bridge.py: run as root (it makes bridges, taps and firewall rules)", file=sys.stderr)
        return 2
    network_ops.STATE_DIR = Path(tempfile.mkdtemp(prefix="vjob-bench-net-"))
    subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True, timeout=15)
    try:
        result = measure(args.runs)
    finally:
        network_ops.teardown(net_rules.job_net("slurm", JOB))
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, timeout=15)
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    print(json.dumps({"bench": "net_up_bridge", "runs": args.runs, **result, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
