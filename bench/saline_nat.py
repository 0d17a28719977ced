"""A Saline VM reaching the outside through its NAT interface, before and after a resume elsewhere.

Root only (root's libvirt; a second libvirtd of our own acts as the other site's node). One VM
of a vjob on the real `debian12` image, `[saline] nat_network` set: the manager defines the
NAT network on the node (provisioning.nat: gateway 100.64.0.1 and its MAC pinned, no DHCP),
the VM's second NIC is on it, and the guest agent sets the static address from
subnetID/vmID, the default route and resolv.conf from job.json. "The outside" is a network
namespace of this bench behind a veth (198.51.100.2, a TCP server that answers with the peer
address it sees): the guest's connection leaves through the node's masquerade, so the
answer shows the node's address, not the guest's — NAT, for real.

COMMAND connects to the outside every second and prints the answer. The manager's own code
drives the life, as bench/saline_network.py does: deploy at node na, OAR's warning with no
site to migrate to (one cut into site a's repository, node freed), resume at node nb on the
other libvirtd. Both libvirtds share this machine's network stack, so na's NAT network is
taken down before nb defines its own (two hosts would each have theirs): the guest comes back
with the same address, route and gateway (address and MAC) and goes on without being told.

Figures: boot → first answer, the cut, restore → first answer at nb, the counter across the
move, the source address the outside saw, the NICs at na and nb. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from devkit.saline_bench import (
    USER,
    SecondNode,
    evacuate_keeping_output,
    leased_job,
    numbered_lines,
    require_root,
    saline_bench,
    wait_for,
)
from plugins.oar.parse import OarJob
from provisioning.driver import Driver
from saline_bew import deployment, identity, journal
from saline_bew.manager import Manager
from saline_bew.vms import SalineVMs, nat_network
from vjob import progress

NAT_NAME = "vjnatbench"
OUTSIDE_NS = "vjnat-outside"
HOST_SIDE, OUTSIDE = "198.51.100.1", "198.51.100.2"
PORT = 18081
PROBE = (
    "import socket\n"
    "try:\n"
    f"    s = socket.create_connection(('{OUTSIDE}', {PORT}), timeout=3); print(s.recv(200).decode().strip())\n"
    "except OSError as e:\n"
    "    print('FAILED', type(e).__name__)\n"
)
COMMAND = [
    "sh",
    "-c",
    'grep -c . /etc/resolv.conf; awk \'$2=="00000000"{print "DEFAULT", $1, $3}\' /proc/net/route; '
    f'i=0; while true; do i=$((i+1)); echo "OUT $i $(date +%s) $(python3 -c "{PROBE}")"; sleep 1; done',
]
SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('{OUTSIDE}', {PORT})); s.listen(16)\n"
    "while True:\n"
    "    c, peer = s.accept(); c.sendall(f'PONG from {peer[0]}\\n'.encode()); c.close()\n"
)
LINE = re.compile(r"OUT (\d+) (\d+) (.*)")


def answers(log: Path) -> list[tuple[int, str]]:
    return numbered_lines(log, LINE)


def pongs(seen: list[tuple[int, str]], after: int) -> int:
    """Answers from the outside among the probes numbered above `after`."""
    return sum(n > after and a.startswith("PONG") for n, a in seen)


def wait_answers(log: Path, predicate: Any, timeout_s: float, what: str) -> float:
    return wait_for(lambda: predicate(answers(log)), timeout_s, f"{what} ({log})")


def nics(driver: Driver, vm: str, node: str) -> list[tuple[str, str, str]]:
    root = ET.fromstring(driver.connection(node).lookupByName(vm).XMLDesc(0))
    out = []
    for nic in root.findall("./devices/interface"):
        kind = nic.get("type") or ""
        out.append((nic.find("mac").get("address") or "", kind, nic.find("source").get(kind) or ""))  # type: ignore[union-attr]
    return out


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=30)


def outside_up() -> subprocess.Popen[bytes]:
    """The outside: a namespace behind a veth, its route back to the NAT range only via the
    node (so an answer reaches a guest only through the node's masquerade)."""
    _ip("netns", "add", OUTSIDE_NS)
    _ip("link", "add", "vjnat-o0", "type", "veth", "peer", "name", "vjnat-o1", "netns", OUTSIDE_NS)
    _ip("addr", "add", f"{HOST_SIDE}/24", "dev", "vjnat-o0")
    _ip("link", "set", "vjnat-o0", "up")
    for cmd in (
        ["addr", "add", f"{OUTSIDE}/24", "dev", "vjnat-o1"],
        ["link", "set", "vjnat-o1", "up"],
        ["link", "set", "lo", "up"],
    ):
        _ip("netns", "exec", OUTSIDE_NS, "ip", *cmd)
    server = subprocess.Popen(["ip", "netns", "exec", OUTSIDE_NS, sys.executable, "-I", "-c", SERVER])
    time.sleep(1)
    return server


def outside_down(server: subprocess.Popen[bytes] | None) -> None:
    if server is not None:
        server.kill()
        server.wait(timeout=10)
    subprocess.run(["ip", "link", "del", "vjnat-o0"], check=False, timeout=30)
    subprocess.run(["ip", "netns", "del", OUTSIDE_NS], check=False, timeout=30)


def nat_off(driver: Driver, node: str) -> None:
    """Destroy and undefine the bench's NAT network on `node` (it is this bench's own)."""
    conn = driver.connection(node)
    try:
        net = conn.networkLookupByName(NAT_NAME)
    except Exception:  # noqa: BLE001 - not there
        return
    if net.isActive():
        net.destroy()
    net.undefine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boot-timeout", type=float, default=600.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    require_root("root's libvirt, a second libvirtd, a network namespace")
    figures: dict[str, Any] = {"bench": "saline_nat", "image": "debian12", "vms": 1, "load": os.getloadavg()[0]}
    saline = {"nat_network": NAT_NAME, "nat_dns": ["192.0.2.53"]}  # no dnsmasq on this machine: libvirt runs no DNS
    server = None
    try:
        server = outside_up()
        with (
            progress.Progress(4, "saline NAT bench") as bar,
            saline_bench(
                "saline-nat",
                bar,
                figures,
                second=SecondNode("natb", (49360, 49380)),
                saline=saline,
                vms=lambda driver, store, cfg: SalineVMs(driver, store, nat_network=nat_network(cfg.saline)),
                keep=args.keep,
            ) as b,
        ):
            for lib in b.lib_dirs:  # libvirt keeps each network's MAC list here;
                (lib / "dnsmasq").mkdir(mode=0o755, exist_ok=True)  # dnsmasq's package makes it, absent here
            try:
                figures.update(run(b.manager, b.driver, args, bar))
            finally:
                for node in ("na", "nb"):
                    nat_off(b.driver, node)
    finally:
        outside_down(server)
    print(json.dumps(figures))


def run(manager: Manager, driver: Driver, args: argparse.Namespace, bar: progress.Progress) -> dict[str, Any]:
    store = manager.ports.store
    job = leased_job(manager, "be5a11e0a7a1", COMMAND, vm_count=1, memory_mb=384)
    (ident,) = identity.assign(
        store, site="a", job_key=job.key, vm_names=job.vm_names, mac_prefix="52:54:00", network="10.0.0.0/8"
    )
    assert manager.ports.vms.nat is not None
    nat_ip = str(manager.ports.vms.nat.address(ident.subnet_id, ident.vm_id))
    vm = job.vm_names[0]
    job = journal.record(store, job.key, "submitted", oar_job_id="1")
    out: dict[str, Any] = {"nat_ip": nat_ip, "gateway": str(manager.ports.vms.nat.gateway)}
    try:
        bar.relabel(f"deploy at node na, NAT address {nat_ip}")
        t0 = time.monotonic()
        deployment.deploy(manager.ports, job, OarJob(id="1", state="Running", user=USER, hosts=("na",)))
        log_a = driver.output_logs(vm, "na")[0]
        wait_answers(log_a, lambda ex: pongs(ex, 0) >= 1, args.boot_timeout, "first answer from the outside at na")
        out["boot_to_first_answer_s"] = round(time.monotonic() - t0, 1)
        wait_answers(log_a, lambda ex: pongs(ex, 0) >= 3, 120, "three answers at na")
        text = log_a.read_text(errors="replace")
        route = re.search(r"DEFAULT (\S+) (\S+)", text)
        out["guest_default_route"] = [route.group(1), route.group(2)] if route else None
        out["nics_at_a"] = nics(driver, vm, "na")
        bar.advance()
        bar.relabel("OAR's warning, no site with room: one cut into site a's repository")
        kept, took = evacuate_keeping_output(manager, job.key, log_a)
        out["warning_to_node_freed_s"] = round(took, 1)
        before = answers(kept)
        out["last_before"] = before[-1][0]
        out["answers_at_a"] = sorted({a for _, a in before})
        nat_off(driver, "na")  # na is another host: its NAT network is not in nb's way
        bar.advance()
        bar.relabel("resume at node nb (the other libvirtd), its own NAT network")
        journal.record(store, job.key, "test", oar_job_id="2", site="b")
        t1 = time.monotonic()
        running_at_b = OarJob(id="2", state="Running", user=USER, hosts=("nb",))
        deployment.deploy(manager.ports, journal.get(store, job.key), running_at_b)
        out["restore_to_running_s"] = journal.events(store, job.key)[-1].detail.get("restore_to_running_s")
        log_b = driver.output_logs(vm, "nb")[0]
        last = out["last_before"]
        wait_answers(log_b, lambda ex: pongs(ex, last) >= 1, 120, "an answer after the resume at nb")
        out["resume_to_answer_s"] = round(time.monotonic() - t1, 1)
        wait_answers(log_b, lambda ex: pongs(ex, last) >= 3, 120, "three answers at nb")
        after = answers(log_b)
        out["first_after"] = min(n for n, _ in after)
        out["answers_at_b"] = sorted({a for _, a in after})
        out["failed_after"] = sum(not a.startswith("PONG") for _, a in after)
        out["nics_at_b"] = nics(driver, vm, "nb")
        out["same_nics"] = out["nics_at_a"] == out["nics_at_b"]
        out["counter_continues"] = out["first_after"] == last + 1
        masqueraded = f"PONG from {HOST_SIDE}"
        out["ok"] = bool(
            out["same_nics"]
            and out["counter_continues"]
            and out["answers_at_b"] == [masqueraded]
            and masqueraded in out["answers_at_a"]
            and len(out["nics_at_b"]) == 2
        )
        bar.advance()
    finally:
        for node in ("na", "nb"):
            driver.delete(vm, node)
            manager.ports.vms.network_down(ident.subnet_id, [node])
    return out


if __name__ == "__main__":
    main()
