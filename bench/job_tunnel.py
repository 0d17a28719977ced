"""A job's network over the wire: net.up's cost with the tunnel, and TCP throughput between two
guests of one job on two hosts through it against the same two hosts over the bare underlay.

    .venv/bin/python bench/job_tunnel.py [--runs 5] [--mtu 1500] [--mb 64]   # as root

Prints one JSON line. The hosts and guests are network namespaces (devkit/vxlan_hosts.py: an
underlay bridge, hosts at 198.18.40.x, nothing leaves them). net.up is the node service's own
operation run in host a's namespace (its time inside the process, the Python start not counted):
a job spanning hosts a and b (bridge, tap, firewall, VXLAN, its two nftables tables, a flood
entry) and a job with both nodes on host a (no tunnel), alternately, fresh each run (net.down in
between), medians. Throughput: `--mb` MB of seeded bytes over one TCP connection (size-checked;
the receiver does not hash, so Python is not the bound), guest of host a → guest of host b through
the job's tunnel, and host a → host b on the underlay, alternately, medians; `--mtu` is the
underlay's (1500: the tunnel's 1500-byte frames do not fit, so the kernel's path-MTU answer brings
the guests' TCP to 1450-byte packets; 9000: no such cost, and the bare underlay uses 9000 too).
The ratios are what to compare between machines; on one machine's namespaces the "wire" is memory
and both figures are bound by the CPU (VXLAN's encapsulation is paid in the same kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from devkit import vxlan_hosts as vh

SPANNING = {"n1": "a", "n2": "b"}
LOCAL = {"n1": "a", "n3": "a"}


def _net_up_ms(topo: vh.Topology, runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"tunnel": [], "local": []}
    for i in range(runs):
        for kind, nodes in (("tunnel", SPANNING), ("local", LOCAL)):
            job = str(6100 + 2 * i + (kind == "local"))
            times[kind].append(vh.net_op(topo, "a", "net.up", job, "n1", nodes, vms=1, first_vm_id=1)["ms"])
            vh.net_op(topo, "a", "net.down", job, "n1", nodes)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def _throughput(topo: vh.Topology, runs: int, size: int) -> dict[str, float]:
    a = vh.net_op(topo, "a", "net.up", "6001", "n1", SPANNING, vms=1, first_vm_id=1)["answer"]
    b = vh.net_op(topo, "b", "net.up", "6001", "n2", SPANNING, vms=1, first_vm_id=2)["answer"]
    ga = vh.guest(topo, "a", "ta", a["vms"][0], a["bridge"], a["gateway"])
    gb = vh.guest(topo, "b", "tb", b["vms"][0], b["bridge"], b["gateway"])
    guest_ip, host_ip = b["vms"][0]["ip"], vh.HOSTS["b"]
    servers = [
        vh.background(topo, gb, "serve", guest_ip, "5301", "no"),
        vh.background(topo, topo.hosts["b"], "serve", host_ip, "5302", "no"),
    ]
    rates: dict[str, list[float]] = {"tunnel": [], "underlay": []}
    for i in range(runs):
        for kind, src, ip, port in (("tunnel", ga, guest_ip, "5301"), ("underlay", topo.hosts["a"], host_ip, "5302")):
            sent = vh.probe(src, "send", ip, port, str(size), str(i))
            if not sent["ok"]:
                raise SystemExit(f"{kind}: the transfer failed: {sent}")
            rates[kind].append(sent["mb_s"])
    for server in servers:
        vh.finish(server)
    route = subprocess.run(["ip", "-n", ga, "route", "get", guest_ip], capture_output=True, text=True, timeout=15)
    out = {f"{k}_mb_s": round(statistics.median(v), 1) for k, v in rates.items()}
    out["guest_path_mtu"] = int(route.stdout.split(" mtu ")[1].split()[0]) if " mtu " in route.stdout else 1500
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mtu", type=int, default=1500, help="the underlay's MTU")
    parser.add_argument("--mb", type=int, default=64, help="MB per transfer")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/job_tunnel.py makes network namespaces: run it as root")
    topo = vh.start(Path(tempfile.mkdtemp(prefix="vjob-tunnel-")), mtu=args.mtu)
    try:
        up = _net_up_ms(topo, args.runs)
        rates = _throughput(topo, args.runs, args.mb * 1_000_000)
    finally:
        vh.stop(topo)
    figure = {
        "figure": "job_tunnel",
        "underlay_mtu": args.mtu,
        "runs": args.runs,
        "net_up_tunnel_ms": up["tunnel"],
        "net_up_one_host_ms": up["local"],
        "net_up_ratio": round(up["tunnel"] / up["local"], 2),
        **rates,
        "throughput_ratio": round(rates["tunnel_mb_s"] / rates["underlay_mb_s"], 2),
        "load": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
