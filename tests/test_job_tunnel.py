"""The job tunnel as data (provisioning.node_service.tunnel): which hosts are peers, the VXLAN and
nftables it asks for, the checks of the RMS's addresses and of `[node] tunnel_networks`, and Slurm's
NodeAddr reader. Nothing here touches the machine's network; tests/test_job_tunnel_netns.py runs
the same code on hosts made of network namespaces.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm import job_grant
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.job_grant import SlurmJobAuthority
from provisioning.node_service import net_rules, network_ops, site_bridge, tunnel
from vjob.config.composed import parse
from vjob.errors import ConfigError, InputError

FIXTURES = Path(__file__).parent / "data" / "fixtures" / "slurm"
NET = net_rules.job_net("slurm", "5001")
CLUSTER = [ipaddress.IPv4Network("198.18.40.0/24")]


def _ip(text: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(text)


def _plan(addresses: dict[str, str], own: tuple[str, ...] = ("198.18.40.1",), node: str = "n1") -> tunnel.Plan | None:
    return tunnel.plan(node, {n: _ip(a) for n, a in addresses.items()}, [_ip(a) for a in own], CLUSTER, 4789)


def test_the_other_hosts_are_the_peers_once_each() -> None:
    found = _plan({"n1": "198.18.40.1", "n2": "198.18.40.2", "n3": "198.18.40.2", "n4": "198.18.40.3"})
    assert found == tunnel.Plan(_ip("198.18.40.1"), (_ip("198.18.40.2"), _ip("198.18.40.3")), 4789)


def test_a_job_on_one_host_gets_no_tunnel() -> None:
    assert _plan({"n1": "198.18.40.1", "n2": "198.18.40.1"}) is None
    assert _plan({"n1": "127.0.0.1", "n2": "127.0.0.1"}, own=()) is None  # the dev cluster: NodeAddr=127.0.0.1


@pytest.mark.parametrize(
    ("addresses", "own", "error"),
    [
        ({"n1": "198.18.40.9", "n2": "198.18.40.2"}, ("198.18.40.1",), r"node n1's address .* is not an address of"),
        ({"n1": "127.0.0.1", "n2": "198.18.40.2"}, ("198.18.40.1",), "not an address of this host"),
        ({"n1": "198.18.40.1", "n2": "192.0.2.7"}, ("198.18.40.1",), r"node n2's address 192\.0\.2\.7 is not in"),
        ({"n1": "198.18.41.1", "n2": "198.18.40.2"}, ("198.18.41.1",), r"node n1's address 198\.18\.41\.1 is not in"),
        ({"n1": "198.18.40.1", "n2": "224.0.0.5"}, ("198.18.40.1",), "is not in"),
    ],
)
def test_an_end_off_the_cluster_network_or_not_here_is_refused(
    addresses: dict[str, str], own: tuple[str, ...], error: str
) -> None:
    with pytest.raises(InputError, match=error):
        _plan(addresses, own)


def test_an_rms_address_is_a_literal_or_a_host_name() -> None:
    assert tunnel.resolve("n1", "198.18.40.2") == _ip("198.18.40.2")
    assert tunnel.resolve("n1", "localhost").is_loopback
    for bad in ("", "a b", "-x", "198.18.40.2;reboot", "x" * 300):
        with pytest.raises(InputError, match="node n1: address"):
            tunnel.resolve("n1", bad)
    with pytest.raises(InputError, match="does not resolve to IPv4"):
        tunnel.resolve("n1", "no-such-node.invalid")


def test_the_vxlan_is_the_jobs_vni_from_privileged_ports_on_its_bridge() -> None:
    p = tunnel.Plan(_ip("198.18.40.1"), (_ip("198.18.40.2"),), 4789)
    assert tunnel.device(NET) == f"{NET.bridge}-vx" and len(tunnel.device(NET)) <= 15
    assert tunnel.vni(NET) == NET.subnet_id == 5002
    add = tunnel.vxlan_add(NET, p)
    assert add[:8] == ["ip", "link", "add", tunnel.device(NET), "type", "vxlan", "id", "5002"]
    text = " ".join(add)
    assert "local 198.18.40.1 dstport 4789 srcport 768 1024 df unset" in text and " dev " not in text
    assert tunnel.vxlan_attach(NET)[-5:] == ["mtu", "1500", "master", NET.bridge, "up"]
    assert tunnel.fdb_add(NET, _ip("198.18.40.2")) == [
        *("bridge", "fdb", "append", "00:00:00:00:00:00", "dev", tunnel.device(NET), "dst", "198.18.40.2")
    ]


def test_the_rules_let_in_the_jobs_vni_only_from_its_peers_privileged_ports() -> None:
    p = tunnel.Plan(_ip("198.18.40.1"), (_ip("198.18.40.2"), _ip("198.18.40.3")), 4789)
    lines = [line.strip() for line in tunnel.ruleset(NET, p).splitlines()]
    vx = "udp dport 4789 @th,96,24 5002"
    assert f"{vx} ip saddr != {{ 198.18.40.2, 198.18.40.3 }} counter drop" in lines
    assert f"{vx} udp sport >= 1024 counter drop" in lines and f"{vx} meta nfproto != ipv4 counter drop" in lines
    assert "type filter hook input priority -200; policy accept;" in lines
    for hook in ("ingress", "egress"):
        assert f'type filter hook {hook} device "{tunnel.device(NET)}" priority -200; policy accept;' in lines
    assert lines.count(f"ether saddr {NET.gateway_mac} counter drop") == 2
    assert lines.count(f"arp daddr ip {NET.gateway} counter drop") == 2
    # declared, deleted and defined in one transaction per table: a second net.up leaves one of each
    assert lines[:3] == [f"table inet {NET.bridge}", f"delete table inet {NET.bridge}", f"table inet {NET.bridge} {{"]
    assert tunnel.SRC_PORTS[1] <= 1024


def test_what_the_node_reports_is_read_back() -> None:
    fdb = json.dumps(
        [
            {"mac": "00:00:00:00:00:00", "dst": "198.18.40.2", "flags": ["self"]},
            {"mac": "52:54:00:13:8a:02", "dst": "198.18.40.2"},
            {"mac": "fa:d4:2e:93:9b:c4", "master": NET.bridge},
        ]
    )
    assert tunnel.flood_peers(fdb) == {_ip("198.18.40.2")}
    p = tunnel.Plan(_ip("198.18.40.1"), (_ip("198.18.40.2"),), 4789)
    link = [{"linkinfo": {"info_kind": "vxlan", "info_data": {"id": 5002, "local": "198.18.40.1", "port": 4789}}}]
    assert tunnel.same_device(json.dumps(link), NET, p)
    assert not tunnel.same_device(json.dumps(link), NET, tunnel.Plan(_ip("198.18.40.9"), p.peers, 4789))
    assert not tunnel.same_device("[]", NET, p)
    listing = "table inet vjob-138a\ntable netdev vjob-138a\ntable bridge vjob-0001\ntable inet vjob-tunnel\n"
    assert tunnel.own_tables(listing) == {0x138A}
    assert network_ops.OWN_LINK_RE.fullmatch("vjob-138a-vx") and not network_ops.OWN_LINK_RE.fullmatch("vjob-138a-vy")


def test_tunnel_networks_are_validated() -> None:
    cfg = parse({"node": {"tunnel_networks": ["198.18.40.0/24", "10.1.0.0/16"], "tunnel_port": 8472}})
    assert cfg.node.tunnel_networks == ["198.18.40.0/24", "10.1.0.0/16"] and cfg.node.tunnel_port == 8472
    assert parse({}).node.tunnel_networks == [] and parse({}).node.tunnel_port == 4789
    for bad, said in (
        (["10.1.0.1/16"], "host bits set"),
        (["127.0.0.0/8"], "not loopback"),
        (["0.0.0.0/0"], "not loopback"),
        (["fd00::/8"], "an IPv4 network"),
    ):
        with pytest.raises(ConfigError, match=said):
            parse({"node": {"tunnel_networks": bad}})
    with pytest.raises(ConfigError, match="tunnel_port"):
        parse({"node": {"tunnel_port": 0}})


def test_tunnels_off_or_one_node_ask_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []
    monkeypatch.setattr(tunnel, "_addresses", lambda nodes: asked.append(nodes) or {})
    assert tunnel.plan_for(NET, "n1", ("n1", "n2"), [], 4789) is None
    assert tunnel.plan_for(NET, "n1", ("n1",), ["198.18.40.0/24"], 4789) is None
    assert asked == []


# -- Slurm's NodeAddr ----------------------------------------------------------------------------
def test_slurm_node_addresses_from_sinfo_json() -> None:
    doc = json.loads((FIXTURES / "rivos_sinfo_out.json").read_text())
    name = doc["nodes"][0]["name"]
    assert job_grant.addresses_of(doc, [name], source="sinfo --json") == {name: doc["nodes"][0]["address"]}
    with pytest.raises(InputError, match="no record of node"):
        job_grant.addresses_of(doc, [name, "nosuchnode"], source="sinfo --json")


def test_slurm_node_addresses_from_scontrol_data_parser() -> None:
    meta = {"plugins": {"data_parser": "data_parser/v0.0.40"}, "Slurm": {"release": "23.11.4"}}
    nodes = [{"name": "n1", "address": "10.1.0.1"}, {"name": "n2", "address": "n2.cluster"}, {"name": "n3"}]
    doc = {"meta": meta, "nodes": nodes, "errors": [], "warnings": []}
    found = job_grant.addresses_of(doc, ["n1", "n2"], source="scontrol")
    assert found == {"n1": "10.1.0.1", "n2": "n2.cluster"}
    with pytest.raises(InputError, match="node n3 has no usable address"):
        job_grant.addresses_of(doc, ["n3"], source="scontrol")
    with pytest.raises(InputError, match=r"node n1\.address = '7': expected str"):
        job_grant.addresses_of({**doc, "nodes": [{"name": "n1", "address": 7}]}, ["n1"], source="scontrol")


@pytest.mark.slurm
def test_the_live_slurm_authority_reads_nodeaddr(slurm_cluster: DevCluster) -> None:
    """Against the dev cluster: the JSON reader agrees with `scontrol show node -o`'s NodeAddr."""
    judge = SlurmJobAuthority(SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20)))
    env = {**os.environ, **slurm_cluster.env}
    text = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, env=env, timeout=30)
    said = dict(re.findall(r"NodeName=(\S+) .*?NodeAddr=(\S+)", text.stdout))
    assert len(said) >= 2, text.stdout[:500]
    nodes = sorted(said)[:2]
    assert judge.node_addresses(nodes) == {n: said[n] for n in nodes}


def test_the_guard_drops_tunnel_datagrams_from_guest_ports_to_the_uplink_only() -> None:
    lines = [line.strip() for line in tunnel.guard_ruleset(8472).splitlines()]
    assert lines[:3] == ["table bridge vjob-guard", "delete table bridge vjob-guard", "table bridge vjob-guard {"]
    assert "type filter hook forward priority -200; policy accept;" in lines
    assert 'iifname "vjob-*" oifname != "vjob-*" udp dport 8472 counter drop' in lines
    # not a job's table for the operator's-bridge sweep (site_bridge matches vjob-<4 hex>)
    assert (
        site_bridge.own_tables("table bridge vjob-guard\n") == []
        and tunnel.own_tables("table bridge vjob-guard") == set()
    )
