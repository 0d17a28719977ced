"""Guests on the operator's bridge (`[guest] network = "bridge"`, issue 33 item 3).

Unit tests check the layer-2 rules, the MAC, the configuration's refusals, the pilot's and the
guest agent's sides as data. The root-side test makes the node service's real taps, job bridge
and nftables table, with network namespaces standing in for the site (its LAN behind an operator
bridge, dnsmasq as its DHCP server, tests/services/site_network.py) and for a guest whose site
NIC takes the tap's place: the guest agent's own DHCP client gets a site address, route and name
server; the licence server sees the guest's own address; the node's address on the operator's
bridge is dropped; the job NIC leads nowhere but the job's network; another source MAC is
dropped; net.down and the sweep leave nothing but the operator's bridge.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pwd
import struct
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot import site_network
from provisioning import job_disk, network
from provisioning.domain_xml import domain_xml
from provisioning.guest_agent import agent, site_net
from provisioning.node_service import net_rules, network_ops, protocol, site, site_bridge
from provisioning.node_service.grant import Grant
from provisioning.vm_types import VMSpec
from tests.services import site_network as sn
from vjob.config.composed import parse
from vjob.errors import ConfigError, InputError, VjobError

pytestmark = pytest.mark.host_network
"""Real bridges, taps and firewall rules in this host's namespace, and sweeps that remove what they
do not claim: one module of this marker at a time (tests/conftest.py), even under pytest-xdist."""
NOBODY = pwd.getpwnam("nobody")
JOB = "4252"
DROPPED = ({"ok": False, "error": "TimeoutError"}, {"ok": False, "error": "OSError"})
"""No answer at all: the connection times out, or the guest's kernel gives up resolving the
peer's MAC first (EHOSTUNREACH after 3 s without an ARP answer); never refused, never served."""


def _grant(job: str = JOB, node: str = "n1", nodes: tuple[str, ...] = ("n1",)) -> Grant:
    return Grant("slurm", job, NOBODY.pw_uid, NOBODY.pw_gid, "nobody", node, nodes, 2, 512)


def _call(op: str, grant: Grant, **fields: Any) -> dict[str, Any]:
    req = protocol.check({"op": op, "job": grant.job, "node": grant.node, **fields}, network_ops.OPERATIONS)
    return network_ops.OPERATIONS[op].run(grant, req.fields)


# -- as data ---------------------------------------------------------------------------------------
def test_the_site_mac_is_fixed_per_vm_and_job() -> None:
    assert site_bridge.site_mac("slurm", "4252", 1) == "56:00:00:10:9c:01"
    assert site_bridge.site_mac("slurm", "4252", 2) == "56:00:00:10:9c:02"
    assert site_bridge.site_mac("slurm", str(4252 + 65535), 1) != site_bridge.site_mac("slurm", "4252", 1)
    hashed = site_bridge.site_mac("pbs", "12.server", 3)
    assert hashed.startswith("56:") and hashed.endswith(":03") and hashed == site_bridge.site_mac("pbs", "12.server", 3)
    first = int(hashed[:2], 16)
    assert first & 2 and not first & 1  # locally administered, unicast
    with pytest.raises(InputError, match="vm id 0"):
        site_bridge.site_mac("slurm", "1", 0)


def test_the_bridge_table_filters_each_site_tap() -> None:
    net = net_rules.job_net("slurm", JOB, "bridge")
    m1, m2 = site_bridge.site_mac("slurm", JOB, 1), site_bridge.site_mac("slurm", JOB, 2)
    text = site_bridge.ruleset(net, {1: m1, 2: m2})
    t1, t2 = net.site_tap(1), net.site_tap(2)
    assert t1 == f"{net.bridge}-s01" and len(t2) <= 15
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:3] == [
        f"table bridge {net.bridge}",
        f"delete table bridge {net.bridge}",
        f"table bridge {net.bridge} {{",
    ]
    for rule in (
        f'iifname "{t1}" ether saddr != {m1} drop',
        f'iifname "{t2}" ether saddr != {m2} drop',
        f'iifname "{t1}" ether type != {{ ip, ip6, arp }} drop',
        f'iifname "{t1}" arp saddr ether != {m1} drop',
        f'iifname "{t1}" udp sport 67 drop',
        f'iifname "{t1}" icmpv6 type nd-router-advert drop',
        f'iifname {{ "{t1}", "{t2}" }} drop',
        f'oifname "{t2}" ether daddr & 01:00:00:00:00:00 == 00:00:00:00:00:00 ether daddr != {m2} drop',
    ):
        assert rule in lines, rule
    hooks = [line for line in lines if line.startswith("type filter hook")]
    assert [h.split()[3] for h in hooks] == ["prerouting", "input", "forward"]
    with pytest.raises(InputError, match="no tap"):
        site_bridge.ruleset(net, {})


@pytest.mark.parametrize(
    ("guest", "error"),
    [
        ({"network": "bridge"}, 'network = "bridge" needs bridge'),
        ({"network": "bridge", "bridge": "br0;reboot"}, r"guest\.bridge = 'br0;reboot'"),
        ({"network": "bridge", "bridge": "b" * 16}, r"guest\.bridge = 'b{16}'"),
        ({"network": "bridge", "bridge": "-br0"}, r"guest\.bridge = '-br0'"),
        ({"network": "bridge", "bridge": "vjob-00ab"}, "not a job bridge"),
        ({"network": "nat", "bridge": "br0"}, "bridge = 'br0' is used only with network = \"bridge\""),
    ],
)
def test_a_bad_bridge_setting_is_refused_naming_field_and_value(guest: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse({"guest": guest})
    assert parse({"guest": {"network": "bridge", "bridge": "br0.12"}}).guest.bridge == "br0.12"


def test_the_service_checks_the_bridge_exists_and_is_one(tmp_path: Path) -> None:
    (tmp_path / "br0" / "bridge").mkdir(parents=True)
    (tmp_path / "eth0").mkdir()
    assert site_bridge.check_bridge("br0", "n1", str(tmp_path)) == "br0"
    with pytest.raises(InputError, match=r"\[guest\] bridge = 'br9': no such network interface on node n1"):
        site_bridge.check_bridge("br9", "n1", str(tmp_path))
    with pytest.raises(InputError, match=r"\[guest\] bridge = 'eth0': on node n1 it is not a Linux bridge"):
        site_bridge.check_bridge("eth0", "n1", str(tmp_path))
    with pytest.raises(InputError, match=r"\[guest\] bridge = '\.\./x'"):
        site_bridge.check_bridge("../x", "n1", str(tmp_path))


def _nic(job: str = JOB) -> site_network.SiteNic:
    sub = network.pilot_subnet_id("slurm", job)
    net = net_rules.JobNet(sub, "bridge")
    mac = network.pilot_addresses("slurm", job, ["a"])[0].mac
    ip = str(network.ip_address(sub, 1))
    smac = site_bridge.site_mac("slurm", job, 1)
    return site_network.SiteNic(1, net.tap(1), mac, ip, 24, str(net.gateway), (), net.bridge, net.site_tap(1), smac)


def test_the_vm_gets_its_job_nic_and_its_site_nic() -> None:
    nic = _nic()
    spec = VMSpec(name="vm", image=Path("/img"), nics=site_network.domain_nics(nic))
    root = ET.fromstring(domain_xml(spec, dom_type="qemu", overlay=Path("/o"), console_log=Path("/c")))
    ifaces = root.findall("./devices/interface")
    targets = [(i.find("target").get("dev"), i.find("mac").get("address")) for i in ifaces]  # type: ignore[union-attr]
    assert targets == [(nic.tap, nic.mac), (nic.site_tap, nic.site_mac)]
    assert {i.get("type") for i in ifaces} == {"ethernet"}
    assert site_network.domain_nics(dataclasses.replace(nic, site_tap="", site_mac="")) == (
        site_network.domain_nic(nic),
    )


def test_the_guest_agent_takes_the_bridged_nic_and_refuses_a_bad_one() -> None:
    nic = _nic()
    job = job_disk.JobDescription(b"#!/bin/sh\n", [], {}, 1000, 1000, "u", "/home/u", "/home/u/w", hostname="n1")
    parsed = agent.parse_job(dataclasses.replace(job, network=site_network.one_vm_network(nic, "n1")).to_json())
    assert parsed.network is not None and parsed.network.nat is None  # no route through the node
    assert parsed.network.bridged == site_net.Bridged(nic.site_mac, [])
    for bad, error in (
        ({"bridged": {"mac": nic.mac}}, "not network.mac"),
        ({"bridged": {"mac": "56:00:00:00:00:0G"}}, r"bridged\.mac"),
        ({"bridged": {"mac": nic.site_mac, "dns": ["x"] * 4}}, "at most 3"),
        ({"bridged": {"mac": nic.site_mac, "dns": ["1.2.3"]}}, r"network\.site\.bridged\.dns: '1\.2\.3'"),
        ({"bridged": "yes"}, "must be an object"),
    ):
        net = {**site_network.one_vm_network(nic, "n1"), "site": bad}
        with pytest.raises(agent.JobError, match=error):
            agent.parse_job(dataclasses.replace(job, network=net).to_json())


def test_the_services_site_fields_are_checked_by_the_pilot() -> None:
    sub = network.pilot_subnet_id("slurm", JOB)
    net = net_rules.JobNet(sub, "bridge")
    vm = {"vm_id": 1, "tap": net.tap(1), "mac": "52:54:00:00:00:01", "ip": str(network.ip_address(sub, 1))}
    good = {"bridge": net.bridge, "gateway": str(net.gateway), "dns": [], "site_bridge": "br0"}
    site_vm = {"site_tap": net.site_tap(1), "site_mac": site_bridge.site_mac("slurm", JOB, 1)}
    got = site_network._nics({**good, "vms": [{**vm, **site_vm}]}, [1], sub, ("slurm", JOB))[0]
    assert (got.site_tap, got.site_mac) == (site_vm["site_tap"], site_vm["site_mac"])
    assert site_network.site_fields(got) == {"bridged": {"mac": got.site_mac, "dns": []}}
    for wrong in ({"site_tap": "eth0"}, {"site_mac": "56:00:00:00:00:99"}):
        with pytest.raises(VjobError, match="not this job's"):
            site_network._nics({**good, "vms": [{**vm, **site_vm, **wrong}]}, [1], sub, ("slurm", JOB))


def _reply(xid: int, mac: str, kind: int, extra: bytes = b"") -> bytes:
    head = struct.pack("!BBBBIHH", 2, 1, 6, 0, xid, 0, 0x8000) + b"\0" * 4 + bytes([198, 18, 34, 120]) + b"\0" * 8
    opts = bytes([53, 1, kind, 1, 4, 255, 255, 255, 0, 3, 4, 198, 18, 34, 2, 6, 4, 198, 18, 33, 2, 51, 4, 0, 0, 0, 120])
    opts += bytes([54, 4, 198, 18, 34, 2]) + extra
    return head + bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0") + b"\0" * 192 + site_net.COOKIE + opts + b"\xff"


def test_dhcp_messages_and_answers() -> None:
    mac = "56:00:00:10:9c:01"
    discover = site_net.message(site_net.DISCOVER, 7, mac)
    assert (
        discover[:4] == b"\x01\x01\x06\x00"
        and discover[10:12] == b"\x80\x00"
        and discover[28:34].hex() == "560000109c01"
    )
    assert discover[236:240] == site_net.COOKIE and discover[240:243] == bytes([53, 1, 1])
    renew = site_net.message(site_net.REQUEST, 8, mac, ciaddr="198.18.34.120")
    assert renew[10:12] == b"\0\0" and renew[12:16] == bytes([198, 18, 34, 120])
    kind, lease = site_net.parse_reply(_reply(7, mac, site_net.ACK), 7, mac)  # type: ignore[misc]
    assert kind == site_net.ACK
    assert lease == site_net.Lease("198.18.34.120", 24, "198.18.34.2", ["198.18.33.2"], "198.18.34.2", 120, 60)
    assert site_net.parse_reply(_reply(7, mac, site_net.ACK), 8, mac) is None  # another transaction
    assert site_net.parse_reply(_reply(7, "56:00:00:00:00:02", site_net.ACK), 7, mac) is None  # another client
    assert site_net.parse_reply(_reply(7, mac, site_net.ACK, bytes([58, 9])), 7, mac) is None  # an option past the end
    assert site_net.parse_reply(b"\x02" * 300, 7, mac) is None


# -- real taps, rules and a DHCP lease; namespaces for the site and the guest ------------------------
@pytest.fixture
def lan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[sn.Site]:
    if os.geteuid() != 0:
        pytest.fail("makes bridges, taps and nftables rules: run as root (CI does)")
    monkeypatch.setattr(network_ops, "STATE_DIR", tmp_path / "net")
    s = sn.start()
    try:
        bridge = sn.operator_bridge(s, str(tmp_path))
        site.install(parse({"guest": {"network": "bridge", "bridge": bridge}}))
        yield s
    finally:
        for job in (JOB, str(int(JOB) + 1)):
            network_ops.teardown(net_rules.job_net("slurm", job))
        sn.stop(s)
        site.install(parse({}))


def _tables() -> str:
    return subprocess.run(["nft", "list", "tables", "bridge"], capture_output=True, text=True, check=True).stdout


def test_a_bridged_guest_is_a_site_host_and_reaches_nothing_of_the_node(lan: sn.Site) -> None:
    answer = _call("net.up", _grant(), vms=1, first_vm_id=1)
    net = net_rules.job_net("slurm", JOB, "bridge")
    vm = answer["vms"][0]
    assert answer["site_bridge"] == lan.lan_bridge and answer["mode"] == "bridge" and answer["dns"] == []
    assert (vm["site_tap"], vm["site_mac"]) == (net.site_tap(1), site_bridge.site_mac("slurm", JOB, 1))
    tap = Path("/sys/class/net") / vm["site_tap"]
    assert (tap / "owner").read_text().strip() == str(NOBODY.pw_uid)
    assert (tap / "master").resolve().name == lan.lan_bridge
    assert f"table bridge {net.bridge}" in _tables()
    assert f"-A {net.bridge}-out -j REJECT" in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    job_ip = str(network.ip_address(net.subnet_id, 1))
    guest = sn.bridged_guest(lan, "b", (net.bridge, job_ip, str(net.gateway)), vm["site_tap"], vm["site_mac"])
    # the site's DHCP: an address of the LAN, its router, its name server (the agent's own client)
    got = sn.in_ns(guest, "dhcp", "eth1", vm["site_mac"], str(network_ops.STATE_DIR.parent))
    site_ip = str(got["said"]).split()[3].split("/")[0]
    lo, hi = (ipaddress.IPv4Address(a) for a in sn.DHCP_RANGE)
    assert lo <= ipaddress.IPv4Address(site_ip) <= hi and f"via {sn.ROUTER_LAN_IP}" in str(got["said"]), got
    assert got["resolv"] == f"nameserver {sn.SITE_IP}\n"
    assert got["again"] == got["renewed"] == site_ip, got  # asked again and renewed: the same address
    # the licence server sees the guest's own address, and its name resolves
    licence = sn.in_ns(guest, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))
    assert licence["ok"] and str(licence["data"]).startswith(f"{sn.TOKEN} {site_ip} "), licence
    assert sn.in_ns(guest, "resolve", sn.SITE_IP, sn.LICENCE_NAME) == {"ok": True, "ip": sn.SITE_IP, "rcode": 0}
    # the node: its address on the operator's bridge is dropped before its stack; on the job's
    # bridge only the NFS port is open (a reset elsewhere)
    to_node = sn.in_ns(guest, "connect", sn.NODE_LAN_IP, str(lan.node_port))
    assert to_node in DROPPED, to_node
    on_gateway = sn.in_ns(guest, "connect", str(net.gateway), str(lan.node_port))
    assert on_gateway == {"ok": False, "error": "ConnectionRefusedError"}, on_gateway
    # the job NIC leads nowhere else: a route to the site through the node's gateway is refused
    subprocess.run(["ip", "-n", guest, "route", "add", f"{sn.SITE_PREFIX}.0/24", "via", str(net.gateway)], check=True)
    assert not sn.in_ns(guest, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))["ok"]
    subprocess.run(["ip", "-n", guest, "route", "del", f"{sn.SITE_PREFIX}.0/24"], check=True)
    assert sn.in_ns(guest, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))["ok"]
    # another source MAC: every frame dropped (the site's ARP entry of the guest is irrelevant)
    other_mac = site_bridge.site_mac("slurm", str(int(JOB) + 1), 1)
    subprocess.run(["ip", "-n", guest, "link", "set", "eth1", "address", other_mac], check=True)
    subprocess.run(["ip", "-n", lan.ns, "neigh", "flush", "dev", "lan0"], check=True)  # the site asks again
    spoofed = sn.in_ns(guest, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))
    assert spoofed in DROPPED, spoofed
    subprocess.run(["ip", "-n", guest, "link", "set", "eth1", "address", vm["site_mac"]], check=True)
    subprocess.run(["ip", "-n", lan.ns, "neigh", "flush", "dev", "lan0"], check=True)
    assert sn.in_ns(guest, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))["ok"]
    # net.down: the job's taps, bridge, chains and table gone; the operator's bridge stays
    removed = _call("net.down", _grant())["removed"]
    assert {net.site_tap(1), net.tap(1), net.bridge, f"bridge {net.bridge}"} <= set(removed), removed
    assert net.bridge not in _tables() and not tap.exists()
    assert (Path("/sys/class/net") / lan.lan_bridge / "bridge").is_dir()


class _Ended:
    def grant(self, job: str, node: str) -> Grant | None:
        return None


def test_the_sweep_removes_a_bridged_jobs_taps_and_table(lan: sn.Site) -> None:
    nodes = ("n1", "n2")
    _call("net.up", _grant(nodes=nodes), vms=1, first_vm_id=1)
    _call("net.up", _grant(node="n2", nodes=nodes), vms=1, first_vm_id=2)
    net = net_rules.job_net("slurm", JOB, "bridge")
    table = subprocess.run(["nft", "list", "table", "bridge", net.bridge], capture_output=True, text=True).stdout
    assert net.site_tap(1) in table and net.site_tap(2) in table
    # one node leaves: its tap and its rules go, the other's stay
    assert _call("net.down", _grant(node="n2", nodes=nodes))["removed"] == [net.tap(2), net.site_tap(2)]
    table = subprocess.run(["nft", "list", "table", "bridge", net.bridge], capture_output=True, text=True).stdout
    assert net.site_tap(1) in table and net.site_tap(2) not in table
    network_ops._path(net.bridge).unlink()  # a record lost: the objects are still the service's
    removed = network_ops.sweep(_Ended(), subnets={net.subnet_id})
    assert {net.site_tap(1), net.bridge, f"bridge {net.bridge}"} <= set(removed), removed
    own = network_ops.own_objects()
    assert not [n for n in own["links"] + own["chains"] + own["tables"] if net.bridge in n]


def test_net_up_refuses_a_missing_operator_bridge_before_touching_the_node(lan: sn.Site) -> None:
    site.install(parse({"guest": {"network": "bridge", "bridge": "vjnobr0"}}))
    with pytest.raises(InputError, match=r"\[guest\] bridge = 'vjnobr0': no such network interface on node n1"):
        _call("net.up", _grant(), vms=1, first_vm_id=1)
    site.install(parse({"guest": {"network": "bridge", "bridge": "lo"}}))
    with pytest.raises(InputError, match=r"\[guest\] bridge = 'lo': on node n1 it is not a Linux bridge"):
        _call("net.up", _grant(), vms=1, first_vm_id=1)
    assert not Path(f"/sys/class/net/{net_rules.job_net('slurm', JOB).bridge}").exists()
