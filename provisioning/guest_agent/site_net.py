"""The guest's way to the site network: job.json's `network.site`, checked.

With `[guest] network = "nat"` (and "none"), the job network's own NIC: the node service puts the node's address,
the gateway G (10.hi.lo.254, provisioning.network.gateway_address), on the job's bridge, the
same on every node; a VM's address on the job network (10.hi.lo.vmID) then needs only a default
route via G and a resolv.conf to reach the site through the node's NAT. A one-node job gets
that NIC too (vmID 1); a multi-node job's VMs keep their private network on it.

The agent applies it with its NAT interface's code (agent.setup_nat): the NIC's static address,
the default route via G, resolv.conf. A guest resumed or migrated to another node keeps all of
it: the same gateway address and MAC answer there.

With `[guest] network = "bridge"`, `network.site.bridged` names a second NIC, on the operator's
bridge: this module asks the site's DHCP server for its address, default route and name
servers and keeps the lease (bring_up); the job NIC keeps its static address without a route.

Standard library only (installed under /usr/lib/vjob-guest, imported by the agent).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MAX_DNS = 3


class SiteError(Exception):
    """`network.site` is unusable; the message names the field."""


def _ipv4(field: str, value: object) -> str:
    try:
        return str(ipaddress.IPv4Address(value if isinstance(value, str) else ""))
    except ValueError:
        raise SiteError(f"network.site.{field}: {str(value)[:40]!r}: must be an IPv4 address") from None


def parse_site(data: object, mac: str, ip: str, prefix: int) -> dict[str, object]:
    """The fields of the agent's `Nat` for the job NIC (`mac`, `ip`/`prefix`): its gateway,
    another address of the NIC's own network, and 0..3 name servers (none: the node had no
    usable resolver and the operator set no `[guest] dns`; names then do not resolve)."""
    if not isinstance(data, dict):
        raise SiteError("network.site: must be an object")
    gateway = _ipv4("gateway", data.get("gateway"))
    own = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if ipaddress.IPv4Address(gateway) not in own or gateway == ip:
        raise SiteError(f"network.site.gateway: {gateway}: must be another address of {own}")
    dns = data.get("dns", [])
    if not isinstance(dns, list) or len(dns) > MAX_DNS:
        raise SiteError(f"network.site.dns: must be a list of at most {MAX_DNS} IPv4 addresses")
    return {"mac": mac, "ip": ip, "prefix": prefix, "gateway": gateway, "dns": [_ipv4("dns", d) for d in dns]}


# -- the operator's bridge ([guest] network = "bridge"): a second NIC, configured by the site's DHCP
# Why a DHCP client of its own: the image has no iproute2 and no DHCP client (minbase), and the
# lease must be kept for as long as the job runs (renewed at T1, at most every RENEW_MAX_S: a
# checkpoint's pause is not seen by the guest's clock). The NIC's MAC is fixed per VM by the node
# (provisioning.node_service.site_bridge.site_mac), so the site's server hands the same address
# again after a restore or a move; after a refusal (NAK) the NIC gets whatever a new DISCOVER brings.


MAC_RE = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}")
COOKIE = b"\x63\x82\x53\x63"
DISCOVER, OFFER, REQUEST, ACK, NAK = 1, 2, 3, 5, 6
CLIENT_PORT, SERVER_PORT = 68, 67
ANSWER_WAIT_S = 4.0
FIRST_LEASE_S = 60.0
"""How long the agent waits for a first lease before the job starts without one (the renewal
thread keeps asking)."""
RENEW_MAX_S = 300.0
RETRY_S = 15.0


@dataclass(frozen=True)
class Bridged:
    """job.json `network.site.bridged`: the site NIC's MAC and name servers the operator set
    (`[guest] dns`; empty: the DHCP server's)."""

    mac: str
    dns: list[str]


@dataclass(frozen=True)
class Lease:
    ip: str
    prefix: int
    router: str
    dns: list[str]
    server: str
    lease_s: int
    t1_s: int


def parse_bridged(data: object, job_mac: str) -> Bridged:
    """`network.site` of a guest on the operator's bridge, checked."""
    raw = data.get("bridged") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise SiteError("network.site.bridged: must be an object")
    mac = raw.get("mac")
    if not isinstance(mac, str) or not MAC_RE.fullmatch(mac) or mac == job_mac:
        raise SiteError(f"network.site.bridged.mac: {str(mac)[:40]!r}: must match {MAC_RE.pattern}, not network.mac")
    dns = raw.get("dns", [])
    if not isinstance(dns, list) or len(dns) > MAX_DNS:
        raise SiteError(f"network.site.bridged.dns: must be a list of at most {MAX_DNS} IPv4 addresses")
    return Bridged(mac, [_ipv4("bridged.dns", d) for d in dns])


def message(kind: int, xid: int, mac: str, *, requested: str = "", server: str = "", ciaddr: str = "") -> bytes:
    """A BOOTREQUEST of DHCP message type `kind`, asking for the broadcast flag (no address yet to
    receive a unicast on) unless renewing (`ciaddr`)."""
    flags = 0 if ciaddr else 0x8000
    head = struct.pack("!BBBBIHH", 1, 1, 6, 0, xid, 0, flags)
    addrs = socket.inet_aton(ciaddr or "0.0.0.0") + b"\0" * 12
    chaddr = bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0")
    opts = bytes([53, 1, kind, 55, 5, 1, 3, 6, 51, 58])
    if requested:
        opts += bytes([50, 4]) + socket.inet_aton(requested)
    if server:
        opts += bytes([54, 4]) + socket.inet_aton(server)
    return head + addrs + chaddr + b"\0" * 192 + COOKIE + opts + b"\xff"


def parse_reply(data: bytes, xid: int, mac: str) -> tuple[int, Lease] | None:
    """(message type, lease) of a server's answer to transaction `xid` for `mac`; None for
    anything else (another client's answer, garbage: the network is the site's)."""
    if len(data) < 240 or data[0] != 2 or data[236:240] != COOKIE:
        return None
    if struct.unpack("!I", data[4:8])[0] != xid or data[28:34] != bytes.fromhex(mac.replace(":", "")):
        return None
    opts: dict[int, bytes] = {}
    pos = 240
    while pos < len(data) and data[pos] != 255:
        if data[pos] == 0:
            pos += 1
            continue
        if pos + 1 >= len(data) or pos + 2 + data[pos + 1] > len(data):  # an option past the end
            return None
        size = data[pos + 1]
        opts.setdefault(data[pos], data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    kind = opts.get(53, b"\0")[0]
    mask = opts.get(1, b"")
    prefix = bin(struct.unpack("!I", mask)[0]).count("1") if len(mask) == 4 else 24
    router = socket.inet_ntoa(opts[3][:4]) if len(opts.get(3, b"")) >= 4 else ""
    dns = [socket.inet_ntoa(opts[6][i : i + 4]) for i in range(0, min(len(opts.get(6, b"")), 4 * MAX_DNS), 4)]
    server = socket.inet_ntoa(opts[54][:4]) if len(opts.get(54, b"")) >= 4 else ""
    lease_s = struct.unpack("!I", opts[51][:4])[0] if len(opts.get(51, b"")) >= 4 else 3600
    t1 = struct.unpack("!I", opts[58][:4])[0] if len(opts.get(58, b"")) >= 4 else lease_s // 2
    ip = socket.inet_ntoa(data[16:20])
    if not 8 <= prefix <= 30:
        return None
    return kind, Lease(ip, prefix, router, [d for d in dns if len(d.split(".")) == 4], server, lease_s, t1)


def _socket(iface: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    sock.bind(("", CLIENT_PORT))
    return sock


def _ask(
    sock: socket.socket, packet: bytes, xid: int, mac: str, want: tuple[int, ...], to: str
) -> tuple[int, Lease] | None:
    sock.sendto(packet, (to, SERVER_PORT))
    deadline = time.monotonic() + ANSWER_WAIT_S
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(2048)
        except TimeoutError:
            return None
        got = parse_reply(data, xid, mac)
        if got is not None and got[0] in want:
            return got
    return None


def obtain(iface: str, mac: str) -> Lease | None:
    """DISCOVER, OFFER, REQUEST, ACK on `iface` (up, no address yet); None when no server answered."""
    xid = int.from_bytes(os.urandom(4), "big")
    with _socket(iface) as sock:
        offer = _ask(sock, message(DISCOVER, xid, mac), xid, mac, (OFFER,), "255.255.255.255")
        if offer is None:
            return None
        req = message(REQUEST, xid, mac, requested=offer[1].ip, server=offer[1].server)
        got = _ask(sock, req, xid, mac, (ACK, NAK), "255.255.255.255")
    return got[1] if got is not None and got[0] == ACK else None


def renew(iface: str, mac: str, lease: Lease) -> Lease | None:
    """A unicast REQUEST for the address held; the new lease, or None after a NAK (start over)
    and the old one when the server did not answer (tried again later)."""
    xid = int.from_bytes(os.urandom(4), "big")
    with _socket(iface) as sock:
        got = _ask(
            sock, message(REQUEST, xid, mac, ciaddr=lease.ip), xid, mac, (ACK, NAK), lease.server or "255.255.255.255"
        )
    if got is None:
        return lease
    return got[1] if got[0] == ACK else None


# -- applying a lease (ioctl: the image has no iproute2) -------------------------------------------
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _SIOCSIFADDR, _SIOCSIFNETMASK, _SIOCADDRT = 0x8913, 0x8914, 0x8916, 0x891C, 0x890B
_RTENTRY = "@L16s16s16sHhLPhPLLH0L"


def _ifreq(name: str, tail: bytes = b"") -> bytes:
    return struct.pack("16s", name.encode()) + tail.ljust(24, b"\0")


def _sockaddr(ip: str) -> bytes:
    return struct.pack("HH4s", socket.AF_INET, 0, socket.inet_aton(ip))


def link_up(iface: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, _ifreq(iface))[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, _ifreq(iface, struct.pack("H", flags | 1)))


def apply(iface: str, lease: Lease, dns: list[str], etc: Path) -> None:
    """The lease's address, default route and name servers (`dns`, the operator's, win)."""
    mask = str(ipaddress.IPv4Network(f"0.0.0.0/{lease.prefix}").netmask)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, _SIOCSIFADDR, _ifreq(iface, _sockaddr(lease.ip)))
        fcntl.ioctl(sock, _SIOCSIFNETMASK, _ifreq(iface, _sockaddr(mask)))
        own = ipaddress.IPv4Network(f"{lease.ip}/{lease.prefix}", strict=False)
        if lease.router and ipaddress.IPv4Address(lease.router) in own:
            anywhere = _sockaddr("0.0.0.0").ljust(16, b"\0")
            route = struct.pack(
                _RTENTRY, 0, anywhere, _sockaddr(lease.router).ljust(16, b"\0"), anywhere, 0x3, *[0] * 8
            )
            with contextlib.suppress(FileExistsError):  # the same default route again (a renewal)
                fcntl.ioctl(sock, _SIOCADDRT, route)
    resolv = etc / "resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text("".join(f"nameserver {ip}\n" for ip in (dns or lease.dns)))


def bring_up(bridged: Bridged, iface: str, etc: Path = Path("/etc"), wait_s: float = FIRST_LEASE_S) -> str:
    """The site NIC up and configured by DHCP (waiting at most `wait_s` for a first lease), and a
    thread keeping the lease; returns what the agent says on the console."""
    link_up(iface)
    deadline = time.monotonic() + wait_s
    lease = obtain(iface, bridged.mac)
    while lease is None and time.monotonic() < deadline:
        time.sleep(1)
        lease = obtain(iface, bridged.mac)
    if lease is not None:
        apply(iface, lease, bridged.dns, etc)
    threading.Thread(target=_keep, args=(bridged, iface, lease, etc), daemon=True, name="dhcp").start()
    if lease is None:
        return f"site NIC {iface}: no DHCP answer within {wait_s:.0f} s; still asking"
    via = lease.router or "-"
    return f"site NIC {iface} {lease.ip}/{lease.prefix} via {via} (DHCP {lease.server}, {lease.lease_s} s)"


def _shape(lease: Lease) -> tuple[object, ...]:
    return (lease.ip, lease.prefix, lease.router, lease.dns)


def _keep(bridged: Bridged, iface: str, lease: Lease | None, etc: Path) -> None:
    """Renew at T1 (at most every RENEW_MAX_S), start over after a NAK, keep asking without one."""
    while True:
        time.sleep(RETRY_S if lease is None else max(5.0, min(float(lease.t1_s), RENEW_MAX_S)))
        try:
            fresh = renew(iface, bridged.mac, lease) if lease is not None else None
            if fresh is None:  # refused (NAK) or never had one: start over
                fresh = obtain(iface, bridged.mac)
            if fresh is not None and (lease is None or _shape(fresh) != _shape(lease)):
                apply(iface, fresh, bridged.dns, etc)  # only a change: setting the address drops its routes
            lease = fresh  # None: asked again every RETRY_S, the NIC keeping its last address meanwhile
        except OSError:
            continue
