"""Saline's NAT interface (paper 3.2): a second NIC per VM on one NAT network of every node.

VMs on libvirt's test driver (provisioning's test-driver nodes n1 and n2, one vm_dir for both
so a saved state restores on either): the NICs and job.json as the manager deploys them, and
after a resume on the other node. The guest agent's part (address, default route,
resolv.conf) runs for real, as root, in a network namespace of its own on a veth NIC.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning import nat, network
from provisioning.domain_xml import domain_xml
from provisioning.guest_agent import agent
from provisioning.vm_types import Nic, VMSpec
from saline_bew import deployment, identity, journal, snapshots
from saline_bew.manager import Manager
from tests.saline_env import FakeOar, stand_in_manager
from tests.test_saline_manager import _killed_by_oar, _real_image, _running_again
from vjob.config import parse
from vjob.errors import ConfigError, VjobError

NAT = {"nat_network": "vjnat", "nat_range": "100.64.0.0/10", "nat_mac_prefix": "52:54:01"}
GATEWAY = "100.64.0.1"


@pytest.fixture
def nat_manager(tmp_path: Path, test_nodes: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    monkeypatch.setattr(network, "_link_exists", lambda _name, _host=None: False)  # whatever bridges this host has
    with FakeOar() as oar, stand_in_manager(tmp_path, test_nodes, oar, vm_dir=str(tmp_path / "vms"), saline=NAT) as m:
        yield m


def _nics(manager: Manager, vm: str, node: str) -> list[tuple[str, str, str, bool]]:
    """(MAC, type, bridge or network, isolated) of every NIC of `vm` as libvirt on `node` has it."""
    root = ET.fromstring(manager.ports.vms.driver.connection(node).lookupByName(vm).XMLDesc(0))
    out = []
    for nic in root.findall("./devices/interface"):
        kind = nic.get("type") or ""
        port = nic.find("port")
        source = nic.find("source")
        mac = nic.find("mac")
        assert source is not None and mac is not None
        out.append(
            (mac.get("address") or "", kind, source.get(kind) or "", port is not None and port.get("isolated") == "yes")
        )
    return out


def _nat_networks(manager: Manager, node: str) -> list[str]:
    return [n.XMLDesc(0) for n in manager.ports.vms.driver.connection(node).listAllNetworks() if n.name() == "vjnat"]


def _job_json(manager: Manager, vm: str, node: str, tmp_path: Path) -> dict[str, object]:
    raw = tmp_path / f"{vm}-{node}.raw"
    disk = manager.ports.vms.driver.job_disk_path(vm, node)
    subprocess.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], check=True, timeout=60)
    debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
    shown = subprocess.run(
        [debugfs, "-R", "cat /.vjob/job.json", str(raw)], capture_output=True, check=True, timeout=30
    )
    raw.unlink()
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


@pytest.mark.libvirt
def test_each_vm_has_its_nat_nic_and_job_json_and_keeps_both_across_a_resume_on_the_other_node(
    nat_manager: Manager, tmp_path: Path
) -> None:
    """A 2-VM vjob on a real image: each domain has the private NIC first (vjob's bridge) and
    the NAT NIC second (the libvirt network `vjnat`, isolated port), both with MACs derived
    from subnetID/vmID; each job.json carries the NAT address, prefix, gateway and DNS. The
    NAT network is defined once on the node (persistent, autostarted, gateway address and MAC
    pinned), stays when the vjob is killed off the node, and is defined on the other node at
    the resume, where both NICs and job.json come back unchanged."""
    manager = nat_manager
    _real_image(manager, tmp_path)
    job = journal.create(
        manager.ports.store,
        key="be0123456789",
        user="nobody",
        image="real",
        command=["true"],
        vm_count=2,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    assert manager.ports.lease(job.key)
    journal.record(manager.ports.store, job.key, "test", oar_job_id="1")
    assert _nat_networks(manager, "n1") == []
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
    ids = identity.assign(
        manager.ports.store,
        site="a",
        job_key=job.key,
        vm_names=job.vm_names,
        mac_prefix="52:54:00",
        network="10.0.0.0/8",
    )
    bridge = network.bridge_name(ids[0].subnet_id, network.SALINE_FAMILY)
    expected = {}
    described = {}
    for ident in ids:
        nat_mac = f"52:54:01:{ident.subnet_id >> 8:02x}:{ident.subnet_id & 0xFF:02x}:{ident.vm_id:02x}"
        nat_ip = str(ipaddress.IPv4Address(GATEWAY) - 1 + (ident.subnet_id << 8) + ident.vm_id)
        expected[ident.vm_name] = [(ident.mac, "bridge", bridge, False), (nat_mac, "network", "vjnat", True)]
        assert _nics(manager, ident.vm_name, "n1") == expected[ident.vm_name]
        described[ident.vm_name] = _job_json(manager, ident.vm_name, "n1", tmp_path)
        net = described[ident.vm_name]["network"]
        assert isinstance(net, dict) and net["mac"] == ident.mac
        assert net["nat"] == {"mac": nat_mac, "ip": nat_ip, "prefix": 10, "gateway": GATEWAY, "dns": [GATEWAY]}
        cmdline = ET.fromstring(manager.ports.vms.driver.connection("n1").lookupByName(ident.vm_name).XMLDesc(0))
        assert f"saline.nat_ip={nat_ip}" in (cmdline.findtext("./os/cmdline") or "")
        agent.parse_network(net)  # what the guest would accept
    assert len({n[1][0] for n in expected.values()}) == 2, "two VMs, one NAT MAC"

    (defined,) = _nat_networks(manager, "n1")
    root = ET.fromstring(defined)
    assert root.find("forward").get("mode") == "nat"  # type: ignore[union-attr]
    assert root.find("ip").get("address") == GATEWAY and root.find("ip").get("prefix") == "10"  # type: ignore[union-attr]
    assert root.find("mac").get("address") == "52:54:01:00:00:00"  # type: ignore[union-attr]
    assert root.find("ip/dhcp") is None, "static addresses: no DHCP"
    assert root.find("dns") is None, "no nat_dns: libvirt's DNS on the gateway, the guests' name server"
    told = nat.NatNetwork("vjnat", ipaddress.IPv4Network("100.64.0.0/10"), "52:54:01", ("9.9.9.9",))
    assert ET.fromstring(nat.network_xml(told)).find("dns").get("enable") == "no"  # type: ignore[union-attr]
    assert told.guest(1, 1)["dns"] == ["9.9.9.9"]
    conn = manager.ports.vms.driver.connection("n1")
    assert conn.networkLookupByName("vjnat").isPersistent() and conn.networkLookupByName("vjnat").autostart()
    assert nat.ensure(conn, manager.ports.vms.nat) is False  # type: ignore[arg-type]
    manager.ports.vms.network_up(ids[0].subnet_id, ["n1", "n1"])
    assert _nat_networks(manager, "n1") == [defined], "defined once: a second deployment changes nothing"

    job = journal.get(manager.ports.store, job.key)
    assert snapshots.snapshot(manager.ports, job, reason="periodic")
    manager._ended(journal.get(manager.ports.store, job.key), _killed_by_oar(job))  # killed, then submitted again
    assert conn.networkLookupByName("vjnat").isActive(), "the NAT network is every vjob's: it stays"
    assert bridge not in {n.name() for n in conn.listAllNetworks() if n.isActive()}
    assert _nat_networks(manager, "n2") == []
    deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n2"))
    assert journal.events(manager.ports.store, job.key)[-1].kind == "resumed"
    assert len(_nat_networks(manager, "n2")) == 1
    for ident in ids:
        assert _nics(manager, ident.vm_name, "n2") == expected[ident.vm_name]
        assert _job_json(manager, ident.vm_name, "n2", tmp_path) == described[ident.vm_name]


@pytest.mark.libvirt
def test_a_tiny_guest_gets_the_nat_nic_too_and_without_nat_network_there_is_none(
    tmp_path: Path, test_nodes: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct-boot guest (no network stack) has the second NIC all the same; with
    `nat_network` empty (the default) a VM has its private NIC only, as before."""
    monkeypatch.setattr(network, "_link_exists", lambda _name, _host=None: False)
    for saline, count in ((NAT, 2), ({}, 1)):
        where = tmp_path / str(count)
        where.mkdir()
        with FakeOar() as oar, stand_in_manager(where, test_nodes, oar, saline=saline) as manager:
            job = journal.create(
                manager.ports.store,
                key="be0123456789",
                user="nobody",
                image="empty",
                command=["true"],
                vm_count=1,
                vcpus=1,
                memory_mb=128,
                walltime="1:00:00",
                site="a",
            )
            assert manager.ports.lease(job.key)
            journal.record(manager.ports.store, job.key, "test", oar_job_id="1")
            deployment.deploy(manager.ports, journal.get(manager.ports.store, job.key), _running_again(job, "n1"))
            nics = _nics(manager, job.vm_names[0], "n1")
            assert len(nics) == count and nics[0][1:3] == ("bridge", "vsal-0001")
            assert (count == 2) == bool(_nat_networks(manager, "n1"))
            manager.cancel(job.key)


@pytest.mark.libvirt
def test_an_existing_nat_network_is_used_as_it_is_unless_its_gateway_is_another(
    nat_manager: Manager,
) -> None:
    """An operator's network of that name without a host address (a bridge of theirs) is used
    as it is and started; one whose gateway is not the range's is refused, naming both keys."""
    conn = nat_manager.ports.vms.driver.connection("n1")
    want = nat_manager.ports.vms.nat
    assert want is not None
    theirs = conn.networkDefineXML(
        "<network><name>vjnat</name><forward mode='bridge'/><bridge name='br-out'/></network>"
    )
    assert nat.ensure(conn, want) is False
    assert theirs.isActive() and "br-out" in conn.networkLookupByName("vjnat").XMLDesc(0)
    elsewhere = nat_manager.ports.vms.driver.connection("n2")
    elsewhere.networkDefineXML(
        "<network><name>vjnat</name><forward mode='nat'/><ip address='192.168.122.1' prefix='24'/></network>"
    )
    with pytest.raises(
        VjobError, match=r"saline.nat_network = 'vjnat'.*192.168.122.1.*saline.nat_range = '100.64.0.0/10'"
    ):
        nat.ensure(elsewhere, want)
    assert not elsewhere.networkLookupByName("vjnat").isActive(), "a refused network is not started"


def test_bad_nat_settings_are_refused_naming_the_key_and_value() -> None:
    for saline, message in (
        ({"nat_network": "vsal-0001"}, r"saline.nat_network = 'vsal-0001'.*not start vjob-/vsal-"),
        ({"nat_network": "a-name-too-long-for-a-bridge"}, r"saline.nat_network = 'a-name-too-long"),
        ({"nat_network": "out;rm"}, r"saline.nat_network = 'out;rm'"),
        ({"nat_range": "100.64.0.0/24"}, r"saline.nat_range = '100.64.0.0/24'.*/8 to /16"),
        ({"nat_range": "100.64.0.1/10"}, r"saline.nat_range = '100.64.0.1/10'.*not an IPv4 network"),
        ({"nat_network": "vjnat", "nat_range": "10.128.0.0/9"}, r"nat_range = '10.128.0.0/9': overlaps network"),
        ({"nat_network": "vjnat", "nat_mac_prefix": "52:54:00"}, r"nat_mac_prefix = '52:54:00': must differ"),
        ({"nat_dns": ["8.8.8.8", "resolver"]}, r"saline.nat_dns.*'resolver': not an IPv4 address"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse({"saline": saline})
    small = nat.NatNetwork("vjnat", ipaddress.IPv4Network("100.64.0.0/16"), "52:54:01")
    assert str(small.address(255, 254)) == "100.64.255.254"
    with pytest.raises(ConfigError, match=r"saline.nat_range = '100.64.0.0/16': holds subnetIDs 1..255.*256"):
        small.address(256, 1)


def test_the_domain_lists_the_nics_in_order_with_the_nat_port_isolated(tmp_path: Path) -> None:
    outside = Nic("52:54:01:00:01:01", "vjnat", kind="network", isolated=True)
    spec = VMSpec("v", tmp_path / "i.qcow2", nics=(Nic("52:54:00:00:01:01", "vsal-0001"), outside))
    root = ET.fromstring(domain_xml(spec, dom_type="qemu", overlay=tmp_path / "o", console_log=tmp_path / "c"))
    nics = root.findall("./devices/interface")
    assert [n.get("type") for n in nics] == ["bridge", "network"]
    assert nics[0].find("source").get("bridge") == "vsal-0001" and nics[0].find("port") is None  # type: ignore[union-attr]
    assert nics[1].find("source").get("network") == "vjnat"  # type: ignore[union-attr]
    assert nics[1].find("port").get("isolated") == "yes"  # type: ignore[union-attr]
    with pytest.raises(Exception, match="nic kind = 'direct'"):
        Nic("52:54:01:00:01:01", "eth0", kind="direct")
    with pytest.raises(Exception, match="nic mac"):
        Nic("52:54:01:00:01", "vjnat")


def _guest_net(**nat_fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "mac": "52:54:01:00:01:01",
        "ip": "100.64.1.1",
        "prefix": 10,
        "gateway": GATEWAY,
        "dns": [GATEWAY],
    }
    return {
        "mac": "52:54:00:00:01:01",
        "ip": "10.0.1.1",
        "prefix": 24,
        "peers": [["10.0.1.1", "vm0"]],
        "leader": True,
        "nat": base | nat_fields,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mac", "52:54:00:00:01:01"),  # the private NIC's
        ("mac", "52:54:01:00:01:01\n"),
        ("ip", "100.64.1.1; reboot"),
        ("prefix", 31),
        ("prefix", True),
        ("gateway", "192.168.1.1"),  # not on the NIC's network: no route to it
        ("gateway", "100.64.1.1"),  # the NIC's own address
        ("dns", []),
        ("dns", ["100.64.0.1\nnameserver 6.6.6.6"]),
        ("dns", ["1.1.1.1"] * 4),
    ],
)
def test_a_hostile_nat_in_job_json_is_refused_by_field(field: str, value: object) -> None:
    with pytest.raises(agent.JobError, match=f"network.nat.{field}"):
        agent.parse_network(_guest_net(**{field: value}))


_IN_NAMESPACE = """
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from provisioning.guest_agent import agent
subprocess.run(["mount", "-t", "sysfs", "sysfs", "/sys"], check=True)  # this namespace's interfaces
subprocess.run(["ip", "link", "add", "eth7", "address", "52:54:01:00:01:01", "type", "veth", "peer", "name", "p7"],
               check=True)
subprocess.run(["ip", "link", "set", "p7", "up"], check=True)  # the host's end of the guest's NIC
etc = Path(sys.argv[2])
net = agent.parse_network(json.loads(sys.argv[3]))
print(json.dumps([agent.setup_nat(net.nat, etc), agent.setup_nat(net.nat, etc)]))
for what in (["addr", "show", "eth7"], ["route", "show"]):
    print(subprocess.run(["ip", "-j", "-4", *what], capture_output=True, text=True, check=True).stdout.strip())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root (a network namespace)")
def test_the_guest_agent_sets_the_nat_address_default_route_and_resolv_conf(tmp_path: Path) -> None:
    """The agent's ioctls (no iproute2 in the image) on a veth NIC with the NAT MAC, in a
    network namespace of its own: the address and /10, the default route via the gateway,
    resolv.conf replaced (a link planted there is not followed); a second run changes nothing."""
    etc = tmp_path / "etc"
    etc.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    (etc / "resolv.conf").symlink_to(target)
    root = str(Path(agent.__file__).parents[2])
    shown = subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            sys.executable,
            "-I",
            "-c",
            _IN_NAMESPACE,
            root,
            str(etc),
            json.dumps(_guest_net(dns=["100.64.0.1", "9.9.9.9"])),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    names, addrs, routes = (json.loads(line) for line in shown.stdout.splitlines())
    assert names == ["eth7", "eth7"]
    assert [(a["local"], a["prefixlen"]) for a in addrs[0]["addr_info"]] == [("100.64.1.1", 10)]
    assert {"dst": "default", "gateway": GATEWAY, "dev": "eth7"}.items() <= routes[0].items(), routes
    assert (etc / "resolv.conf").read_text() == "nameserver 100.64.0.1\nnameserver 9.9.9.9\n"
    assert not (etc / "resolv.conf").is_symlink() and target.read_text() == "untouched\n"
