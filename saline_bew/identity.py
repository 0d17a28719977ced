"""Network identities of a best-effort vjob's VMs: MAC and IP from subnetID and vmID.

Why derived, not stored: Saline 3.2 gives every job one 16-bit subnetID and every VM an 8-bit
vmID from its site master, and both addresses follow from the pair (MAC = site prefix +
subnetID + vmID, IP = base network + subnetID + vmID, i.e. 10.subnet_hi.subnet_lo.vm). The
pair moves with the VM from site to site, so a resumed vjob keeps its addresses and its TCP
connections. The pairs themselves live in the shared store (vjob.store.identities), where
the database's uniqueness constraints keep the masters of all sites from ever handing one
out twice.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from vjob.errors import ConfigError, InputError
from vjob.store import identities
from vjob.store.db import Store


@dataclass(frozen=True, slots=True)
class NetworkIdentity:
    vm_name: str
    subnet_id: int
    vm_id: int
    mac: str
    ip: str


def mac_for(prefix: str, subnet_id: int, vm_id: int) -> str:
    """prefix (3 octets) + subnetID (2 octets) + vmID (1 octet)."""
    _check(subnet_id, vm_id)
    return identities.mac_address(prefix, subnet_id, vm_id)


def ip_for(network: str, subnet_id: int, vm_id: int) -> str:
    """The base network's address + subnetID·256 + vmID (10.0.0.0/8 gives 10.hi.lo.vm)."""
    _check(subnet_id, vm_id)
    try:
        net = ipaddress.IPv4Network(network)
    except ValueError as exc:
        raise ConfigError(f"saline.network = {network!r}: {exc}") from None
    if net.prefixlen > 8:
        raise ConfigError(f"saline.network = {network!r}: needs 24 free bits (a /8 or larger)")
    return str(net.network_address + (subnet_id << 8) + vm_id)


def _check(subnet_id: int, vm_id: int) -> None:
    if not 0 <= subnet_id < identities.SUBNET_IDS:
        raise InputError(f"subnetID = {subnet_id}: must be in 0..{identities.SUBNET_IDS - 1}")
    if not 0 <= vm_id < identities.VM_IDS:
        raise InputError(f"vmID = {vm_id}: must be in 0..{identities.VM_IDS - 1}")


def assign(
    store: Store, *, site: str, job_key: str, vm_names: list[str], mac_prefix: str, network: str
) -> list[NetworkIdentity]:
    """The identities of the job's VMs, allocated on first call and the same on every later one
    (one transaction: a release racing it runs wholly before or after, see vjob.store.identities)."""
    got = identities.assign(store, site=site, job_key=job_key, vm_names=vm_names, mac_prefix=mac_prefix)
    return [NetworkIdentity(a.vm_name, a.subnet_id, a.vm_id, a.mac, ip_for(network, a.subnet_id, a.vm_id)) for a in got]


def release(store: Store, job_key: str) -> None:
    identities.release(store, job_key)
