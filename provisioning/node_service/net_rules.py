"""A job's network on a node as data: its names, its links and its firewall, each a pure
function of the job's subnet (argv lists and iptables-restore text), so they are tested without
touching the node and the node service (provisioning.node_service.network_ops) only runs them.

Why everything is named after the job's bridge (`vjob-<subnetID hex>`): the kernel holds all of
a job's network (bridge, taps, chains) and the service holds nothing else worth keeping, so a
service restarted, or a node's operator, finds a job's objects by name — `vjob-1a2b`, its taps
`vjob-1a2b-t01`…, its chains `vjob-1a2b-in|out|back|nat` — and removes exactly those.

The firewall, per job (B its bridge, S its /24, G the node's address on it, docs/security.md
"Guests and the site network"):

* INPUT from B → `B-in`: a source outside S is dropped (a guest's root forging another job's or
  the site's address); the NFS gateway's port on G (NFS_PORT, served there by nfs_ops) and
  ping of G are accepted; everything else of the node is refused (TCP reset, ICMP otherwise), so
  a guest reaches none of the node's own services — on G, on the node's site address or any other.
* FORWARD from B → `B-out`: a forged source is dropped; the job's own bridge is allowed (only
  seen when br_netfilter hands bridged frames to iptables); other jobs' bridges (`vjob-*`,
  Saline's `vsal-*`) are dropped; the rest (the site) is accepted when `[guest] network =
  "nat"`, refused when "none".
* FORWARD to B → `B-back`: only replies (conntrack ESTABLISHED, RELATED): nothing from the site
  or from another job opens a connection into a guest. A frame from B to B (the job's own VMs,
  when br_netfilter hands bridged frames to iptables, as on this machine) returns from `B-back`
  and is judged by `B-out`.
* nat POSTROUTING from S → `B-nat`: masquerade to the site, TCP and UDP source ports mapped to
  1024-65535: a guest's root binds privileged ports, and a site service trusting "a port below
  1024 from a node's address" (NFS with `secure`, rsh) must not take it for the node's root.

IPv6 is switched off on B and its taps: the guests' link-local addresses would otherwise reach
every node service listening on `::`, past these IPv4 rules.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from provisioning import network
from vjob.errors import InputError
from vjob.store.identities import mac_address

NFS_PORT = 2049
"""The port of the NFS gateway the node serves on each job's gateway address
(provisioning.node_service.nfs_ops binds there): the one node service a guest may reach."""
MAX_VMS_PER_REQUEST = 64
"""Taps one net.up makes at most (a job has at most one VM per node it holds; a user's pilot
without per-node pilots runs them all on its first node)."""
MODES = ("nat", "none", "bridge")
"""`[guest] network` values the node service builds. "bridge": the job's bridge forwards nothing
(as "none": it carries the job's private network and its NFS gateway) and each VM gets a second
tap on the operator's bridge (provisioning.node_service.site_bridge)."""
JUMPS_FILTER = (("INPUT", "-i", "in"), ("FORWARD", "-i", "out"), ("FORWARD", "-o", "back"))
"""The main chains' jumps to a job's chains: (main chain, interface match, chain suffix)."""
IP = "ip"
IPTABLES = "iptables"
OTHER_BRIDGES = tuple(f"{family}-+" for family in network.FAMILIES)
"""iptables interface wildcards of every job bridge (pilots' and Saline's)."""


@dataclass(frozen=True)
class JobNet:
    """One job's network on a node, derived from its subnetID alone."""

    subnet_id: int
    mode: str = "nat"

    @property
    def bridge(self) -> str:
        return network.bridge_name(self.subnet_id)

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{network.ip_address(self.subnet_id, 1)}/24", strict=False)

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return network.gateway_address(self.subnet_id)

    @property
    def gateway_mac(self) -> str:
        """The bridge's own MAC, the same on every node (vmID 254 is never a VM's): a guest
        resumed elsewhere still has the right ARP entry for its gateway."""
        return mac_address(network.PILOT_MAC_PREFIX, self.subnet_id, network.GATEWAY_VM_ID)

    def chain(self, suffix: str) -> str:
        return f"{self.bridge}-{suffix}"

    def tap(self, vm_id: int) -> str:
        """The tap of VM `vm_id`: `vjob-1a2b-t01` (13 characters, under IFNAMSIZ), the same on
        every node, so a saved domain's `<target dev=…>` is right wherever it is restored."""
        if not 1 <= vm_id < network.GATEWAY_VM_ID:
            raise InputError(f"vm id {vm_id}: must be in 1..{network.GATEWAY_VM_ID - 1}")
        return f"{self.bridge}-t{vm_id:02x}"

    def site_tap(self, vm_id: int) -> str:
        """VM `vm_id`'s tap on the operator's bridge (`[guest] network = "bridge"`): `vjob-1a2b-s01`."""
        return self.tap(vm_id)[:-3] + f"s{vm_id:02x}"


def job_net(rms: str, job: str, mode: str = "nat") -> JobNet:
    if mode not in MODES:
        raise InputError(f"[guest] network = {mode[:40]!r}: the node service builds {', '.join(MODES)}")
    return JobNet(network.pilot_subnet_id(rms, job), mode)


def vm_ids(first_vm_id: int, vms: int, nodes: int) -> list[int]:
    """The vmIDs of one net.up: `vms` from `first_vm_id`, all within the job's own (a job has
    at most one VM per node of its allocation, vmID = rank + 1)."""
    if not 1 <= vms <= MAX_VMS_PER_REQUEST:
        raise InputError(f"field 'vms': {vms}: must be 1..{MAX_VMS_PER_REQUEST}")
    last = first_vm_id + vms - 1
    if first_vm_id < 1 or last > max(nodes, 1) or last >= network.GATEWAY_VM_ID:
        raise InputError(
            f"fields 'first_vm_id' {first_vm_id}, 'vms' {vms}: vmIDs {first_vm_id}..{last} but the job "
            f"holds {nodes} node(s): its VMs are 1..{nodes}"
        )
    return list(range(first_vm_id, last + 1))


# -- links ---------------------------------------------------------------------------------
def bridge_add(net: JobNet) -> list[str]:
    return [IP, "link", "add", "name", net.bridge, "address", net.gateway_mac, "type", "bridge", "forward_delay", "0"]


def bridge_setup(net: JobNet) -> list[list[str]]:
    """Address and start an existing bridge (`ip addr replace`: the same result however often)."""
    return [
        [IP, "addr", "replace", f"{net.gateway}/{net.subnet.prefixlen}", "dev", net.bridge],
        [IP, "link", "set", "dev", net.bridge, "up"],
    ]


def tap_add(net: JobNet, vm_id: int, uid: int) -> list[str]:
    """A persistent tap only `uid` may open (the kernel checks TUNSETIFF against its owner)."""
    return [IP, "tuntap", "add", "dev", net.tap(vm_id), "mode", "tap", "user", str(uid)]


def tap_attach(net: JobNet, vm_id: int) -> list[str]:
    return [IP, "link", "set", "dev", net.tap(vm_id), "master", net.bridge, "up"]


def link_del(name: str) -> list[str]:
    return [IP, "link", "del", "dev", name]


def sysctls(name: str) -> dict[str, str]:
    """Per-link kernel settings: no IPv6 (module docstring) and strict reverse-path filtering
    (a second net under the anti-spoofing rules)."""
    return {f"net/ipv6/conf/{name}/disable_ipv6": "1", f"net/ipv4/conf/{name}/rp_filter": "1"}


# -- firewall --------------------------------------------------------------------------------
def input_rules(net: JobNet, nfs_port: int = NFS_PORT) -> list[list[str]]:
    s, g = str(net.subnet), str(net.gateway)
    return [
        ["!", "-s", s, "-j", "DROP"],
        ["-d", g, "-p", "tcp", "--dport", str(nfs_port), "-j", "ACCEPT"],
        ["-d", g, "-p", "icmp", "--icmp-type", "echo-request", "-j", "ACCEPT"],
        ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["-j", "REJECT", "--reject-with", "icmp-admin-prohibited"],
    ]


def out_rules(net: JobNet) -> list[list[str]]:
    rules = [["!", "-s", str(net.subnet), "-j", "DROP"], ["-o", net.bridge, "-j", "ACCEPT"]]
    rules += [["-o", pattern, "-j", "DROP"] for pattern in OTHER_BRIDGES]
    if net.mode == "nat":
        rules.append(["-j", "ACCEPT"])
    else:
        rules.append(["-j", "REJECT", "--reject-with", "icmp-admin-prohibited"])
    return rules


def back_rules(net: JobNet) -> list[list[str]]:
    """Into the bridge: replies only. A frame between two of the job's own VMs (seen here, in
    and out of the same bridge, when br_netfilter is on) goes back to FORWARD's `-i` jump and is
    judged by `out_rules` (source checked, own bridge accepted)."""
    return [
        ["-i", net.bridge, "-j", "RETURN"],
        ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
        ["-j", "DROP"],
    ]


def nat_rules(net: JobNet) -> list[list[str]]:
    if net.mode != "nat":
        return []
    return [
        ["-o", net.bridge, "-j", "RETURN"],
        ["-p", "tcp", "-j", "MASQUERADE", "--to-ports", "1024-65535"],
        ["-p", "udp", "-j", "MASQUERADE", "--to-ports", "1024-65535"],
        ["-j", "MASQUERADE"],
    ]


def restore_text(net: JobNet, nfs_port: int = NFS_PORT) -> str:
    """`iptables-restore --noflush` input declaring (so emptying) the job's chains and filling
    them: applied in one commit per table, so a second net.up never leaves a moment without them."""
    filter_chains = {
        net.chain("in"): input_rules(net, nfs_port),
        net.chain("out"): out_rules(net),
        net.chain("back"): back_rules(net),
    }
    parts = [_table("filter", filter_chains), _table("nat", {net.chain("nat"): nat_rules(net)})]
    return "".join(parts)


def _table(table: str, chains: dict[str, list[list[str]]]) -> str:
    lines = [f"*{table}", *(f":{name} - [0:0]" for name in chains)]
    lines += [" ".join(["-A", name, *rule]) for name, rules in chains.items() for rule in rules]
    return "\n".join([*lines, "COMMIT", ""])


def jumps(net: JobNet) -> list[tuple[str, str, list[str]]]:
    """(table, main chain, rule) of each jump from the main chains into the job's chains."""
    out = [("filter", main, [flag, net.bridge, "-j", net.chain(suffix)]) for main, flag, suffix in JUMPS_FILTER]
    out.append(("nat", "POSTROUTING", ["-s", str(net.subnet), "-j", net.chain("nat")]))
    return out


def jump_check(table: str, main: str, rule: list[str]) -> list[str]:
    return [IPTABLES, "-w", "5", "-t", table, "-C", main, *rule]


def jump_insert(table: str, main: str, rule: list[str]) -> list[str]:
    """First in its main chain: before libvirt's, Docker's or a site's own rules."""
    return [IPTABLES, "-w", "5", "-t", table, "-I", main, "1", *rule]


def jump_delete(table: str, main: str, rule: list[str]) -> list[str]:
    return [IPTABLES, "-w", "5", "-t", table, "-D", main, *rule]


def chain_names(net: JobNet) -> list[tuple[str, str]]:
    """(table, chain) of every chain of the job."""
    return [("filter", net.chain(s)) for s in ("in", "out", "back")] + [("nat", net.chain("nat"))]


def chain_flush(table: str, chain: str) -> list[str]:
    return [IPTABLES, "-w", "5", "-t", table, "-F", chain]


def chain_delete(table: str, chain: str) -> list[str]:
    return [IPTABLES, "-w", "5", "-t", table, "-X", chain]


# -- the guests' name servers ----------------------------------------------------------------
MAX_DNS = 3
"""resolv.conf reads at most three name servers."""


def name_servers(configured: list[str], resolv_conf: str) -> list[str]:
    """`[guest] dns` when set, else the node's own IPv4 name servers of /etc/resolv.conf without
    loopback ones (a resolver on the node's 127.0.0.53 is not the guests' to reach)."""
    if configured:
        return list(configured[:MAX_DNS])
    found: list[str] = []
    for line in resolv_conf.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                ip = ipaddress.IPv4Address(parts[1])
            except ValueError:
                continue
            if not ip.is_loopback and str(ip) not in found:
                found.append(str(ip))
    return found[:MAX_DNS]
