"""A stand-in site network for the guests' network tests (issue 33, item 3).

A network namespace `vjsite<pid>` is the site: joined to this host (the node) by a veth pair in
198.18.33.0/24 (RFC 2544's benchmarking range: nothing on this machine or its network uses it),
it runs a licence server (TCP, answers a token and the peer address it saw) and a name server
(UDP, answers `licence.site.test` with the site's address, anything else with NXDOMAIN), both
this file run as a script inside the namespace. The node runs a "node service" the guests must
not reach: a TCP listener on every address of the host (the job's gateway and the veth's among
them). `guest_ns` makes a namespace standing in for a guest: a veth with one end on a job's
bridge and the job's address and route at the other.

`operator_bridge` adds the site's own LAN for guests on an operator's bridge (`[guest] network =
"bridge"`): a bridge on the node holding the node's address there (198.18.34.1, the node's own
services listen on it too), joined by a veth to the site namespace (198.18.34.2, the LAN's
router and the way to the licence and name servers), where dnsmasq is the site's DHCP server
(leases 198.18.34.100-150, router .2, name server 198.18.33.2; no DNS of its own). `bridged_guest`
makes a guest with its job NIC on the job's bridge and its site NIC in place of the tap the node
service made on the operator's bridge (a veth of the tap's name: the rules match it by name).

Everything is removed in `stop` (processes by pid, namespaces, links); nothing here sends a
packet anywhere but into these namespaces.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field

SITE_PREFIX = "198.18.33"
HOST_IP = f"{SITE_PREFIX}.1"
SITE_IP = f"{SITE_PREFIX}.2"
LICENCE_NAME = "licence.site.test"
LICENCE_PORT = 7777
TOKEN = "licence-token-7f3a"
LAN_PREFIX = "198.18.34"
NODE_LAN_IP = f"{LAN_PREFIX}.1"
ROUTER_LAN_IP = f"{LAN_PREFIX}.2"
DHCP_RANGE = (f"{LAN_PREFIX}.100", f"{LAN_PREFIX}.150")


def _ip(*args: str, ns: str = "") -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=15)


@dataclass
class Site:
    ns: str
    host_if: str
    node_port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    node_server: socketserver.TCPServer | None = None
    guests: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    """Links of the node made here (the operator's bridge and its veth), deleted at stop."""
    lan_bridge: str = ""


class _NodeHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"node-service-secret\n")


def start() -> Site:
    """The site namespace, its two servers and the node's listener."""
    tag = str(os.getpid())
    site = Site(ns=f"vjsite{tag}", host_if=f"vjsh{tag}", node_port=0)
    try:
        subprocess.run(["ip", "netns", "add", site.ns], check=True, capture_output=True, timeout=15)
        _ip("link", "add", site.host_if, "type", "veth", "peer", "name", "site0", "netns", site.ns)
        _ip("addr", "add", f"{HOST_IP}/24", "dev", site.host_if)
        _ip("link", "set", site.host_if, "up")
        _ip("addr", "add", f"{SITE_IP}/24", "dev", "site0", ns=site.ns)
        _ip("link", "set", "site0", "up", ns=site.ns)
        _ip("link", "set", "lo", "up", ns=site.ns)
        for role in ("licence", "dns"):
            cmd = ["ip", "netns", "exec", site.ns, sys.executable, __file__, role]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            site.procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready", f"site {role} server"
        server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), _NodeHandler)
        server.daemon_threads = True
        site.node_server = server
        site.node_port = int(server.server_address[1])
        threading.Thread(target=server.serve_forever, daemon=True).start()
    except BaseException:
        stop(site)
        raise
    return site


def stop(site: Site) -> None:
    if site.node_server is not None:
        site.node_server.shutdown()
        site.node_server.server_close()
    for proc in site.procs:
        proc.kill()
        proc.wait(10)
    for ns in [*site.guests, site.ns]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15, check=False)
    for link in [site.host_if, *site.links]:
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=15, check=False)


def operator_bridge(site: Site, lease_dir: str) -> str:
    """The operator's bridge on the node and the site's LAN behind it, with dnsmasq as the site's
    DHCP server (its lease file in `lease_dir`); returns the bridge's name."""
    tag = str(os.getpid())
    bridge, veth = f"vjbr{tag}"[:15], f"vjsb{tag}"[:15]
    site.links += [bridge, veth]
    site.lan_bridge = bridge
    _ip("link", "add", bridge, "type", "bridge", "forward_delay", "0")
    _ip("addr", "add", f"{NODE_LAN_IP}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    _ip("link", "add", veth, "type", "veth", "peer", "name", "lan0", "netns", site.ns)
    _ip("link", "set", veth, "master", bridge, "up")
    _ip("addr", "add", f"{ROUTER_LAN_IP}/24", "dev", "lan0", ns=site.ns)
    _ip("link", "set", "lan0", "up", ns=site.ns)
    dhcp = [
        *("ip", "netns", "exec", site.ns, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--port=0"),
        *("--no-resolv", "--no-hosts", "--interface=lan0", "--bind-interfaces", "--no-ping", "--pid-file="),
        f"--dhcp-range={DHCP_RANGE[0]},{DHCP_RANGE[1]},255.255.255.0,2m",
        f"--dhcp-option=3,{ROUTER_LAN_IP}",
        f"--dhcp-option=6,{SITE_IP}",
        f"--dhcp-leasefile={lease_dir}/leases",
        "--log-dhcp",
        "--log-facility=-",
    ]
    proc = subprocess.Popen(dhcp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    site.procs.append(proc)
    assert proc.stderr is not None
    for _ in range(50):  # its first lines: started, DHCP range (then it serves)
        line = proc.stderr.readline().decode(errors="replace")
        if "DHCP, IP range" in line or not line:
            break
    assert proc.poll() is None, "dnsmasq (the site's DHCP server) did not start: is dnsmasq-base installed?"
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never blocks on a full pipe
    return bridge


def bridged_guest(site: Site, name: str, job: tuple[str, str, str], site_tap: str, site_mac: str) -> str:
    """A guest of a job on the operator's bridge: eth0 on the job's bridge (`job` = bridge, its
    address, its gateway; no route beyond the job's /24) and eth1 with `site_mac`, a veth named
    `site_tap` in place of the node service's tap on the operator's bridge; no address on eth1 yet
    (the site's DHCP gives it: the probe `dhcp`)."""
    job_bridge, ip, _gateway = job
    ns = f"vjg{name}{os.getpid()}"[:15]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=15)
    site.guests.append(ns)
    host_end = f"vjgh{name}{os.getpid()}"[:15]
    _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_end, "master", job_bridge, "up")
    _ip("addr", "add", f"{ip}/24", "dev", "eth0", ns=ns)
    _ip("link", "set", "eth0", "up", ns=ns)
    _ip("link", "set", "lo", "up", ns=ns)
    subprocess.run(["ip", "link", "del", site_tap], capture_output=True, timeout=15, check=False)
    _ip("link", "add", site_tap, "type", "veth", "peer", "name", "eth1", "netns", ns)
    _ip("link", "set", "eth1", "address", site_mac, ns=ns)
    _ip("link", "set", site_tap, "master", site.lan_bridge, "up")
    return ns


def guest_ns(site: Site, name: str, bridge: str, ip: str, gateway: str) -> str:
    """A namespace standing in for a guest on `bridge`: `ip`/24, default route via `gateway`."""
    ns = f"vjg{name}{os.getpid()}"[:15]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=15)
    site.guests.append(ns)
    host_end = f"vjgh{name}{os.getpid()}"[:15]
    _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_end, "master", bridge, "up")
    _ip("addr", "add", f"{ip}/24", "dev", "eth0", ns=ns)
    _ip("link", "set", "eth0", "up", ns=ns)
    _ip("link", "set", "lo", "up", ns=ns)
    _ip("route", "add", "default", "via", gateway, ns=ns)
    return ns


def in_ns(ns: str, probe: str, *args: str) -> dict[str, object]:
    """Run one of PROBES in namespace `ns`; its JSON answer."""
    cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "probe", probe, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise AssertionError(f"probe {probe} {args} in {ns}: {res.stderr[-800:]}")
    return dict(json.loads(res.stdout))


# -- what runs inside the namespaces (this file as a script) ------------------------------------
def dns_query(name: str, qid: int = 0x3A7E) -> bytes:
    """A DNS query for the A record of `name` (recursion desired)."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


def dns_answer(query: bytes, names: dict[str, str]) -> bytes:
    """The answer to `query`: an A record from `names`, else NXDOMAIN (a name server that knows
    one zone; enough for a guest's resolver and Python's getaddrinfo)."""
    qid, _flags, qd = struct.unpack("!HHH", query[:6])
    pos, labels = 12, []
    while query[pos]:
        labels.append(query[pos + 1 : pos + 1 + query[pos]].decode(errors="replace"))
        pos += 1 + query[pos]
    question = query[12 : pos + 5]
    qtype = struct.unpack("!H", query[pos + 1 : pos + 3])[0]
    ip = names.get(".".join(labels).lower())
    if ip is None or qd != 1:
        return struct.pack("!HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question
    if qtype != 1:  # AAAA and the like: the name exists, no such record
        return struct.pack("!HHHHHH", qid, 0x8180, 1, 0, 0, 0) + question
    record = struct.pack("!HHHLH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(ip)
    return struct.pack("!HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + record


def _serve_dns() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((SITE_IP, 53))
    print("ready", flush=True)
    while True:
        data, peer = sock.recvfrom(512)
        try:
            sock.sendto(dns_answer(data, {LICENCE_NAME: SITE_IP}), peer)
        except (IndexError, struct.error, UnicodeDecodeError):
            continue


class _LicenceHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        host, port = self.client_address[:2]
        self.request.sendall(f"{TOKEN} {host} {port}\n".encode())


def _serve_licence() -> None:
    server = socketserver.ThreadingTCPServer((SITE_IP, LICENCE_PORT), _LicenceHandler)
    print("ready", flush=True)
    server.serve_forever()


def _dhcp(iface: str, mac: str, etc: str) -> dict[str, object]:
    """The guest agent's own DHCP client (provisioning.guest_agent.site_net) on `iface`."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from pathlib import Path

    from provisioning.guest_agent import site_net

    said = site_net.bring_up(site_net.Bridged(mac, []), iface, Path(etc), wait_s=20)
    lease = site_net.obtain(iface, mac)  # the same address for the same MAC, and renewed in place
    renewed = site_net.renew(iface, mac, lease) if lease is not None else None
    resolv = Path(etc, "resolv.conf").read_text() if Path(etc, "resolv.conf").exists() else ""
    return {"said": said, "resolv": resolv, "again": lease and lease.ip, "renewed": renewed and renewed.ip}


def _probe(kind: str, args: list[str]) -> dict[str, object]:
    """connect HOST PORT [SRC_IP [SRC_PORT]] | resolve SERVER NAME | dhcp IFACE MAC ETC_DIR."""
    if kind == "dhcp":
        return _dhcp(*args)
    if kind == "connect":
        host, port = args[0], int(args[1])
        try:
            with socket.socket() as s:
                s.settimeout(3)
                if len(args) > 2:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((args[2], int(args[3]) if len(args) > 3 else 0))
                s.connect((host, port))
                return {"ok": True, "data": s.recv(200).decode(errors="replace").strip()}
        except OSError as exc:
            return {"ok": False, "error": type(exc).__name__}
    server, name = args
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        try:
            s.sendto(dns_query(name), (server, 53))
            answer = s.recv(512)
        except OSError as exc:
            return {"ok": False, "error": type(exc).__name__}
    rcode = answer[3] & 0xF
    ip = socket.inet_ntoa(answer[-4:]) if rcode == 0 and struct.unpack("!H", answer[6:8])[0] else ""
    return {"ok": rcode == 0 and bool(ip), "ip": ip, "rcode": rcode}


if __name__ == "__main__":
    if sys.argv[1] == "dns":
        _serve_dns()
    elif sys.argv[1] == "licence":
        _serve_licence()
    else:
        print(json.dumps(_probe(sys.argv[2], sys.argv[3:])))
