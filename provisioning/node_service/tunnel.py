"""A multi-node job's network over the wire: when the job's nodes sit on more than one host, the
node service adds to the job's bridge on this host a VXLAN device whose unicast peers are the
job's other hosts, and keeps every other sender out of it (network_ops calls `ensure`/`remove`
at net.up/net.down and from its sweep).

Why VXLAN with unicast peers from the RMS: a job's private network is one Ethernet segment (its
VMs find each other by ARP, the guests keep their MACs and addresses when resumed elsewhere), so
the tunnel must carry frames, not routes; the RMS already says which nodes the job holds, and
the address of each node (Slurm's NodeAddr: `plugins.slurm.job_grant.SlurmJobAuthority.
node_addresses`, others the node names as host names) names the far ends — nothing a user sends
chooses a peer, the VNI or the underlay. `install_addresses` takes another source (a test
topology of network-namespace hosts).

What one job gets on a host that holds one of its nodes and shares it with another host
(names follow the job's bridge B = `vjob-<subnet hex>`):

* the link `B-vx`: `vxlan id VNI local L dstport P srcport 768 1024 df unset`, MTU 1500, a port
  of B; one flood entry (`bridge fdb append 00:…:00 dst PEER`) per other host, unicast MACs
  learnt from what the peers send. VNI = the job's subnetID (one per job; two jobs share one
  only when they would share a bridge, which net.up refuses). L = this node's own address from
  the RMS (the peers accept nothing else from it), P = `[node] tunnel_port`.
* `table inet B`, before every other input rule: a datagram to P carrying VNI is dropped unless
  it comes from one of the job's peers and from a source port below 1024 — the kernel's VXLAN
  sends from 768..1023 (`srcport`), an ordinary user on a peer host can bind none of them, and a
  guest's traffic leaving its node is masqueraded to ports 1024-65535 (net_rules.nat_rules): so a
  user anywhere, or a guest of any job, cannot put a frame into this job's segment, even with
  this job's VNI and a peer's address as the datagram's source.
* `table netdev B` on `B-vx`'s egress and ingress: frames from or to the job's gateway (its MAC,
  or ARP for its address) are dropped: every host of the job has that gateway (the same address
  and MAC everywhere, so a resumed guest keeps its route), and each guest must talk to its own
  host's. Every drop is counted (`nft list table inet B`: what was refused, and from where).
* on a host where a job's guests sit on the operator's bridge (`[guest] network = "bridge"`), the
  node-wide `table bridge vjob-guard` (`guard_ruleset`): such a guest is a host of the site, and
  may not send the tunnel's datagrams out of the bridge with a forged node address.

MTU: the guests keep 1500 (a guest saved on one host resumes on another, spanning or not) and
`B-vx` takes 1500 too, without a `dev`, so the kernel lets it exceed the underlay's MTU. On an
underlay of at least 1550 bytes nothing is fragmented; below that (a warning at net.up) the
kernel answers an oversized guest packet with DF set by an ICMP "fragmentation needed" toward the
guest (TCP settles at 1450-byte packets) and fragments the outer datagram of one without DF.

Which hosts: a node whose address is one of this host's (or loopback) is local, every other
node's address is a peer (nodes on one host are one peer). No peer, no tunnel. Every address,
this node's and the peers', must lie in `[node] tunnel_networks` (the cluster network the
operator chose to carry the job's unencrypted frames); an empty list means no tunnels at all.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioning.node_service.net_rules import IP, JobNet
from vjob import log, proc
from vjob.errors import CommandError, InputError

NFT = "nft"
BRIDGE = "bridge"
SUFFIX = "vx"
SRC_PORTS = (768, 1024)
"""The outer source ports of this service's VXLAN datagrams, [low, high): privileged only."""
GUEST_MTU = 1500
OVERHEAD = 50
"""Outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14) bytes."""
FLOOD_MAC = "00:00:00:00:00:00"
MAX_PEERS = 255
ADDRESS_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
OWN_TABLE_RE = re.compile(r"^table (inet|netdev) (vjob-([0-9a-f]{4}))$", re.MULTILINE)
COMMAND_TIMEOUT_S = 10.0
SYS_NET = Path("/sys/class/net")
_log = log.get("node_service")

NodeAddresses = Callable[[Sequence[str]], Mapping[str, str]]
"""Node names → each node's address as the RMS has it (an IPv4 literal or a host name)."""


def names_as_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """The default: a node's name is its host name (OAR, PBS; Slurm without NodeAddr)."""
    return {n: n for n in nodes}


_addresses: NodeAddresses = names_as_addresses


def install_addresses(source: NodeAddresses | None) -> None:
    """Where node addresses come from (the service at start: its RMS authority's; a test
    topology its own); None puts back the default."""
    global _addresses
    _addresses = source or names_as_addresses


def node_addresses(nodes: Sequence[str]) -> Mapping[str, str]:
    return _addresses(nodes)


# -- names ----------------------------------------------------------------------------------
def vni(net: JobNet) -> int:
    """The job's VXLAN network identifier: its subnetID (1..65535 of VXLAN's 24 bits)."""
    return net.subnet_id


def device(net: JobNet) -> str:
    """`vjob-1a2b-vx`: 12 characters, under IFNAMSIZ."""
    return f"{net.bridge}-{SUFFIX}"


# -- which hosts ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """The tunnel of one job on this host: its own end, the other hosts', the UDP port."""

    local: ipaddress.IPv4Address
    peers: tuple[ipaddress.IPv4Address, ...]
    port: int


def resolve(node: str, address: str) -> ipaddress.IPv4Address:
    """`address` (the RMS's, for `node`) as one IPv4 address: a literal, or a host name's first
    IPv4 address from the host's resolver."""
    if not isinstance(address, str) or not ADDRESS_RE.fullmatch(address):
        raise InputError(f"node {node}: address {str(address)[:60]!r} from the RMS is not an address or host name")
    try:
        return ipaddress.IPv4Address(address)
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(address, None, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        raise InputError(f"node {node}: its address {address!r} does not resolve to IPv4: {exc}") from None
    return ipaddress.IPv4Address(found[0][4][0])


def plan(
    node: str,
    addresses: Mapping[str, ipaddress.IPv4Address],
    own: Sequence[ipaddress.IPv4Address],
    networks: Sequence[ipaddress.IPv4Network],
    port: int,
) -> Plan | None:
    """The tunnel for the job whose nodes have `addresses` (resolved), seen from `node` on a host
    holding the addresses `own`; None when every node is on this host."""
    local_set = set(own)

    def is_local(ip: ipaddress.IPv4Address) -> bool:
        return ip.is_loopback or ip in local_set

    peers = sorted({ip for ip in addresses.values() if not is_local(ip)})
    if not peers:
        return None
    here = addresses.get(node)
    if here is None or not is_local(here) or here.is_loopback:
        raise InputError(
            f"job tunnel: node {node}'s address from the RMS ({here}) is not an address of this host on the "
            "cluster network: the other hosts would refuse what it sends"
        )
    if len(peers) > MAX_PEERS:
        raise InputError(f"job tunnel: {len(peers)} other hosts, at most {MAX_PEERS}")
    for name, ip in sorted(addresses.items()):
        if not is_local(ip) or name == node:
            bad = ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255")
            if bad or not any(ip in n for n in networks):
                raise InputError(
                    f"job tunnel: node {name}'s address {ip} is not in [node] tunnel_networks "
                    f"{[str(n) for n in networks]}: the job's frames stay on the cluster network"
                )
    return Plan(here, tuple(peers), port)


# -- commands (argv lists and nft text) -------------------------------------------------------
def vxlan_add(net: JobNet, p: Plan) -> list[str]:
    return [
        *(IP, "link", "add", device(net), "type", "vxlan", "id", str(vni(net)), "local", str(p.local)),
        *("dstport", str(p.port), "srcport", str(SRC_PORTS[0]), str(SRC_PORTS[1]), "df", "unset"),
    ]


def vxlan_attach(net: JobNet) -> list[str]:
    return [IP, "link", "set", "dev", device(net), "mtu", str(GUEST_MTU), "master", net.bridge, "up"]


def fdb_add(net: JobNet, peer: ipaddress.IPv4Address) -> list[str]:
    return [BRIDGE, "fdb", "append", FLOOD_MAC, "dev", device(net), "dst", str(peer)]


def fdb_del(net: JobNet, peer: ipaddress.IPv4Address, mac: str = FLOOD_MAC) -> list[str]:
    return [BRIDGE, "fdb", "del", mac, "dev", device(net), "dst", str(peer)]


def fdb_entries(fdb_json: str) -> list[tuple[str, ipaddress.IPv4Address]]:
    """(MAC, far end) of the entries of `bridge -j fdb show dev B-vx` that point across the
    tunnel: the flood entries (MAC 00:…:00) and the MACs learnt from the peers."""
    out = []
    for entry in json.loads(fdb_json or "[]"):
        if isinstance(entry, dict) and isinstance(entry.get("mac"), str) and "dst" in entry:
            try:
                out.append((entry["mac"], ipaddress.IPv4Address(entry["dst"])))
            except ValueError:
                continue
    return out


def flood_peers(fdb_json: str) -> set[ipaddress.IPv4Address]:
    """The flood entries' destinations."""
    return {dst for mac, dst in fdb_entries(fdb_json) if mac == FLOOD_MAC}


def same_device(link_json: str, net: JobNet, p: Plan) -> bool:
    """Whether `ip -j -d link show dev B-vx` is this job's VXLAN with this plan's ends."""
    try:
        info = json.loads(link_json)[0]["linkinfo"]
        data = info["info_data"]
        return (
            info["info_kind"] == "vxlan"
            and data.get("id") == vni(net)
            and data.get("local") == str(p.local)
            and data.get("port") == p.port
        )
    except (ValueError, LookupError, TypeError):
        return False


def ruleset(net: JobNet, p: Plan) -> str:
    """`nft -f` input replacing the job's two tables in one transaction (module docstring)."""
    name, dev = net.bridge, device(net)
    vxlan = f"udp dport {p.port} @th,96,24 {vni(net)}"
    peers = ", ".join(str(a) for a in p.peers)
    gw, mac = str(net.gateway), net.gateway_mac
    lines = [f"table inet {name}", f"delete table inet {name}", f"table inet {name} {{"]
    lines += [
        "  chain underlay_in {",
        "    type filter hook input priority -200; policy accept;",
        f"    {vxlan} meta nfproto != ipv4 counter drop",
        f"    {vxlan} ip saddr != {{ {peers} }} counter drop",
        f"    {vxlan} udp sport >= 1024 counter drop",
        "  }",
        "}",
    ]
    gateway = [f"ether saddr {mac}", f"ether daddr {mac}", f"arp saddr ip {gw}", f"arp daddr ip {gw}"]
    lines += [f"table netdev {name}", f"delete table netdev {name}", f"table netdev {name} {{"]
    for chain, hook in (("from_tunnel", "ingress"), ("to_tunnel", "egress")):
        lines += [f"  chain {chain} {{", f'    type filter hook {hook} device "{dev}" priority -200; policy accept;']
        lines += [f"    {match} counter drop" for match in gateway]
        lines.append("  }")
    return "\n".join([*lines, "}", ""])


GUARD = "vjob-guard"
"""The node's one table in nftables' bridge family against tunnel datagrams from bridged guests
(its name is no job's: site_bridge's sweep, which matches `vjob-<4 hex>`, leaves it alone)."""


def guard_ruleset(port: int) -> str:
    """`nft -f` input: a frame that a guest's port (`vjob-*`: a site tap on the operator's bridge)
    sends to a port that is no job's (the operator's uplink) is dropped when it carries a UDP
    datagram to the tunnel port. A guest on the operator's bridge is a host of the site with
    root: it could forge a peer node's address and a privileged source port on the wire.
    Datagrams between a job's own ports (its taps, its VXLAN) are untouched: a job may run its
    own VXLAN between its VMs."""
    return "\n".join(
        [
            f"table bridge {GUARD}",
            f"delete table bridge {GUARD}",
            f"table bridge {GUARD} {{",
            "  chain from_guests {",
            "    type filter hook forward priority -200; policy accept;",
            f'    iifname "vjob-*" oifname != "vjob-*" udp dport {port} counter drop',
            "  }",
            "}",
            "",
        ]
    )


def delete_table(net: JobNet, family: str) -> list[str]:
    return [NFT, "delete", "table", family, net.bridge]


def own_tables(listing: str) -> set[int]:
    """SubnetIDs of the tunnel tables in `nft list tables` (inet and netdev families)."""
    return {int(m.group(3), 16) for m in OWN_TABLE_RE.finditer(listing)}


# -- on the node -------------------------------------------------------------------------------
def _run(cmd: list[str], stdin: str | None = None) -> str:
    return proc.run(cmd, timeout_s=COMMAND_TIMEOUT_S, stdin=stdin)


def host_addresses() -> dict[ipaddress.IPv4Address, int]:
    """This host's IPv4 addresses, each with the MTU of its interface."""
    out: dict[ipaddress.IPv4Address, int] = {}
    for link in json.loads(_run([IP, "-j", "-4", "addr", "show"]) or "[]"):
        for addr in link.get("addr_info", []):
            try:
                out[ipaddress.IPv4Address(addr["local"])] = int(link.get("mtu", 0))
            except (KeyError, ValueError, TypeError):
                continue
    return out


def plan_for(net: JobNet, node: str, nodes: Sequence[str], networks: Sequence[str], port: int) -> Plan | None:
    """The plan of the job holding `nodes`, asked from `node` on this host: the RMS's addresses
    resolved, this host's addresses read. None when tunnels are off (`networks` empty) or every
    node is here."""
    if not networks or len(nodes) < 2:
        if len(nodes) > 1:
            _log.info("[node] tunnel_networks unset: the job's bridge is not joined to other hosts", bridge=net.bridge)
        return None
    given = node_addresses(nodes)
    resolved = {n: resolve(n, given.get(n, "")) for n in nodes}
    nets = [ipaddress.IPv4Network(n) for n in networks]
    own = host_addresses()
    found = plan(node, resolved, list(own), nets, port)
    if found is not None and own.get(found.local, 0) < GUEST_MTU + OVERHEAD:
        _log.warning(
            "underlay MTU below 1550: the job's full-size frames are fragmented or answered by fragmentation-needed",
            bridge=net.bridge,
            local=str(found.local),
            mtu=own.get(found.local, 0),
        )
    return found


def exists(net: JobNet) -> bool:
    return (SYS_NET / device(net)).exists()


def ensure(net: JobNet, p: Plan) -> None:
    """The job's VXLAN on its bridge with exactly `p`'s peers, and its rules: the device is made
    down, the rules applied, then it joins the bridge and comes up (nothing is received before the
    rules hold). A device with other ends (this node's address or the port changed) is made again."""
    if exists(net) and not same_device(_run([IP, "-j", "-d", "link", "show", "dev", device(net)]), net, p):
        _run([IP, "link", "del", "dev", device(net)])
    if not exists(net):
        _run(vxlan_add(net, p))
    _run([NFT, "-f", "-"], stdin=ruleset(net, p))
    _run(vxlan_attach(net))
    entries = fdb_entries(_run([BRIDGE, "-j", "fdb", "show", "dev", device(net)]))
    for mac, peer in entries:  # a host no longer the job's: its flood entry and what was learnt there
        if peer not in p.peers:
            _run(fdb_del(net, peer, mac))
    have = {peer for mac, peer in entries if mac == FLOOD_MAC}
    for peer in sorted(set(p.peers) - have):
        _run(fdb_add(net, peer))


def ensure_guard(port: int) -> None:
    """The node's guard table (`guard_ruleset`): at every net.up of a job on the operator's
    bridge while tunnels are on. Node-wide and static, it stays."""
    _run([NFT, "-f", "-"], stdin=guard_ruleset(port))


def remove(net: JobNet) -> list[str]:
    """The job's tables and VXLAN on this host, whatever of them there is (one `nft list` when
    there is none: every net.down and sweep of a job on one host asks)."""
    removed = []
    for family in ("netdev", "inet") if net.subnet_id in tables() else ():
        try:
            _run(delete_table(net, family))
            removed.append(f"{family} {net.bridge}")
        except CommandError:
            continue
    if exists(net):
        _run([IP, "link", "del", "dev", device(net)])
        removed.append(device(net))
    return removed


def tables() -> set[int]:
    """SubnetIDs of the tunnel tables on this host (none on a node without nft)."""
    try:
        return own_tables(_run([NFT, "list", "tables"]))
    except CommandError:
        return set()


def describe(net: JobNet, p: Plan | None) -> dict[str, object] | None:
    """The net.up answer's `tunnel` (for the pilot's log and the tests)."""
    if p is None:
        return None
    return {"device": device(net), "vni": vni(net), "local": str(p.local), "peers": [str(a) for a in p.peers]}
