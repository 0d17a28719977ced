"""Guests on the operator's bridge (`[guest] network = "bridge"`): each VM's second tap, its MAC
and the layer-2 firewall that keeps the guest a plain host of the site and nothing more, as data
(argv lists and nft text, pure functions; provisioning.node_service.network_ops runs them).

Why a second NIC and not the job's bridge on the operator's: the job's bridge keeps what a guest
needs from its own node whatever the site does — the NFS gateway (10.hi.lo.254, the same on
every node, so a resumed guest keeps its mounts) and a multi-node job's private network — and
forwards nothing (as with `network = "none"`). The site NIC, a tap `vjob-<subnet>-s<vmID>` owned
by the job's uid and enslaved to the operator's bridge, carries everything else: the guest asks
the site's DHCP server for its address, default route and name servers, like any host there.

Why nftables' bridge family and not br_netfilter: a bridge-family table sees every frame at the
bridge itself, whether or not br_netfilter hands bridged frames to iptables (a node-wide switch a
site may have off, or on for Docker with a FORWARD policy of DROP); and one table per job
(`table bridge vjob-<subnet>`) is replaced in one transaction and removed in one command. Per
site tap T with the VM's fixed MAC M (docs/security.md "Guests on the operator's bridge"):

* prerouting, from T: another source MAC, an ARP sender other than M, anything but IPv4, IPv6 and
  ARP (VLAN tags, STP and other link-layer protocols), a DHCP server's answer (UDP source port 67:
  no rogue DHCP for the site) and an IPv6 router advertisement are dropped;
* input, from T: everything is dropped — a frame for the node itself (its address on the
  operator's bridge, or any other through the bridge's MAC) never reaches the node's stack, so
  no node service answers the guest on the bridge; broadcasts still reach the site's ports;
* forward, to T: unicast frames for another MAC are dropped (flooded frames of other hosts are
  not the guest's to read).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

from provisioning.node_service.net_rules import JobNet
from vjob.errors import InputError

NFT = "nft"
TABLE_FAMILY = "bridge"
SITE_MAC_OCTET = 0x56
"""First octet of every site MAC: locally administered (bit 1), unicast (bit 0 clear); the job's
NICs on its own bridge use 52:54:00, so the two never meet."""
BRIDGE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
"""An operator's bridge name: ≤ 15 characters (IFNAMSIZ - 1) of a safe alphabet."""
JOB_BRIDGE_RE = re.compile(r"(?:vjob|vsal)-.*")
SYS_CLASS_NET = "/sys/class/net"
OWN_TABLE_RE = re.compile(r"table bridge (vjob-([0-9a-f]{4}))\b")


def site_mac(rms: str, job: str, vm_id: int) -> str:
    """VM `vm_id`'s MAC on the site: 56:<job 32 bits>:<vmID>, the same at every start and on every
    node (the guest keeps its DHCP lease across a checkpoint; a site may reserve addresses for it).
    A numeric job id below 2^32 is written as it is, so two jobs running at once never share a MAC
    on the site's network; any other id is hashed."""
    if not 1 <= vm_id <= 0xFF:
        raise InputError(f"vm id {vm_id}: must be in 1..255")
    if job.isdigit() and int(job) < 1 << 32:
        number = int(job)
    else:
        number = int.from_bytes(hashlib.sha256(f"{rms}\0{job}".encode()).digest()[:4], "big")
    octets = [SITE_MAC_OCTET, *number.to_bytes(4, "big"), vm_id]
    return ":".join(f"{o:02x}" for o in octets)


def check_bridge_name(value: str) -> str:
    """The operator's bridge name as a name (the config model and the service both check it)."""
    if not BRIDGE_NAME_RE.fullmatch(value) or JOB_BRIDGE_RE.fullmatch(value):
        raise InputError(
            f"[guest] bridge = {value[:40]!r}: the name of the operator's Linux bridge, 1..15 letters, digits, "
            "'.', '_', '-' (not a job bridge vjob-*/vsal-*)"
        )
    return value


def check_bridge(value: str, node: str, sys_net: str = SYS_CLASS_NET) -> str:
    """`value` names an existing Linux bridge on this node (checked at every net.up: the operator's
    bridge may have gone since the service started)."""
    check_bridge_name(value)
    link = Path(sys_net) / value
    if not link.exists():
        raise InputError(f"[guest] bridge = {value!r}: no such network interface on node {node}")
    if not (link / "bridge").is_dir():
        raise InputError(f"[guest] bridge = {value!r}: on node {node} it is not a Linux bridge")
    return value


def tap_attach(net: JobNet, vm_id: int, bridge: str) -> list[str]:
    return ["ip", "link", "set", "dev", net.site_tap(vm_id), "master", bridge, "up"]


def tap_add(net: JobNet, vm_id: int, uid: int) -> list[str]:
    """A persistent tap only `uid` may open, as the job's own taps."""
    return ["ip", "tuntap", "add", "dev", net.site_tap(vm_id), "mode", "tap", "user", str(uid)]


def table_name(net: JobNet) -> str:
    return net.bridge


def ruleset(net: JobNet, macs: Mapping[int, str]) -> str:
    """`nft -f` input replacing the job's bridge table with the rules for its site taps
    (vmID -> MAC) on this node, in one transaction (declare, delete, define: no moment without
    them, and a second net.up leaves exactly one table)."""
    if not macs:
        raise InputError("site bridge rules: no tap")
    name = table_name(net)
    pre: list[str] = []
    fwd: list[str] = []
    for vm_id, mac in sorted(macs.items()):
        tap = f'iifname "{net.site_tap(vm_id)}"'
        pre += [
            f"{tap} ether saddr != {mac} drop",
            f"{tap} ether type != {{ ip, ip6, arp }} drop",
            f"{tap} arp saddr ether != {mac} drop",
            f"{tap} udp sport 67 drop",
            f"{tap} icmpv6 type nd-router-advert drop",
        ]
        fwd.append(
            f'oifname "{net.site_tap(vm_id)}" ether daddr & 01:00:00:00:00:00 == 00:00:00:00:00:00 '
            f"ether daddr != {mac} drop"
        )
    taps = ", ".join(f'"{net.site_tap(i)}"' for i in sorted(macs))
    chains = {
        "from_guest": ("prerouting", pre),
        "to_node": ("input", [f"iifname {{ {taps} }} drop"]),
        "to_guest": ("forward", fwd),
    }
    lines = [f"table {TABLE_FAMILY} {name}", f"delete table {TABLE_FAMILY} {name}", f"table {TABLE_FAMILY} {name} {{"]
    for chain, (hook, rules) in chains.items():
        lines += [f"  chain {chain} {{", f"    type filter hook {hook} priority -200; policy accept;"]
        lines += [f"    {rule}" for rule in rules]
        lines.append("  }")
    return "\n".join([*lines, "}", ""])


def apply_cmd() -> list[str]:
    return [NFT, "-f", "-"]


def delete_cmd(net: JobNet) -> list[str]:
    return [NFT, "delete", "table", TABLE_FAMILY, table_name(net)]


def list_cmd() -> list[str]:
    return [NFT, "list", "tables", TABLE_FAMILY]


def own_tables(listing: str) -> list[int]:
    """SubnetIDs of the job tables in `nft list tables bridge`."""
    return sorted(int(m.group(2), 16) for m in OWN_TABLE_RE.finditer(listing))
