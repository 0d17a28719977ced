"""Saline's shared NAT network holds each guest to its own address (issue 39, item 13).

All vjobs' VMs of a node share the NAT network. `<port isolated='yes'/>` keeps their NICs from
talking to each other, but a guest's root could still send from, or answer ARP for, another
vjob's NAT address towards the gateway and so take that vjob's connections. The NAT NIC now
carries libvirt's stock `clean-traffic` nwfilter with the VM's own address (no MAC, IP or ARP
spoofing). These tests fail on `006ad0b`: its NAT NIC had no filter at all.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from provisioning import nat
from provisioning.domain_xml import NAT_FILTER, domain_xml
from provisioning.vm_types import Nic, VMSpec
from vjob.errors import InputError

NAT = nat.from_config("vjnat", "100.64.0.0/10", "52:54:01", [])


def _spec(tmp_path: Path, name: str, subnet_id: int, vm_id: int) -> VMSpec:
    assert NAT is not None
    private = Nic(f"52:54:00:{subnet_id >> 8:02x}:{subnet_id & 255:02x}:{vm_id:02x}", f"vsal-{subnet_id:04x}")
    return VMSpec(name, tmp_path / "i.qcow2", nics=(private, NAT.nic(subnet_id, vm_id)))


def _filter_of(xml: str) -> list[tuple[str | None, dict[str, str | None]]]:
    """(filter name, {parameter: value}) of each NIC, in order."""
    out = []
    for nic in ET.fromstring(xml).findall("./devices/interface"):
        ref = nic.find("filterref")
        params = {p.get("name") or "": p.get("value") for p in ref.findall("parameter")} if ref is not None else {}
        out.append((ref.get("filter") if ref is not None else None, params))
    return out


def test_the_nat_nic_is_held_to_its_own_address_and_the_private_one_is_not_filtered(tmp_path: Path) -> None:
    """The private network is the job's own (a guest can only harm its own job there); the NAT
    network is everybody's: only its NIC is filtered, with the address the guest is given."""
    assert NAT is not None
    xml = domain_xml(_spec(tmp_path, "v", 3, 7), dom_type="qemu", overlay=tmp_path / "o", console_log=tmp_path / "c")
    assert NAT_FILTER == "clean-traffic"
    assert _filter_of(xml) == [(None, {}), ("clean-traffic", {"IP": "100.64.3.7"})]
    assert NAT.guest(3, 7)["ip"] == "100.64.3.7"  # the address job.json gives the guest is the one allowed


def test_two_vjobs_on_one_nat_network_get_different_allowed_addresses(tmp_path: Path) -> None:
    a = domain_xml(_spec(tmp_path, "a", 1, 1), dom_type="test", overlay=tmp_path / "o", console_log=tmp_path / "c")
    b = domain_xml(_spec(tmp_path, "b", 2, 1), dom_type="test", overlay=tmp_path / "o", console_log=tmp_path / "c")
    assert _filter_of(a)[1][1] == {"IP": "100.64.1.1"} and _filter_of(b)[1][1] == {"IP": "100.64.2.1"}


@pytest.mark.parametrize("ip", ["100.64.1.1\n", "100.64.1", "256.1.1.1", "::1", "100.64.1.1'/><x a='", "1.2.3.04x"])
def test_a_nic_address_that_is_not_one_ipv4_address_is_refused(ip: str) -> None:
    with pytest.raises(InputError, match="nic ip"):
        Nic("52:54:01:00:01:01", "vjnat", kind="network", isolated=True, ip=ip)


@pytest.mark.libvirt
def test_the_test_driver_defines_the_domain_with_the_filter(tmp_path: Path) -> None:
    """libvirt accepts the filter reference as written (its own schema), and keeps it."""
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open("test:///default")
    try:
        spec = _spec(tmp_path, "vjob-nwfilter-probe", 5, 9)
        dom = conn.defineXML(domain_xml(spec, dom_type="test", overlay=tmp_path / "o", console_log=tmp_path / "c"))
        try:
            assert _filter_of(dom.XMLDesc(0)) == [(None, {}), ("clean-traffic", {"IP": "100.64.5.9"})]
        finally:
            dom.undefine()
    finally:
        conn.close()


@pytest.mark.libvirt
def test_a_real_libvirtd_has_the_filter_the_nat_nic_names(libvirt_system: str) -> None:
    """A guest whose NIC names a filter libvirtd does not have would not start: the stock
    filter must be there on a node as libvirt's packages install it."""
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open(libvirt_system)
    try:
        xml = conn.nwfilterLookupByName(NAT_FILTER).XMLDesc(0)
    finally:
        conn.close()
    refs = {ref.get("filter") for ref in ET.fromstring(xml).findall("filterref")}
    assert {"no-mac-spoofing", "no-ip-spoofing", "no-arp-spoofing"} <= refs
