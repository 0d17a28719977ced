"""A job's private network as data: addresses from the store's identities, host and node files."""

from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.job import job_nodes
from pilot.multinode import network_of
from provisioning import job_disk, network
from provisioning.domain_xml import domain_xml
from provisioning.guest_agent import agent
from provisioning.vm_types import Nic, VMSpec
from vjob.errors import InputError
from vjob.store import identities
from vjob.store.db import Store

PREFIX = "52:54:00"


def test_two_jobs_get_disjoint_addresses_and_the_same_ones_again(store: Store) -> None:
    a = identities.assign(store, site="s", job_key="job-a", vm_names=["a-0", "a-1", "a-2"], mac_prefix=PREFIX)
    b = identities.assign(store, site="s", job_key="job-b", vm_names=["b-0", "b-1"], mac_prefix=PREFIX)
    pa, pb = network.peers(a), network.peers(b)
    assert {p.ip for p in pa}.isdisjoint({p.ip for p in pb})
    assert network.bridge_name(a[0].subnet_id) != network.bridge_name(b[0].subnet_id)
    again = identities.assign(store, site="s", job_key="job-a", vm_names=["a-0", "a-1", "a-2"], mac_prefix=PREFIX)
    assert network.peers(again) == pa  # a resumed job comes back with the same MACs and IPs
    assert [p.hostname for p in pa] == ["vm0", "vm1", "vm2"]
    assert network.hosts_file(pa).splitlines()[1] == f"{pa[1].ip} vm1"
    assert network.node_file(pa) == "vm0 slots=1\nvm1 slots=1\nvm2 slots=1\n"
    assert f'address="{pa[0].mac}"' in network.interface_xml(pa[0], a[0].subnet_id)


def test_bad_inputs_are_refused_by_name() -> None:
    with pytest.raises(InputError, match="vm_id"):
        network.ip_address(1, 255)  # the broadcast address
    with pytest.raises(InputError, match="subnet_id"):
        network.ip_address(0, 1)
    addr = identities.Address("x", 1, 1, "52:54:00:00:01:01")
    with pytest.raises(InputError, match="hostname_prefix"):
        network.peers([addr], hostname_prefix="vm\n")
    with pytest.raises(InputError, match="several subnets"):
        network.peers([addr, identities.Address("y", 2, 1, "52:54:00:00:02:01")])
    with pytest.raises(InputError, match="slots"):
        network.node_file(network.peers([addr]), slots=[0])


@settings(max_examples=500, deadline=None)
@given(st.integers(1, (1 << 16) - 1), st.integers(1, network.MAX_VMS))
def test_addresses_are_private_unique_per_pair_and_bridges_fit_ifnamsiz(subnet: int, vm: int) -> None:
    ip = network.ip_address(subnet, vm)
    assert ip in ipaddress.ip_network("10.0.0.0/8")
    assert (int(ip) >> 8) & 0xFFFF == subnet and int(ip) & 0xFF == vm
    assert len(network.bridge_name(subnet)) <= 15


def _pilot_network(rank: int = 0) -> dict[str, object]:
    addresses = network.pilot_addresses("slurm", "902", ["j-0", "j-1"])
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "A" * 300 + "\n-----END OPENSSH PRIVATE KEY-----\n"
    return network_of(addresses, rank, (key, "ssh-ed25519 " + "B" * 68))


def test_a_pilots_job_network_is_the_same_at_every_start_and_the_guest_accepts_it() -> None:
    a = network.pilot_addresses("slurm", "902", ["j-0", "j-1"])
    assert a == network.pilot_addresses("slurm", "902", ["j-0", "j-1"])  # a resume: same MACs, IPs
    assert {x.subnet_id for x in a} == {902 % 65535 + 1} and [x.vm_id for x in a] == [1, 2]
    assert network.pilot_subnet_id("slurm", "903") != network.pilot_subnet_id("slurm", "902")
    assert 1 <= network.pilot_subnet_id("oar", "x.y") <= 65535
    xml = network.network_xml(a[0].subnet_id)
    assert "<forward" not in xml and "<ip" not in xml and f'name="{network.bridge_name(a[0].subnet_id)}"' in xml
    net = agent.parse_network(_pilot_network(1))
    assert (net.ip, net.leader, net.peers[0][1]) == (str(network.ip_address(a[0].subnet_id, 2)), False, "vm0")
    assert agent.parse_network(_pilot_network(0)).leader
    job = job_disk.JobDescription(
        script=b"#!/bin/sh\n",
        args=[],
        env={},
        uid=1000,
        gid=1000,
        user="ann",
        home="/home/ann",
        cwd="/home/ann/w",
        hostname="vm0",
        network=_pilot_network(),
    )
    assert agent.parse_job(job.to_json()).network == agent.parse_network(_pilot_network())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mac", "52:54:00:00:01:01\n"),
        ("ip", "10.0.0.1; rm -rf /"),
        ("ip", "10.9.9.9"),  # not one of the peers
        ("prefix", 33),
        ("peers", [["10.3.135.1", "vm0\nevil"]]),
        ("peers", [["10.3.135.1", "vm0", "x"]]),
        ("peers", []),
        ("leader", "yes"),
        ("ssh_public", "ssh-rsa AAAA"),
        ("ssh_private", "-----BEGIN OPENSSH PRIVATE KEY-----\nshort\n-----END OPENSSH PRIVATE KEY-----\n"),
    ],
)
def test_a_hostile_network_in_job_json_is_refused_by_field(field: str, value: object) -> None:
    data = _pilot_network() | {field: value}
    with pytest.raises(agent.JobError, match=f"network.{field}"):
        agent.parse_network(data)


def test_the_vm_of_a_multi_node_job_has_its_nic_on_the_jobs_bridge(tmp_path: Path) -> None:
    spec = VMSpec("j-0", tmp_path / "i.qcow2", nics=(Nic("52:54:00:03:87:01", "vjob-0387"),))
    xml = domain_xml(spec, dom_type="qemu", overlay=tmp_path / "o.qcow2", console_log=tmp_path / "c.log")
    nic = ET.fromstring(xml).find("./devices/interface[@type='bridge']")
    assert nic is not None
    assert nic.find("mac").get("address") == "52:54:00:03:87:01"  # type: ignore[union-attr]
    assert nic.find("source").get("bridge") == "vjob-0387"  # type: ignore[union-attr]


def test_the_pilot_reads_the_allocations_nodes_from_the_rms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    assert job_nodes("slurm", None, "node2") == ["node2", "node1", "node3"]
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n2.cluster\nn2.cluster\nn1.cluster\n")  # one line per slot
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    assert job_nodes("pbs", None, "n2") == ["n2", "n1"]
    assert job_nodes("slurm", "a,b", "b") == ["b", "a"]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    assert job_nodes("slurm", None, "n1") == ["n1"]
    with pytest.raises(InputError, match="node list"):
        job_nodes("slurm", "a,-x", "a")
    with pytest.raises(InputError, match="node z: not in the job's node list a,b"):
        job_nodes("slurm", "a,b", "z")
    assert job_nodes("slurm", "other-name", "n1") == ["n1"]


def test_a_pilot_job_and_a_saline_vjob_with_one_subnet_id_get_two_bridges() -> None:
    """Pilots and Saline allocate subnetIDs separately: the same number must not join them."""
    pilot, saline = network.bridge_name(7), network.bridge_name(7, network.SALINE_FAMILY)
    assert pilot != saline and len(saline) <= 15
    assert f'name="{saline}"' in network.network_xml(7, network.SALINE_FAMILY)
    with pytest.raises(InputError, match="network family"):
        network.bridge_name(7, "vjob; rm")
