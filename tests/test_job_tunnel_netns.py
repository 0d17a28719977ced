"""A multi-node job's network over the wire, for real: hosts made of network namespaces joined by
an underlay bridge (devkit/vxlan_hosts.py), on each the node service's own net.up/net.down run
inside the host's namespace (the job's bridge, taps, firewall and — the job's nodes sitting on two
hosts — its VXLAN and nftables tables, made by provisioning.node_service.tunnel), and guests as
namespaces plugged into the job bridges with the MACs and addresses net.up gave.

Job 5001 and job 5002 each hold node n1 on host a and n2 on host b; host c is on the underlay and
holds no job. Checked: job 5001's guests reach each other across the hosts (ICMP and a TCP
exchange, digest-checked, both ways); job 5002's guests see none of its frames, and a guest that
takes an address of the other job's subnet reaches nothing of it, both ways; a hand-made VXLAN
datagram with job 5001's VNI reaches its bridge from a peer's root (the control) and from no one
else: not an ordinary user of a peer host, not a stranger host, not a guest of either job (through
its NAT, to its own host, to its gateway), nor a guest sending the other job's VNI. And: net.down
and the sweep remove everything, a job on one host gets no tunnel, a resumed job's peers replace
the old ones, and a guest on the operator's bridge forging a node's address is stopped by the
node's guard table. Test traffic stays in the namespaces (198.18.40.0/24, the jobs' 10.x subnets).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit import vxlan_hosts as vh

pytestmark = [pytest.mark.slow, pytest.mark.host_network]  # ~20 s: a dozen namespaces, ~40 probe processes

JOB1, JOB2 = "5001", "5002"
NODES = {"n1": "a", "n2": "b"}


@pytest.fixture(scope="module")
def root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these tests make network namespaces, bridges, VXLANs and firewall rules: run them as root")


@dataclass
class Jobs:
    topo: vh.Topology
    up: dict[tuple[str, str], dict]
    """(job, host) -> net.up's answer."""
    guests: dict[str, str]
    """'1a' (job 1 on host a) ... -> the guest's namespace."""

    def vm(self, guest: str) -> dict:
        job, host = (JOB1 if guest[0] == "1" else JOB2), guest[1]
        return self.up[(job, host)]["vms"][0]


def _mac_hex(mac: str) -> str:
    return mac.replace(":", "")


@pytest.fixture(scope="module")
def jobs(root: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    topo = vh.start(tmp_path_factory.mktemp("hosts"))
    try:
        up: dict[tuple[str, str], dict] = {}
        guests = {}
        for job in (JOB1, JOB2):
            for node, host in NODES.items():
                vm_id = 1 if node == "n1" else 2
                answer = vh.net_op(topo, host, "net.up", job, node, NODES, vms=1, first_vm_id=vm_id)["answer"]
                up[(job, host)] = answer
                name = f"{1 if job == JOB1 else 2}{host}"
                guests[name] = vh.guest(topo, host, name, answer["vms"][0], answer["bridge"], answer["gateway"])
        yield Jobs(topo, up, guests)
    finally:
        vh.stop(topo)


def test_a_jobs_guests_on_two_hosts_reach_each_other_over_its_tunnel(jobs: Jobs) -> None:
    a, b = jobs.up[(JOB1, "a")], jobs.up[(JOB1, "b")]
    assert a["tunnel"] == {"device": f"{a['bridge']}-vx", "vni": 5002, "local": vh.HOSTS["a"], "peers": [vh.HOSTS["b"]]}
    assert b["tunnel"]["local"] == vh.HOSTS["b"] and b["tunnel"]["peers"] == [vh.HOSTS["a"]]
    assert jobs.up[(JOB2, "a")]["tunnel"]["vni"] == 5003  # one VNI per job
    ip_a, ip_b = jobs.vm("1a")["ip"], jobs.vm("1b")["ip"]
    assert vh.probe(jobs.guests["1a"], "ping", ip_b, "3") == {"ok": True, "replies": 3, "sent": 3}
    assert vh.probe(jobs.guests["1b"], "ping", ip_a, "3")["ok"]
    for src, dst, ip in (("1a", "1b", ip_b), ("1b", "1a", ip_a)):
        server = vh.background(jobs.topo, jobs.guests[dst], "serve", ip, "5201")
        sent = vh.probe(jobs.guests[src], "send", ip, "5201", str(2_000_000), "7")
        assert vh.finish(server) == {"served": 1}
        assert sent["ok"] and sent["bytes"] == 2_000_000, sent


def test_another_jobs_guests_see_none_of_its_frames_either_way(jobs: Jobs) -> None:
    mac = {g: _mac_hex(jobs.vm(g)["mac"]) for g in jobs.guests}
    job1 = f"{mac['1a']},{mac['1b']}"
    sniff = {g: vh.background(jobs.topo, jobs.guests[g], "sniff", "eth0", job1) for g in ("1b", "2a", "2b")}
    assert vh.probe(jobs.guests["1a"], "ping", jobs.vm("1b")["ip"], "3")["ok"]
    server = vh.background(jobs.topo, jobs.guests["1b"], "serve", jobs.vm("1b")["ip"], "5202")
    assert vh.probe(jobs.guests["1a"], "send", jobs.vm("1b")["ip"], "5202", str(1_000_000), "8")["ok"]
    vh.finish(server)
    seen = {g: vh.finish(p)["markers"] for g, p in sniff.items()}
    assert seen["1b"][mac["1a"]] > 0, seen  # the sniffer does see job 1's frames where they belong
    for g in ("2a", "2b"):
        assert seen[g] == {mac["1a"]: 0, mac["1b"]: 0}, (g, seen)
    # a guest taking an address in the other job's subnet: its ARP stays on its own job's segment
    for attacker, victim in (("2a", "1b"), ("1a", "2b")):
        ns, target = jobs.guests[attacker], jobs.vm(victim)["ip"]
        stolen = target.rsplit(".", 1)[0] + ".99/24"
        subprocess.run(["ip", "-n", ns, "addr", "add", stolen, "dev", "eth0"], check=True, timeout=15)
        watch = vh.background(jobs.topo, jobs.guests[victim], "sniff", "eth0", mac[attacker])
        try:
            assert vh.probe(ns, "ping", target, "1")["replies"] == 0
        finally:
            subprocess.run(["ip", "-n", ns, "addr", "del", stolen, "dev", "eth0"], check=True, timeout=15)
        assert vh.finish(watch)["markers"] == {mac[attacker]: 0}, (attacker, victim)


def test_a_hand_made_vxlan_datagram_reaches_the_jobs_bridge_from_its_peer_only(jobs: Jobs) -> None:
    b, port = vh.HOSTS["b"], "4789"
    vni1, vni2 = str(jobs.up[(JOB1, "a")]["tunnel"]["vni"]), str(jobs.up[(JOB2, "a")]["tunnel"]["vni"])
    names = ["control", "host-user", "stranger", "guest-nat", "guest-own-host", "guest-gateway", "other-vni"]
    markers = {n: n.encode().hex() for n in names}
    sniff = {
        g: vh.background(jobs.topo, ns, "sniff", "eth0", ",".join(markers.values())) for g, ns in jobs.guests.items()
    }
    hosts, guests = jobs.topo.hosts, jobs.guests
    # the control: host a's root, from its address and a privileged port, as its kernel's VXLAN sends
    vh.probe(hosts["a"], "inject", b, port, vni1, vh.HOSTS["a"], "800", "control")
    # an ordinary user of host a (a peer's address, but no privileged port to be had)
    said = vh.probe(hosts["a"], "inject-user", b, port, vni1, "host-user", "nobody")
    assert said["bound_privileged"] is False and said["from"][1] >= 1024, said
    # a host on the underlay that holds no node of the job, even as root from a privileged port
    vh.probe(hosts["c"], "inject", b, port, vni1, vh.HOSTS["c"], "800", "stranger")
    # a guest of job 2 (its root: a privileged port), through its node's NAT, to its own host, to its gateway
    gw2 = jobs.up[(JOB2, "a")]["gateway"]
    vh.probe(guests["2a"], "inject", b, port, vni1, "", "800", "guest-nat")
    vh.probe(guests["2a"], "inject", vh.HOSTS["a"], port, vni1, "", "801", "guest-own-host")
    vh.probe(guests["2a"], "inject", gw2, port, vni1, "", "802", "guest-gateway")
    # a guest of job 1 sending job 2's VNI
    vh.probe(guests["1a"], "inject", b, port, vni2, "", "803", "other-vni")
    seen = {g: vh.finish(p)["markers"] for g, p in sniff.items()}
    # each refused where the job's rules say, three datagrams each (the control passed them)
    table1, table2 = jobs.up[(JOB1, "a")]["bridge"], jobs.up[(JOB2, "a")]["bridge"]
    assert _drops(jobs.topo, "b", table1) == {"nfproto": 0, "saddr": 3, "sport": 6}  # stranger; user, guest-nat
    assert _drops(jobs.topo, "a", table1) == {"nfproto": 0, "saddr": 6, "sport": 0}  # guest-own-host, -gateway
    assert _drops(jobs.topo, "b", table2) == {"nfproto": 0, "saddr": 0, "sport": 3}  # other-vni
    assert seen["1b"][markers["control"]] == 3, seen
    for g, counts in seen.items():
        for name, hexed in markers.items():
            if (g, name) != ("1b", "control"):
                assert counts[hexed] == 0, (g, name, seen)


def _drops(topo: vh.Topology, host: str, table: str) -> dict[str, int]:
    """The packets each underlay rule of the job's tunnel table on `host` dropped."""
    cmd = ["ip", "netns", "exec", topo.hosts[host], "nft", "list", "table", "inet", table]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True).stdout
    out = {}
    for kind, pattern in (("nfproto", "meta nfproto"), ("saddr", "ip saddr"), ("sport", "udp sport")):
        found = re.search(pattern + r"[^\n]* counter packets (\d+)", text)
        assert found, text
        out[kind] = int(found.group(1))
    return out


def _fdb(topo: vh.Topology, host: str, device: str) -> str:
    cmd = ["ip", "netns", "exec", topo.hosts[host], "bridge", "fdb", "show", "dev", device]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True).stdout


def test_net_down_and_the_sweep_leave_nothing_and_peers_follow_the_job(root: None, tmp_path: Path) -> None:
    topo = vh.start(tmp_path)
    try:
        spanning, local = {"n1": "a", "n2": "b"}, {"n1": "a", "n3": "a"}
        up = vh.net_op(topo, "a", "net.up", "5101", "n1", spanning, vms=1, first_vm_id=1)["answer"]
        vh.net_op(topo, "b", "net.up", "5101", "n2", spanning, vms=1, first_vm_id=2)
        device = up["tunnel"]["device"]
        assert f"dst {vh.HOSTS['b']}" in _fdb(topo, "a", device)
        # the job resumed with its second node on host c: the flood entry follows, b's is gone
        moved = vh.net_op(topo, "a", "net.up", "5101", "n1", {"n1": "a", "n2": "c"}, vms=1, first_vm_id=1)
        assert moved["answer"]["tunnel"]["peers"] == [vh.HOSTS["c"]]
        fdb = _fdb(topo, "a", device)
        assert f"00:00:00:00:00:00 dst {vh.HOSTS['c']}" in fdb and f"dst {vh.HOSTS['b']}" not in fdb, fdb
        # a job whose nodes share host a: a bridge, no tunnel
        alone = vh.net_op(topo, "a", "net.up", "5102", "n1", local, vms=2, first_vm_id=1)["answer"]
        assert alone["tunnel"] is None
        assert not [n for n in vh.leftovers(topo, "a")["links"] if n.startswith(alone["bridge"] + "-vx")]
        # net.down on a: job 5101's objects all go, job 5102's stay; its own net.down takes the rest
        removed = vh.net_op(topo, "a", "net.down", "5101", "n1", spanning)["answer"]["removed"]
        assert {device, f"netdev {up['bridge']}", f"inet {up['bridge']}", up["bridge"]} <= set(removed)
        left = vh.leftovers(topo, "a")
        assert all(alone["bridge"] in x for x in left["links"] + left["tables"] + left["chains"]), left
        assert left["tables"] == [], left
        vh.net_op(topo, "a", "net.down", "5102", "n1", local)
        assert vh.leftovers(topo, "a") == {"links": [], "tables": [], "chains": []}
        # host b's service never got a net.down (its pilot was killed): its sweep removes the job
        swept = vh.net_op(topo, "b", "sweep", "5101", "n2", spanning)["answer"]
        assert {device, f"inet {up['bridge']}", up["bridge"]} <= set(swept), swept
        assert vh.leftovers(topo, "b") == {"links": [], "tables": [], "chains": []}
    finally:
        vh.stop(topo)


def test_a_guest_on_the_operators_bridge_cannot_pose_as_a_peer_node(root: None, tmp_path: Path) -> None:
    """`[guest] network = "bridge"` with the site's LAN on the cluster network: the guest forges host
    a's address and a privileged port with a raw socket. The node's guard table is what stops it:
    removed, the datagram reaches the job's guest on host b (so the test can fail); put back by the
    next net.up, it is dropped on host a and counted there."""
    topo = vh.start(tmp_path)
    try:
        spanning = {"n1": "a", "n2": "b"}
        vh.net_op(topo, "a", "net.up", "5201", "n1", spanning, vms=1, first_vm_id=1)
        victim = vh.net_op(topo, "b", "net.up", "5201", "n2", spanning, vms=1, first_vm_id=2)["answer"]
        target = vh.guest(topo, "b", "v", victim["vms"][0], victim["bridge"], victim["gateway"])
        bridge = vh.operator_bridge(topo, "a")
        bridged = {"n1": "a"}
        vm = vh.net_op(topo, "a", "net.up", "5202", "n1", bridged, bridge=bridge, vms=1, first_vm_id=1)["answer"][
            "vms"
        ][0]
        guests = {"unguarded": "x", "guarded": "y"}
        vni = str(victim["tunnel"]["vni"])
        markers = {"unguarded": b"unguarded".hex(), "guarded": b"guarded".hex()}

        def attack(marker: str) -> int:
            # (made again each time: the node service's net.up puts its own tap back in its place)
            attacker = vh.bridged_guest(topo, "a", guests[marker], vm["site_tap"], vm["site_mac"], "198.18.40.77")
            watch = vh.background(topo, target, "sniff", "eth0", markers[marker])
            vh.probe(attacker, "inject-raw", vh.HOSTS["b"], "4789", vni, vh.HOSTS["a"], "800", marker)
            return int(vh.finish(watch)["markers"][markers[marker]])

        guard = ["ip", "netns", "exec", topo.hosts["a"], "nft", "list", "table", "bridge", "vjob-guard"]
        assert "udp dport 4789 counter packets 0" in subprocess.run(guard, capture_output=True, text=True).stdout
        subprocess.run([*guard[:5], "delete", "table", "bridge", "vjob-guard"], check=True, timeout=15)
        assert attack("unguarded") == 3  # host b's rules cannot tell it from host a's own VXLAN
        vh.net_op(topo, "a", "net.up", "5202", "n1", bridged, bridge=bridge, vms=1, first_vm_id=1)
        assert attack("guarded") == 0
        listing = subprocess.run(guard, capture_output=True, text=True, check=True).stdout
        assert "udp dport 4789 counter packets 3" in listing, listing
    finally:
        vh.stop(topo)
