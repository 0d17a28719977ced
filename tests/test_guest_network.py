"""The guests' network to the site (issue 33, item 3): the node service's net.up/net.down.

Unit tests check the rules as data (no side effect); the root-side test makes real bridges,
taps and iptables chains, with network namespaces standing in for guests and for the site
(tests/services/site_network.py): a guest reaches the site's licence server through NAT (from
an unprivileged source port, whatever port it bound), resolves the licence server's name, and
reaches neither the node's listener (on its gateway or on the node's site address), nor another
job's guest, nor the site with a forged source. Cleanup must leave nothing.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot import site_network
from provisioning import job_disk, network
from provisioning.domain_xml import domain_xml
from provisioning.guest_agent import agent
from provisioning.node_service import net_rules, network_ops, protocol, site
from provisioning.node_service.grant import Grant
from provisioning.node_service.server import NodeService
from provisioning.vm_types import VMSpec
from tests.as_user import as_nobody
from tests.services import site_network as sn
from vjob.config.composed import parse
from vjob.errors import InputError, VjobError

pytestmark = pytest.mark.host_network
"""Real bridges, taps and firewall rules in this host's namespace, and sweeps that remove what they
do not claim: one module of this marker at a time (tests/conftest.py), even under pytest-xdist."""
NOBODY = pwd.getpwnam("nobody")


def _grant(job: str, node: str = "n1", nodes: tuple[str, ...] = ("n1",), uid: int = NOBODY.pw_uid) -> Grant:
    return Grant("slurm", job, uid, NOBODY.pw_gid, "nobody", node, nodes, 2, 512)


def _call(op: str, grant: Grant, **fields: Any) -> dict[str, Any]:
    """The operation as the service runs it: the request checked by the protocol's rules first."""
    req = protocol.check({"op": op, "job": grant.job, "node": grant.node, **fields}, network_ops.OPERATIONS)
    return network_ops.OPERATIONS[op].run(grant, req.fields)


# -- rules as data -----------------------------------------------------------------------------
def test_a_jobs_names_and_addresses_follow_its_subnet() -> None:
    net = net_rules.job_net("slurm", "4242")
    sub = network.pilot_subnet_id("slurm", "4242")
    assert net.bridge == f"vjob-{sub:04x}" and net.tap(1) == f"vjob-{sub:04x}-t01" and len(net.tap(253)) <= 15
    assert str(net.gateway) == f"10.{sub >> 8}.{sub & 255}.254" and str(net.subnet) == f"10.{sub >> 8}.{sub & 255}.0/24"
    assert net.gateway_mac == f"52:54:00:{sub >> 8:02x}:{sub & 255:02x}:fe"
    with pytest.raises(InputError, match="vm id 254"):
        net.tap(254)


def test_the_firewall_text_holds_every_rule_in_the_jobs_chains() -> None:
    net = net_rules.job_net("slurm", "7")
    b, s, g = net.bridge, str(net.subnet), str(net.gateway)
    text = net_rules.restore_text(net)
    assert text.startswith(f"*filter\n:{b}-in - [0:0]\n:{b}-out - [0:0]\n:{b}-back - [0:0]\n")
    for line in (
        f"-A {b}-in ! -s {s} -j DROP",
        f"-A {b}-in -d {g} -p tcp --dport {net_rules.NFS_PORT} -j ACCEPT",
        f"-A {b}-in -p tcp -j REJECT --reject-with tcp-reset",
        f"-A {b}-out ! -s {s} -j DROP",
        f"-A {b}-out -o {b} -j ACCEPT",
        f"-A {b}-out -o vjob-+ -j DROP",
        f"-A {b}-out -o vsal-+ -j DROP",
        f"-A {b}-out -j ACCEPT",
        f"-A {b}-back -i {b} -j RETURN",
        f"-A {b}-back -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A {b}-nat -p tcp -j MASQUERADE --to-ports 1024-65535",
    ):
        assert line in text.splitlines(), line
    lines = text.splitlines()
    assert lines.index(f"-A {b}-out -o vjob-+ -j DROP") < lines.index(f"-A {b}-out -j ACCEPT")
    assert lines[-1] == "COMMIT" and lines.count("COMMIT") == 2
    assert net_rules.jumps(net)[0] == ("filter", "INPUT", ["-i", b, "-j", f"{b}-in"])
    insert = net_rules.jump_insert("nat", "POSTROUTING", ["-s", s, "-j", f"{b}-nat"])
    assert insert == ["iptables", "-w", "5", "-t", "nat", "-I", "POSTROUTING", "1", "-s", s, "-j", f"{b}-nat"]


def test_network_none_and_bridge_forward_nothing_from_the_job_bridge() -> None:
    for mode in ("none", "bridge"):  # "bridge": the site is reached on the second NIC (test_guest_network_bridge)
        net = net_rules.job_net("slurm", "7", mode)
        assert net_rules.out_rules(net)[-1][:2] == ["-j", "REJECT"] and net_rules.nat_rules(net) == []
    with pytest.raises(InputError, match=r"\[guest\] network = 'macvtap'"):
        net_rules.job_net("slurm", "7", "macvtap")


def test_tap_and_bridge_commands() -> None:
    net = net_rules.job_net("slurm", "9")
    assert net_rules.tap_add(net, 2, 1234) == ["ip", "tuntap", "add", "dev", net.tap(2), "mode", "tap", "user", "1234"]
    assert net_rules.tap_attach(net, 2)[-3:] == ["master", net.bridge, "up"]
    assert ["ip", "addr", "replace", f"{net.gateway}/24", "dev", net.bridge] in net_rules.bridge_setup(net)
    assert net_rules.sysctls(net.bridge)[f"net/ipv6/conf/{net.bridge}/disable_ipv6"] == "1"


@pytest.mark.parametrize(
    ("first", "vms", "nodes", "error"),
    [
        (1, 1, 1, ""),
        (2, 1, 2, ""),
        (1, 2, 2, ""),
        (2, 2, 2, "vmIDs 2..3"),
        (1, 65, 80, "1..64"),
        (251, 4, 254, "vmIDs 251..254"),
    ],
)
def test_vm_ids_stay_within_the_jobs_nodes(first: int, vms: int, nodes: int, error: str) -> None:
    if not error:
        assert net_rules.vm_ids(first, vms, nodes) == list(range(first, first + vms))
        return
    with pytest.raises(InputError, match=error):
        net_rules.vm_ids(first, vms, nodes)


def test_name_servers_from_config_or_the_nodes_resolv_conf() -> None:
    resolv = "# x\nnameserver 127.0.0.53\nnameserver 10.1.2.3\nnameserver ::1\nnameserver 10.1.2.3\nsearch a\n"
    assert net_rules.name_servers([], resolv) == ["10.1.2.3"]
    assert net_rules.name_servers(["192.0.2.9"], resolv) == ["192.0.2.9"]
    assert net_rules.name_servers([], "nameserver 127.0.0.1\n") == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"vms": 0, "first_vm_id": 1}, "field 'vms': 0 is outside"),
        ({"vms": True, "first_vm_id": 1}, "field 'vms': True is not an integer"),
        ({"vms": 1, "first_vm_id": 254}, "field 'first_vm_id': 254 is outside"),
        ({"vms": 1}, "field 'first_vm_id' is missing"),
        ({"vms": 1, "first_vm_id": 1, "bridge": "eth0"}, "field 'bridge' = 'eth0': unknown"),
    ],
)
def test_net_up_requests_are_checked_before_anything_runs(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=error):
        protocol.check({"op": "net.up", "job": "1", "node": "n1", **fields}, network_ops.OPERATIONS)


def test_net_up_refuses_more_vms_than_the_job_has_nodes_before_touching_the_node() -> None:
    site.install(parse({"guest": {"network": "nat"}}))
    with pytest.raises(InputError, match="holds 1 node"):
        _call("net.up", _grant("5"), vms=2, first_vm_id=1)
    assert not Path(f"/sys/class/net/{net_rules.job_net('slurm', '5').bridge}").exists()


# -- real links and rules, namespaces for guests and the site -----------------------------------
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="makes bridges, taps and iptables rules: root")


@pytest.fixture
def site_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[sn.Site]:
    monkeypatch.setattr(network_ops, "STATE_DIR", tmp_path / "net")
    site.install(parse({"guest": {"network": "nat", "dns": [sn.SITE_IP]}}))
    s = sn.start()
    try:
        yield s
    finally:
        sn.stop(s)
        for job in ("4242", "4243", str(4242 + 65535)):
            network_ops.teardown(net_rules.job_net("slurm", job))


def _iptables(table: str) -> str:
    return subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True).stdout


@root_only
def test_net_up_and_down_make_and_remove_a_jobs_network(site_net: sn.Site) -> None:
    grant = _grant("4242", nodes=("n1", "n2"))
    net = net_rules.job_net("slurm", "4242")
    answer = _call("net.up", grant, vms=2, first_vm_id=1)
    assert answer["bridge"] == net.bridge and answer["gateway"] == str(net.gateway) and answer["dns"] == [sn.SITE_IP]
    assert [v["tap"] for v in answer["vms"]] == [net.tap(1), net.tap(2)]
    assert answer["vms"][0]["mac"] == network.pilot_addresses("slurm", "4242", ["a"])[0].mac
    again = _call("net.up", grant, vms=2, first_vm_id=1)  # idempotent: the same, nothing doubled
    assert again == answer
    sys_net = Path("/sys/class/net")
    assert (sys_net / net.tap(1) / "owner").read_text().strip() == str(NOBODY.pw_uid)
    assert (sys_net / net.tap(1) / "master").resolve().name == net.bridge
    addr = subprocess.run(["ip", "addr", "show", "dev", net.bridge], capture_output=True, text=True).stdout
    assert f"inet {net.gateway}/24" in addr and "inet6" not in addr
    filt, nat = _iptables("filter"), _iptables("nat")
    assert filt.count(f"-A FORWARD -i {net.bridge} -j {net.bridge}-out") == 1
    assert f"-A INPUT -i {net.bridge} -j {net.bridge}-in" in filt
    assert f"-A POSTROUTING -s {net.subnet} -j {net.bridge}-nat" in nat
    # a partial down (node n2 never asked) keeps it; this node's down removes everything
    assert _call("net.down", _grant("4242", node="n2", nodes=("n1", "n2")))["removed"] == []
    removed = _call("net.down", grant)["removed"]
    assert set(removed) >= {net.tap(1), net.tap(2), net.bridge, f"{net.bridge}-in", f"{net.bridge}-nat"}
    assert not (sys_net / net.bridge).exists() and net.bridge not in _iptables("filter") + _iptables("nat")
    assert not list((network_ops.STATE_DIR).glob("*.json"))
    assert _call("net.down", grant) == {"removed": []}


@root_only
def test_two_nodes_of_one_job_share_its_bridge_until_the_last_leaves(site_net: sn.Site) -> None:
    nodes = ("n1", "n2")
    net = net_rules.job_net("slurm", "4242")
    _call("net.up", _grant("4242", "n1", nodes), vms=1, first_vm_id=1)
    _call("net.up", _grant("4242", "n2", nodes), vms=1, first_vm_id=2)
    assert _call("net.down", _grant("4242", "n1", nodes))["removed"] == [net.tap(1)]
    assert Path(f"/sys/class/net/{net.tap(2)}").exists()
    assert net.bridge in _call("net.down", _grant("4242", "n2", nodes))["removed"]
    # another job on the same subnet number (ids 65535 apart) is refused while this one holds it
    _call("net.up", _grant("4242"), vms=1, first_vm_id=1)
    with pytest.raises(InputError, match="held on this node by slurm job 4242"):
        _call("net.up", _grant(str(4242 + 65535)), vms=1, first_vm_id=1)


class _Ended:
    def grant(self, job: str, node: str) -> Grant | None:
        return None


@root_only
def test_sweep_removes_the_network_of_ended_jobs_and_unclaimed_objects(site_net: sn.Site) -> None:
    net = net_rules.job_net("slurm", "4242")
    _call("net.up", _grant("4242"), vms=1, first_vm_id=1)
    other = net_rules.job_net("slurm", "4243")
    _call("net.up", _grant("4243"), vms=1, first_vm_id=1)
    network_ops._path(other.bridge).unlink()  # a record lost: the objects are still the service's
    removed = network_ops.sweep(_Ended(), subnets={net.subnet_id, other.subnet_id})  # never a live service's
    assert {net.bridge, net.tap(1), other.bridge, other.tap(1), f"{other.bridge}-in"} <= set(removed)
    own = network_ops.own_objects()
    assert not [n for n in own["links"] + own["chains"] if n.startswith((net.bridge, other.bridge))]


@root_only
def test_a_guest_reaches_the_site_and_nothing_of_the_node_or_other_jobs(site_net: sn.Site) -> None:
    nets = {}
    for job in ("4242", "4243"):
        _call("net.up", _grant(job, nodes=("n1", "n2")), vms=1, first_vm_id=1)
        nets[job] = net_rules.job_net("slurm", job)
    _call("net.up", _grant("4242", "n2", ("n1", "n2")), vms=1, first_vm_id=2)  # its second node's VM
    a, b = nets["4242"], nets["4243"]
    ip_a, ip_b = str(network.ip_address(a.subnet_id, 1)), str(network.ip_address(b.subnet_id, 1))
    ga = sn.guest_ns(site_net, "a", a.bridge, ip_a, str(a.gateway))
    gb = sn.guest_ns(site_net, "b", b.bridge, ip_b, str(b.gateway))
    # the site, through NAT: the licence server sees the node's site address, never port < 1024
    licence = sn.in_ns(ga, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))
    assert licence["ok"] and str(licence["data"]).startswith(f"{sn.TOKEN} {sn.HOST_IP} "), licence
    low = sn.in_ns(ga, "connect", sn.SITE_IP, str(sn.LICENCE_PORT), ip_a, "700")
    assert low["ok"] and int(str(low["data"]).split()[2]) >= 1024, low
    assert sn.in_ns(ga, "resolve", sn.SITE_IP, sn.LICENCE_NAME) == {"ok": True, "ip": sn.SITE_IP, "rcode": 0}
    # the node's own services: refused on the gateway and on the node's site address
    for host in (str(a.gateway), sn.HOST_IP):
        assert sn.in_ns(ga, "connect", host, str(site_net.node_port)) == {
            "ok": False,
            "error": "ConnectionRefusedError",
        }
    # the job's own other VM: reached (no listener: a reset, not a drop), and it too reaches the site
    a2 = sn.guest_ns(site_net, "c", a.bridge, str(network.ip_address(a.subnet_id, 2)), str(a.gateway))
    own = sn.in_ns(ga, "connect", str(network.ip_address(a.subnet_id, 2)), "22")
    assert own == {"ok": False, "error": "ConnectionRefusedError"}, own
    assert sn.in_ns(a2, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))["ok"]
    # another job's guest: dropped (its server would answer, a timeout shows the drop)
    other = sn.in_ns(ga, "connect", ip_b, "22")
    assert other == {"ok": False, "error": "TimeoutError"}, other
    # a forged source (job b's address) never reaches the site
    subprocess.run(["ip", "-n", ga, "addr", "add", f"{ip_b}/32", "dev", "eth0"], check=True)
    forged = sn.in_ns(ga, "connect", sn.SITE_IP, str(sn.LICENCE_PORT), ip_b)
    assert forged == {"ok": False, "error": "TimeoutError"}, forged
    assert sn.in_ns(gb, "connect", sn.SITE_IP, str(sn.LICENCE_PORT))["ok"]
    for job in nets:
        _call("net.down", _grant(job, nodes=("n1", "n2")))
    _call("net.down", _grant("4242", "n2", ("n1", "n2")))
    assert not [n for n in network_ops.own_objects()["links"] if n.startswith((a.bridge, b.bridge))]


# -- the pilot's side -----------------------------------------------------------------------------
def _nic(job: str = "4242") -> site_network.SiteNic:
    sub = network.pilot_subnet_id("slurm", job)
    net = net_rules.JobNet(sub)
    ip = str(network.ip_address(sub, 1))
    mac = network.pilot_addresses("slurm", job, ["a"])[0].mac
    return site_network.SiteNic(1, net.tap(1), mac, ip, 24, str(net.gateway), (sn.SITE_IP,), net.bridge)


def test_the_vm_plugs_into_its_tap_unmanaged() -> None:
    nic = _nic()
    spec = VMSpec(name="vm", image=Path("/img"), nics=(site_network.domain_nic(nic),))
    root = ET.fromstring(domain_xml(spec, dom_type="qemu", overlay=Path("/o"), console_log=Path("/c")))
    iface = root.find("./devices/interface")
    assert iface is not None and iface.get("type") == "ethernet" and iface.find("source") is None
    assert iface.find("target").attrib == {"dev": nic.tap, "managed": "no"}  # type: ignore[union-attr]
    assert iface.find("mac").get("address") == nic.mac  # type: ignore[union-attr]


def test_a_one_vm_jobs_network_is_what_the_guest_agent_accepts() -> None:
    nic = _nic()
    job = job_disk.JobDescription(b"#!/bin/sh\n", [], {}, 1000, 1000, "u", "/home/u", "/home/u/w", hostname="Node1")
    parsed = agent.parse_job(dataclasses.replace(job, network=site_network.one_vm_network(nic, "Node1")).to_json())
    assert parsed.network is not None and parsed.network.peers == [(nic.ip, "node1")] and parsed.network.leader
    nat = parsed.network.nat
    assert nat is not None and (nat.mac, nat.ip, nat.gateway, nat.dns) == (nic.mac, nic.ip, nic.gateway, [sn.SITE_IP])
    bad = site_network.one_vm_network(dataclasses.replace(nic, gateway="10.9.9.254"), "n1")
    with pytest.raises(agent.JobError, match=r"network\.site\.gateway: 10\.9\.9\.254: must be another address"):
        agent.parse_job(dataclasses.replace(job, network=bad).to_json())


def test_the_services_answer_is_checked_against_the_jobs_subnet() -> None:
    sub = network.pilot_subnet_id("slurm", "4242")
    good = {
        "bridge": network.bridge_name(sub),
        "gateway": str(network.gateway_address(sub)),
        "dns": [],
        "vms": [{"vm_id": 1, "tap": "t", "mac": "52:54:00:00:00:01", "ip": str(network.ip_address(sub, 1))}],
    }
    assert site_network._nics(good, [1], sub)[0].dns == ()
    with pytest.raises(VjobError, match=r"unusable: gateway '10\.0\.0\.1'"):
        site_network._nics({**good, "gateway": "10.0.0.1"}, [1], sub)
    with pytest.raises(VjobError, match="0 NICs for 1 VMs"):
        site_network._nics({**good, "vms": []}, [1], sub)
    assert site_network.site_interfaces(parse({}), "slurm", "4242", "n1", [1]) is None


class _OneJob:
    """The RMS's word for this test: job 4242 of `nobody` runs on n1 (the Slurm authority itself
    is plugins/slurm/job_grant.py's, tested with the node service)."""

    def grant(self, job: str, node: str) -> Grant | None:
        return _grant(job) if (job, node) == ("4242", "n1") else None


@root_only
def test_an_ordinary_users_pilot_gets_its_taps_through_the_service(site_net: sn.Site) -> None:
    top = Path(tempfile.mkdtemp(prefix="vjob-n2-"))  # reachable by the user (pytest's tmp_path is not)
    top.chmod(0o755)
    sock = top / "run" / "node.sock"
    service = NodeService(sock, network_ops.OPERATIONS, _OneJob(), frozenset({"n1"}))
    service.bind()
    stop = threading.Event()
    thread = threading.Thread(target=service.serve, args=(stop,), daemon=True)
    thread.start()
    cfg = parse({"node": {"socket": str(sock)}})
    net = net_rules.job_net("slurm", "4242")

    def as_user() -> int:
        link = site_network.SiteLink(cfg, "slurm", "4242", "n1", [1])
        nic = link.nic(1)
        assert nic is not None and nic.tap == net.tap(1) and nic.dns == (sn.SITE_IP,)
        print(Path(f"/sys/class/net/{nic.tap}/owner").read_text().strip())
        try:
            site_network.site_interfaces(cfg, "slurm", "4243", "n1", [1])
        except VjobError as exc:
            print(exc)
        link.down()
        return 0

    try:
        res = as_nobody(as_user)
        assert res.returncode == 0, res.stderr
        owner, refused = res.stdout.splitlines()[:2]
        assert owner == str(NOBODY.pw_uid) and "node service:" in refused and "4243" in refused, res.stdout
        assert not Path(f"/sys/class/net/{net.bridge}").exists()
    finally:
        stop.set()
        thread.join(5)
        service.close()
        shutil.rmtree(top, ignore_errors=True)
