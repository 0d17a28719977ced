"""Saline's NAT interface (paper 3.2): every VM's way out, with an address that survives a move.

Why static addresses and one gateway everywhere: a vjob is suspended at one site and resumed
at another, or live-migrated; its guests do not run DHCP again (the image has no client, and
a restored guest would not know to ask). So each VM's NAT address is derived from its
subnetID/vmID in a range of its own (base + subnetID·256 + vmID, beside the private network's
10.hi.lo.vm), and every node's NAT network has the same name, gateway address and gateway
MAC: after a resume elsewhere the guest's address, route and ARP entry for the gateway are
all still right. What does not survive is the state of connections through NAT (the old
node's conntrack): a guest's open connections to the outside break at a move and must be
made again; its private network and its own address do not change.

Why isolated ports: all vjobs' VMs on a node share the NAT network; `<port isolated='yes'/>`
lets each reach the gateway but not the others' NAT NICs, so vjobs stay apart there as on
their private networks. What the guests may reach through the gateway (the site's own
services, the host itself) is the operator's firewall (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from provisioning.vm_types import Nic
from vjob import log
from vjob.errors import ConfigError, InputError, VjobError
from vjob.store.identities import SUBNET_IDS, VM_IDS, mac_address

_log = log.get("provisioning")


@dataclass(frozen=True)
class NatNetwork:
    """The NAT network as `[saline] nat_*` describes it (checked there, saline_bew.config)."""

    name: str
    range: ipaddress.IPv4Network
    mac_prefix: str
    dns: tuple[str, ...] = ()

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """base + 1: subnetID 0 is never handed out (vjob.store.identities), so no VM has it."""
        return self.range.network_address + 1

    @property
    def gateway_mac(self) -> str:
        """prefix:00:00:00 (vmID 0 is never a VM's): the same on every node, so a guest's ARP
        entry for its gateway is still right after a move."""
        return mac_address(self.mac_prefix, 0, 0)

    def address(self, subnet_id: int, vm_id: int) -> ipaddress.IPv4Address:
        """base + subnetID·256 + vmID; a subnetID beyond the range is a ConfigError naming it."""
        if not 1 <= vm_id < VM_IDS - 1 or not 1 <= subnet_id < SUBNET_IDS:
            raise InputError(f"NAT address of subnetID {subnet_id}, vmID {vm_id}: out of range")
        room = self.range.num_addresses >> 8
        if subnet_id >= room:
            raise ConfigError(
                f"saline.nat_range = {str(self.range)!r}: holds subnetIDs 1..{room - 1}, "
                f"a vjob has subnetID {subnet_id}: give a larger range (a /8 holds them all)"
            )
        return self.range.network_address + (subnet_id << 8) + vm_id

    def mac(self, subnet_id: int, vm_id: int) -> str:
        return mac_address(self.mac_prefix, subnet_id, vm_id)

    def nic(self, subnet_id: int, vm_id: int) -> Nic:
        """The VM's second NIC: on the libvirt network by name (found on whichever node the VM
        is restored or migrated to), isolated from the other VMs on it, and held to its own
        MAC and address by libvirt's `clean-traffic` nwfilter: port isolation stops traffic
        between the VMs, not a guest's root claiming another vjob's address towards the
        gateway (ARP or IP spoofing), which would take that vjob's connections."""
        return Nic(
            self.mac(subnet_id, vm_id), self.name, kind="network", isolated=True, ip=str(self.address(subnet_id, vm_id))
        )

    def guest(self, subnet_id: int, vm_id: int) -> dict[str, object]:
        """What the guest agent sets on that NIC (job.json `network.nat`): address, prefix,
        default route, resolv.conf."""
        return {
            "mac": self.mac(subnet_id, vm_id),
            "ip": str(self.address(subnet_id, vm_id)),
            "prefix": self.range.prefixlen,
            "gateway": str(self.gateway),
            "dns": list(self.dns) or [str(self.gateway)],
        }


def from_config(name: str, range_: str, mac_prefix: str, dns: list[str]) -> NatNetwork | None:
    """The NAT network of `[saline]`, or None when `nat_network` is empty (VMs have only their
    private network, as before)."""
    if not name:
        return None
    return NatNetwork(name, ipaddress.IPv4Network(range_), mac_prefix, tuple(dns))


def network_xml(nat: NatNetwork) -> str:
    """A libvirt NAT network: the gateway address and MAC pinned (the same on every node), no
    DHCP (the guests' addresses are static). Without `nat_dns` libvirt's dnsmasq answers DNS on
    the gateway (the node needs dnsmasq); with it, libvirt runs no DNS there (nor dnsmasq)."""
    root = ET.Element("network")
    ET.SubElement(root, "name").text = nat.name
    ET.SubElement(root, "forward", mode="nat")
    ET.SubElement(root, "bridge", name=nat.name, stp="off", delay="0")
    ET.SubElement(root, "mac", address=nat.gateway_mac)
    if nat.dns:
        ET.SubElement(root, "dns", enable="no")
    ET.SubElement(root, "ip", address=str(nat.gateway), prefix=str(nat.range.prefixlen))
    return ET.tostring(root, encoding="unicode")


def ensure(conn: Any, nat: NatNetwork) -> bool:
    """The NAT network on the node of `conn`, defined (persistent, autostarted) when absent and
    started when inactive; True when defined here. An existing one (the operator's, or one vjob
    defined before) is kept, but its gateway must be the range's: a guest resumed from another
    node keeps its address and route, which another gateway would break."""
    import libvirt  # heavy: libvirt

    try:
        net = conn.networkLookupByName(nat.name)
    except libvirt.libvirtError:
        net = None
    defined = net is None
    try:
        if net is None:
            net = conn.networkDefineXML(network_xml(nat))
            net.setAutostart(1)
        else:
            _check_gateway(net.XMLDesc(0), nat, conn.getURI())
        if not net.isActive():
            net.create()
    except libvirt.libvirtError as exc:
        raise VjobError(
            f"saline.nat_network = {nat.name!r}: cannot define or start it on {conn.getURI()} "
            f"(saline.nat_range = {str(nat.range)!r}): {exc}"
        ) from None
    if defined:
        _log.info("NAT network defined", network=nat.name, gateway=str(nat.gateway), uri=conn.getURI())
    return defined


def _check_gateway(xml: str, nat: NatNetwork, uri: str) -> None:
    """An existing network with a host address must have the configured gateway (one without
    any, e.g. a `<forward mode='bridge'>` to the operator's bridge, is the operator's word)."""
    addresses = [ip.get("address") for ip in ET.fromstring(xml).findall("./ip") if ip.get("family", "ipv4") == "ipv4"]
    if addresses and str(nat.gateway) not in addresses:
        raise VjobError(
            f"saline.nat_network = {nat.name!r} on {uri}: its gateway is {', '.join(map(str, addresses))}, "
            f"saline.nat_range = {str(nat.range)!r} wants {nat.gateway} on every node (a guest keeps its "
            "route across a move): fix the network or the range"
        )
