"""A job's VMs on the site network, asked of the node service (provisioning.node_service,
`net.up`/`net.down`) by the pilot, as root or as the job's ordinary user.

Why the pilot asks and does not make it: a user's pilot drives qemu:///session, which can make
no bridge, tap or firewall rule. The node service makes the job's bridge with the node's
gateway address, one tap per VM owned by the job's uid, and the job's firewall (NAT to the
site, nothing of the node's own services); the VM plugs into its tap with
`<interface type='ethernet'><target dev=TAP managed='no'/>`, which a session libvirt can open
because the tap is the user's. The guest gets its address, default route and name servers in
job.json (`network.site`, provisioning.guest_agent.site_net).

API (for one-node, leader and member pilots alike):

    nics = site_interfaces(cfg, rms, job, node, [vm_id, ...])   # net.up; None: no service
    nics[i] -> SiteNic(vm_id, tap, mac, ip, prefix, gateway, dns, bridge, site_tap, site_mac)
    domain_nic(nic)            -> provisioning.vm_types.Nic for the VMSpec (kind "ethernet")
    domain_nics(nic)           -> the VM's NICs: the job's, and its site NIC on the operator's bridge
                                  (`[guest] network = "bridge"`; the guest asks the site's DHCP)
    with_site(network, nic)    -> a multi-node VM's job.json `network` plus `site`
    one_vm_network(nic, host)  -> the job.json `network` of a one-VM job (itself its only peer)
    release(cfg, rms, job, node)                                 # net.down; never raises
    SiteLink(cfg, rms, job, node, vm_ids): up() before a boot or a restore, down() after a save
    or at the end, nic(vm_id) for the spec (pilot.vm.DriverVM and pilot.multinode call these).

When: the network is asked for before every boot and every restore (the node the job lands on
may never have had it: the gateway address is the same everywhere, so a resumed guest's route
still holds) and given back after every save and at the job's end: a node keeps nothing of a job
that does not run there (the service's sweep removes what a killed pilot could not give back).
vmIDs are the VMs' ranks + 1, contiguous per request. Without `[node] socket` nothing is asked
(None): a root pilot keeps today's libvirt bridge for a multi-node job, a one-node job and a
user's job have no NIC, and the pilot's log says so.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pilot import site_mounts
from provisioning import network
from provisioning.node_service.client import NodeClient
from provisioning.node_service.site_bridge import site_mac
from provisioning.vm_types import MAC_RE, Nic
from vjob import log
from vjob.errors import VjobError

CALL_TIMEOUT_S = 90.0
"""The service's own deadline for net.up is 60 s (many taps); the client waits a little longer."""
RELEASE_TIMEOUT_S = 5.0
"""net.down takes 0.3 s; it runs right after a save, inside the RMS's grace time before SIGKILL
(the pilot has yet to write that the VM is saved): a service slow to answer must not eat it."""
_log = log.get("pilot")


@dataclass(frozen=True)
class SiteNic:
    """One VM's NIC on its job's network, as the node service made it."""

    vm_id: int
    tap: str
    mac: str
    ip: str
    prefix: int
    gateway: str
    dns: tuple[str, ...]
    bridge: str
    site_tap: str = ""
    """Its tap on the operator's bridge (`[guest] network = "bridge"`), else empty."""
    site_mac: str = ""


def service_socket(cfg: Any) -> str:
    """`[node] socket`, or "" when the site runs no node service."""
    return str(getattr(getattr(cfg, "node", None), "socket", "") or "")


def site_interfaces(cfg: Any, rms: str, job: str, node: str, vm_ids: Sequence[int]) -> list[SiteNic] | None:
    """The NICs of VMs `vm_ids` (contiguous) on `node`, made by the node service; None when
    there is none. A refusal or an unreachable service is a VjobError naming it."""
    path = service_socket(cfg)
    if not path:
        return None
    ids = sorted(vm_ids)
    if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
        raise VjobError(f"site network of job {job}: vmIDs {ids[:8]} are not one contiguous run")
    client = NodeClient(path, timeout=CALL_TIMEOUT_S)
    answer = client.call("net.up", job=job, node=node, vms=len(ids), first_vm_id=ids[0])
    return _nics(answer, ids, network.pilot_subnet_id(rms, job), (rms, job))


def _nics(answer: dict[str, Any], ids: list[int], subnet_id: int, job: tuple[str, str] = ("", "")) -> list[SiteNic]:
    """The answer, checked against what this job's subnet says it must be: the service is root's,
    but a wrong address here would send the guest's traffic somewhere else."""
    gateway, bridge = str(answer.get("gateway", "")), str(answer.get("bridge", ""))
    dns = answer.get("dns", [])
    vms = answer.get("vms", [])
    try:
        if gateway != str(network.gateway_address(subnet_id)) or bridge != network.bridge_name(subnet_id):
            raise ValueError(f"gateway {gateway[:40]!r} or bridge {bridge[:40]!r} not this job's")
        servers = tuple(str(ipaddress.IPv4Address(d)) for d in dns[:3]) if isinstance(dns, list) else ()
        out = []
        for want, vm in zip(ids, vms if isinstance(vms, list) else [], strict=False):
            if vm.get("vm_id") != want or vm.get("ip") != str(network.ip_address(subnet_id, want)):
                raise ValueError(f"VM {str(vm)[:80]} is not vmID {want}")
            if not MAC_RE.fullmatch(str(vm.get("mac", ""))):
                raise ValueError(f"VM {want}: MAC {str(vm.get('mac'))[:40]!r}")
            site_tap, mac2 = "", ""
            if "site_tap" in vm:  # the operator's bridge: its MAC is the one the node's rules let through
                site_tap, mac2 = str(vm["site_tap"]), str(vm.get("site_mac", ""))
                if site_tap != f"{bridge}-s{want:02x}" or mac2 != site_mac(job[0], job[1], want):
                    raise ValueError(f"VM {want}: site tap {site_tap[:20]!r} or MAC {mac2[:20]!r} not this job's")
            nic = SiteNic(want, str(vm["tap"]), vm["mac"], vm["ip"], 24, gateway, servers, bridge, site_tap, mac2)
            out.append(nic)
        if len(out) != len(ids):
            raise ValueError(f"{len(out)} NICs for {len(ids)} VMs")
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise VjobError(f"node service: net.up answered something unusable: {exc}") from None
    return out


def release(cfg: Any, rms: str, job: str, node: str) -> bool:
    """net.down for `job` on `node`; False (logged, never raised) when the service could not:
    nothing of the job is lost, and the service's sweep removes it when the job has ended."""
    path = service_socket(cfg)
    if not path:
        return True
    try:
        NodeClient(path, timeout=RELEASE_TIMEOUT_S).call("net.down", job=job, node=node)
    except VjobError as exc:
        _log.warning("job network not given back (the service's sweep will)", job=job, node=node, error=str(exc))
        return False
    return True


def domain_nic(nic: SiteNic) -> Nic:
    """The VM's NIC on its tap (libvirt `type='ethernet'`, the tap not managed by libvirt)."""
    return Nic(nic.mac, nic.tap, kind="ethernet")


def domain_nics(nic: SiteNic) -> tuple[Nic, ...]:
    """The VM's NICs: its job NIC, and its site NIC on the operator's bridge when it has one
    (the guest finds each by its MAC, whatever the order)."""
    if not nic.site_tap:
        return (domain_nic(nic),)
    return (domain_nic(nic), Nic(nic.site_mac, nic.site_tap, kind="ethernet"))


def site_fields(nic: SiteNic) -> dict[str, object]:
    """job.json `network.site`: the gateway on the job NIC (NAT through the node), or the site NIC
    to configure by DHCP (the operator's bridge; `dns` then only what the operator set)."""
    if nic.site_tap:
        return {"bridged": {"mac": nic.site_mac, "dns": list(nic.dns)}}
    return {"gateway": nic.gateway, "dns": list(nic.dns)}


def with_site(net: dict[str, object], nic: SiteNic) -> dict[str, object]:
    """A multi-node VM's job.json `network` (pilot.multinode.network_of) with its way out."""
    return {**net, "site": site_fields(nic)}


def one_vm_network(nic: SiteNic, hostname: str) -> dict[str, object]:
    """The job.json `network` of a one-VM job: its address, itself as its only peer (its host
    name in /etc/hosts), no ssh key, and its way out."""
    host = hostname.lower() if network.HOSTNAME_RE.fullmatch(hostname.lower()) else "vm0"
    return {
        "mac": nic.mac,
        "ip": nic.ip,
        "prefix": nic.prefix,
        "peers": [[nic.ip, host]],
        "leader": True,
        "site": site_fields(nic),
    }


class SiteLink:
    """The site network of the VMs `vm_ids` this pilot runs on `node`: asked for before each
    boot or restore, given back after each save and at the end."""

    def __init__(self, cfg: Any, rms: str, job: str, node: str, vm_ids: Sequence[int]) -> None:
        self.cfg, self.rms, self.job, self.node = cfg, rms, job, node
        self.vm_ids = list(vm_ids)
        self.nics: dict[int, SiteNic] = {}
        self.enabled = bool(service_socket(cfg))
        if not self.enabled:
            _log.info("no node service ([node] socket unset): the job's VMs get no site network", job=job)

    def up(self) -> None:
        if self.enabled and self.vm_ids:
            got = site_interfaces(self.cfg, self.rms, self.job, self.node, self.vm_ids) or []
            self.nics = {n.vm_id: n for n in got}
            taps = [n.tap for n in got] + [n.site_tap for n in got if n.site_tap]
            _log.info("site network up", job=self.job, node=self.node, taps=taps)
            site_mounts.up(self.cfg, self.rms, self.job, self.node)  # its NFS gateway binds the bridge's address

    def down(self) -> None:
        if self.enabled and self.vm_ids:
            site_mounts.down(self.cfg, self.rms, self.job, self.node)  # before the bridge it is bound to goes
            release(self.cfg, self.rms, self.job, self.node)
            self.nics = {}

    def nic(self, vm_id: int) -> SiteNic | None:
        """The NIC of `vm_id` after `up` (asked for now if `up` was not called); None without a service."""
        if self.enabled and vm_id in self.vm_ids and vm_id not in self.nics:
            self.up()
        return self.nics.get(vm_id)
