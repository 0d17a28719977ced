"""A job's private network as data: addresses from the store's identities, host and node files."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning import network
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


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.integers(1, (1 << 16) - 1), st.integers(1, network.MAX_VMS))
def test_addresses_are_private_unique_per_pair_and_bridges_fit_ifnamsiz(subnet: int, vm: int) -> None:
    ip = network.ip_address(subnet, vm)
    assert ip in ipaddress.ip_network("10.0.0.0/8")
    assert (int(ip) >> 8) & 0xFFFF == subnet and int(ip) & 0xFF == vm
    assert len(network.bridge_name(subnet)) <= 15
