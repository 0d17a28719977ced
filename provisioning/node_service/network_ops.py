"""The node service's network operations: a job's bridge, its VMs' taps and its firewall on this
node (`net.up`), and all of it taken away again (`net.down`).

Why the node service and not libvirt: a user's pilot runs QEMU on its own libvirt
(qemu:///session), which can make no bridge, no tap and no firewall rule. Root makes them here,
for a caller the service has checked (a running job of the caller's uid on this node, the
Grant), each tap owned by the job's uid so that only the job's QEMU can open it; the VM then
gets `<interface type='ethernet'><target dev=TAP managed='no'/>` (pilot.site_network).

    net.up {job, node, vms, first_vm_id}
      -> {bridge, gateway, prefix, dns, mode, nfs_port, tunnel, vms: [{vm_id, tap, mac, ip}]}
         (`[guest] network = "bridge"`: also site_bridge, and each VM's site_tap and site_mac)
    net.down {job, node}  -> {removed: [...]}

What it makes (names and rules: provisioning.node_service.net_rules): the bridge `vjob-<subnet
hex>` with the node's address G = 10.hi.lo.254/24 (the same on every node: a guest resumed or
migrated elsewhere keeps its route; the bridge's MAC too), one tap per VM (`vmID` first_vm_id…,
at most one per node of the job), IPv6 off on both, and the job's own iptables chains (NAT to
the site when `[guest] network = "nat"`, nothing of the node's own services but NFS on G, no
other job, no forged source). The answer's `dns` is `[guest] dns`, or the node's resolv.conf.
With `[guest] network = "bridge"` each VM also gets a tap on the operator's bridge (`[guest]
bridge`, checked to be an existing Linux bridge at every net.up) with a fixed MAC, and the job's
nftables bridge table filters them (provisioning.node_service.site_bridge). When the job's nodes
sit on several hosts (their addresses from the RMS) and `[node] tunnel_networks` is set, the
bridge also gets the job's VXLAN to the other hosts and its rules (provisioning.node_service.
tunnel; `tunnel` in the answer: device, VNI, this end, the peers; null without one).

Both are idempotent (a pilot may retry, a resumed job asks again on the node it lands on):
net.up makes what is missing and rewrites the job's chains in one commit (and the tunnel's peers
to what the RMS says now); net.down removes this node's taps of the job, and the bridge, tunnel
and chains with the last of them.

State and restarts: the kernel holds the objects, named after the job; the service keeps one
record per job bridge under STATE_DIR (/run: gone at a reboot, with the objects) saying whose it
is (RMS, job, uid) and which node asked for which taps. A restarted service loses nothing: the
next net.up of a running job adopts its bridge, taps and chains by name; `sweep` (run by the
service at start and now and then) asks the RMS about every recorded job and removes the network
of those no longer running on their node, and removes objects named like a job's network that
no record claims (a record lost, a service killed between making and recording). A record of
another job on the same bridge name (two job ids 65535 apart, provisioning.network) makes
net.up refuse, naming that job, rather than hand one job's network to the other.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning import network
from provisioning.node_service import net_rules, site, site_bridge, tunnel
from provisioning.node_service.grant import Grant, JobAuthority
from provisioning.node_service.net_rules import MAX_VMS_PER_REQUEST, NFS_PORT, JobNet
from provisioning.node_service.protocol import Integer, OperationSpec
from vjob import log, proc
from vjob.errors import CommandError, InputError
from vjob.store.identities import mac_address

STATE_DIR = Path("/run/vjob/net")
"""One record per job bridge (root's, 0700)."""
SYS_NET = Path("/sys/class/net")
PROC_SYS = Path("/proc/sys")
RESOLV_CONF = Path("/etc/resolv.conf")
COMMAND_TIMEOUT_S = 10.0
OWN_LINK_RE = re.compile(r"vjob-([0-9a-f]{4})(?:-[ts]([0-9a-f]{2})|-vx)?")
OWN_CHAIN_RE = re.compile(r"-N (vjob-([0-9a-f]{4})-(?:in|out|back|nat))")
_lock = threading.Lock()
"""One network change at a time on this node: two pilots of one job (the dev cluster's nodes
share a host) must not both find the bridge missing and both add it."""
_log = log.get("node_service")


@dataclass
class Record:
    """Whose a job bridge is, and which node asked for which vmIDs' taps."""

    rms: str
    job: str
    uid: int
    nodes: dict[str, list[int]] = field(default_factory=dict)


def _path(bridge: str) -> Path:
    return STATE_DIR / f"{bridge}.json"


def read_record(bridge: str) -> Record | None:
    try:
        data = json.loads(_path(bridge).read_text())
        return Record(
            str(data["rms"]), str(data["job"]), int(data["uid"]), {str(k): list(v) for k, v in data["nodes"].items()}
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.warning("network record unreadable: treated as absent", bridge=bridge, error=str(exc))
        return None


def _write_record(bridge: str, rec: Record) -> None:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = _path(bridge).with_suffix(".tmp")
    tmp.write_text(json.dumps({"rms": rec.rms, "job": rec.job, "uid": rec.uid, "nodes": rec.nodes}))
    os.replace(tmp, _path(bridge))


def _run(cmd: list[str], stdin: str | None = None) -> str:
    return proc.run(cmd, timeout_s=COMMAND_TIMEOUT_S, stdin=stdin)


def _exists(link: str) -> bool:
    return (SYS_NET / link).exists()


def _tap_owner(tap: str) -> int | None:
    """The tap's owning uid; None when `tap` is not a tap or has no owner."""
    try:
        if not (SYS_NET / tap / "tun_flags").exists():
            return None
        owner = int((SYS_NET / tap / "owner").read_text())
    except (OSError, ValueError):
        return None
    return owner if owner >= 0 else None


def _sysctl(name: str) -> None:
    for key, value in net_rules.sysctls(name).items():
        try:
            (PROC_SYS / key).write_text(value)
        except OSError as exc:  # no IPv6 in this kernel: nothing to switch off
            if "ipv6" not in key:
                raise CommandError(["sysctl", key], f"cannot set it: {exc.strerror}") from None


def make_links(net: JobNet, ids: list[int], uid: int) -> None:
    """The bridge (address, up) and a tap of `uid` on it for each vmID: what is there is kept,
    a tap of another owner (a stale one) made again."""
    if not _exists(net.bridge):
        _run(net_rules.bridge_add(net))
    _sysctl(net.bridge)
    for cmd in net_rules.bridge_setup(net):
        _run(cmd)
    for vm_id in ids:
        tap = net.tap(vm_id)
        if _exists(tap) and _tap_owner(tap) != uid:
            _run(net_rules.link_del(tap))
        if not _exists(tap):
            _run(net_rules.tap_add(net, vm_id, uid))
        _sysctl(tap)
        _run(net_rules.tap_attach(net, vm_id))
    if net.mode == "nat" and (PROC_SYS / "net/ipv4/ip_forward").read_text().strip() != "1":
        (PROC_SYS / "net/ipv4/ip_forward").write_text("1")
        _log.info("IPv4 forwarding switched on (the guests' NAT)")


def make_site_taps(net: JobNet, ids: list[int], uid: int, bridge: str) -> None:
    """Each VM's tap on the operator's bridge (`[guest] network = "bridge"`), as make_links' taps."""
    for vm_id in ids:
        tap = net.site_tap(vm_id)
        if _exists(tap) and _tap_owner(tap) != uid:
            _run(net_rules.link_del(tap))
        if not _exists(tap):
            _run(site_bridge.tap_add(net, vm_id, uid))
        _sysctl(tap)
        _run(site_bridge.tap_attach(net, vm_id, bridge))


def apply_site_rules(net: JobNet, rec: Record) -> None:
    """The job's bridge table for the site taps of every vmID recorded on this host (the dev
    cluster's nodes share one host: their VMs' rules live in one table)."""
    ids = sorted({i for vms in rec.nodes.values() for i in vms})
    macs = {i: site_bridge.site_mac(rec.rms, rec.job, i) for i in ids}
    _run(site_bridge.apply_cmd(), stdin=site_bridge.ruleset(net, macs))


def remove_site_rules(net: JobNet) -> list[str]:
    try:
        _run(site_bridge.delete_cmd(net))
    except CommandError:
        return []
    return [f"bridge {site_bridge.table_name(net)}"]


def apply_firewall(net: JobNet) -> None:
    """The job's chains (rewritten in one commit per table) and the jumps into them."""
    _run([net_rules.IPTABLES + "-restore", "-w", "5", "--noflush"], stdin=net_rules.restore_text(net))
    for table, main, rule in net_rules.jumps(net):
        try:
            _run(net_rules.jump_check(table, main, rule))
        except CommandError:
            _run(net_rules.jump_insert(table, main, rule))


def remove_firewall(net: JobNet) -> list[str]:
    removed = []
    for table, main, rule in net_rules.jumps(net):
        for _ in range(8):  # a jump inserted twice (by hand, by an old service) goes too
            try:
                _run(net_rules.jump_delete(table, main, rule))
            except CommandError:
                break
    for table, chain in net_rules.chain_names(net):
        try:
            _run(net_rules.chain_flush(table, chain))
            _run(net_rules.chain_delete(table, chain))
            removed.append(chain)
        except CommandError:
            continue
    return removed


def _taps_of(net: JobNet) -> list[str]:
    """The job's taps on this host, on its own bridge (-tNN) and on the operator's (-sNN)."""
    prefix = f"{net.bridge}-"
    return sorted(p.name for p in SYS_NET.iterdir() if p.name.startswith(prefix) and OWN_LINK_RE.fullmatch(p.name))


def teardown(net: JobNet, *, bridge_too: bool = True) -> list[str]:
    """Everything of the job's network on this node: tunnel, taps, bridge, chains, record."""
    removed = tunnel.remove(net)
    for link in [*_taps_of(net), *([net.bridge] if bridge_too else [])]:
        if _exists(link):
            _run(net_rules.link_del(link))
            removed.append(link)
    removed += remove_firewall(net)
    if _has_site_rules(net):
        removed += remove_site_rules(net)
    _path(net.bridge).unlink(missing_ok=True)
    return removed


def _drop_node(net: JobNet, rec: Record, node: str) -> list[str]:
    """Node `node`'s taps of the job; the whole network when no node holds one any more."""
    removed = []
    for vm_id in rec.nodes.pop(node, []):
        for tap in (net.tap(vm_id), net.site_tap(vm_id)):
            if _exists(tap):
                _run(net_rules.link_del(tap))
                removed.append(tap)
    if rec.nodes:
        _write_record(net.bridge, rec)
        if _has_site_rules(net):
            apply_site_rules(net, rec)
        return removed
    return removed + teardown(net)


def _mine(net: JobNet, grant: Grant) -> Record | None:
    rec = read_record(net.bridge)
    if rec is not None and (rec.rms, rec.job, rec.uid) != (grant.rms, grant.job, grant.uid):
        raise InputError(
            f"job network {net.bridge}: held on this node by {rec.rms} job {rec.job} (its subnetID is this "
            "job's too); it is removed when that job ends"
        )
    return rec


def _up(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    guest = site.config().guest
    net = net_rules.job_net(grant.rms, grant.job, guest.network)
    ids = net_rules.vm_ids(fields["first_vm_id"], fields["vms"], len(grant.nodes))
    bridged = net.mode == "bridge"
    if bridged:
        site_bridge.check_bridge(guest.bridge, grant.node, str(SYS_NET))
    node_cfg = site.config().node  # the RMS's node addresses asked before the lock: it may take a while
    wire = tunnel.plan_for(net, grant.node, grant.nodes, node_cfg.tunnel_networks, node_cfg.tunnel_port)
    with _lock:
        rec = _mine(net, grant) or Record(grant.rms, grant.job, grant.uid)
        rec.nodes[grant.node] = sorted({*rec.nodes.get(grant.node, []), *ids})
        _write_record(net.bridge, rec)  # first: whatever is made next is found again
        make_links(net, ids, grant.uid)
        apply_firewall(net)
        if wire is not None:
            tunnel.ensure(net, wire)
            _sysctl(tunnel.device(net))
        elif tunnel.exists(net):  # all of the job on this host now, or tunnels switched off
            tunnel.remove(net)
        if bridged:
            if node_cfg.tunnel_networks:  # a guest on the site's LAN must not pose as a node's VXLAN
                tunnel.ensure_guard(node_cfg.tunnel_port)
            apply_site_rules(net, rec)  # the rules before the taps join the operator's bridge
            make_site_taps(net, ids, grant.uid, guest.bridge)
    try:
        resolv = RESOLV_CONF.read_text()[:65536]
    except OSError:
        resolv = ""
    _log.info("job network up", job=grant.job, node=grant.node, bridge=net.bridge, vms=ids, uid=grant.uid)
    answer = {
        "bridge": net.bridge,
        "gateway": str(net.gateway),
        "prefix": net.subnet.prefixlen,
        # on the operator's bridge the site's DHCP names the servers, unless the operator did
        "dns": list(guest.dns[: net_rules.MAX_DNS]) if bridged else net_rules.name_servers(list(guest.dns), resolv),
        "mode": net.mode,
        "nfs_port": NFS_PORT,
        "tunnel": tunnel.describe(net, wire),
        "vms": [
            {
                "vm_id": i,
                "tap": net.tap(i),
                "mac": mac_address(network.PILOT_MAC_PREFIX, net.subnet_id, i),
                "ip": str(network.ip_address(net.subnet_id, i)),
            }
            for i in ids
        ],
    }
    if bridged:
        answer["site_bridge"] = guest.bridge
        for vm in answer["vms"]:
            vm["site_tap"] = net.site_tap(vm["vm_id"])
            vm["site_mac"] = site_bridge.site_mac(grant.rms, grant.job, vm["vm_id"])
    return answer


def _down(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    net = JobNet(network.pilot_subnet_id(grant.rms, grant.job))
    with _lock:
        rec = _mine(net, grant)
        removed = _drop_node(net, rec, grant.node) if rec is not None else []
    _log.info("job network down", job=grant.job, node=grant.node, removed=removed)
    return {"removed": removed}


OPERATIONS: Mapping[str, OperationSpec] = {
    "net.up": OperationSpec(
        _up,
        {"vms": Integer(1, MAX_VMS_PER_REQUEST), "first_vm_id": Integer(1, network.GATEWAY_VM_ID - 1)},
        deadline_s=60.0,
    ),
    "net.down": OperationSpec(_down, {}, deadline_s=60.0, after_end=True),
}


# -- after a restart ---------------------------------------------------------------------------
def own_objects() -> dict[str, list[str]]:
    """Links and chains named like a job's network on this node (for sweep, tests, operators)."""
    links = sorted(p.name for p in SYS_NET.iterdir() if OWN_LINK_RE.fullmatch(p.name))
    chains = []
    for table in ("filter", "nat"):
        listing = _run([net_rules.IPTABLES, "-w", "5", "-t", table, "-S"])
        chains += [m.group(1) for m in OWN_CHAIN_RE.finditer(listing)]
    tables = [f"bridge {network.bridge_name(i)}" for i in _site_tables()]
    tables += [f"tunnel {network.bridge_name(i)}" for i in sorted(tunnel.tables())]
    return {"links": links, "chains": sorted(chains), "tables": tables}


def _site_tables() -> list[int]:
    """SubnetIDs of the job tables in nftables' bridge family ([] on a node without nft: a site
    that never used `network = "bridge"` need not install it)."""
    try:
        return site_bridge.own_tables(_run(site_bridge.list_cmd()))
    except CommandError:
        return []


def _has_site_rules(net: JobNet) -> bool:
    return net.subnet_id in _site_tables()


def sweep(authority: JobAuthority, subnets: Collection[int] | None = None) -> list[str]:
    """Remove the network of every recorded job no longer running on its node (asked of the
    RMS through `authority`), and every object named like a job network that no record claims
    and that is this service's (a bridge with a job's gateway MAC, a tap, a chain: libvirt's
    own transient job bridges, made by root pilots without a service, have neither and stay).
    `subnets`: only these jobs' (a test beside a running service). Returns what it removed."""
    removed: list[str] = []
    with _lock:
        claimed: set[int] = set()
        for path in sorted(STATE_DIR.glob("vjob-*.json")) if STATE_DIR.is_dir() else []:
            m = OWN_LINK_RE.fullmatch(path.stem)
            rec = read_record(path.stem)
            if m is None or rec is None:
                continue
            net = JobNet(int(m.group(1), 16))
            if subnets is not None and net.subnet_id not in subnets:
                continue
            for node in list(rec.nodes):
                if authority.grant(rec.job, node) is None:
                    removed += _drop_node(net, rec, node)
            if rec.nodes:
                claimed.add(net.subnet_id)
        objects = own_objects()
        unclaimed = {int(OWN_LINK_RE.fullmatch(n).group(1), 16) for n in objects["links"] if _ours(n)}  # type: ignore[union-attr]
        unclaimed |= {int(c.split("-")[1], 16) for c in objects["chains"]}
        unclaimed |= set(_site_tables()) | tunnel.tables()
        if subnets is not None:
            unclaimed &= set(subnets)
        for subnet_id in sorted(unclaimed - claimed):
            net = JobNet(subnet_id)
            removed += teardown(net, bridge_too=_ours(net.bridge))
    if removed:
        _log.warning("job networks of ended jobs removed", removed=removed)
    return removed


def _ours(link: str) -> bool:
    """A tap named like a job's, a VXLAN named like a job's tunnel, or a job bridge carrying the
    service's gateway MAC."""
    m = OWN_LINK_RE.fullmatch(link)
    if m is None:
        return False
    if m.group(2) is not None:
        return True
    if link.endswith("-vx"):
        try:
            return "DEVTYPE=vxlan" in (SYS_NET / link / "uevent").read_text().split()
        except OSError:
            return False
    try:
        return (SYS_NET / link / "address").read_text().strip() == JobNet(int(m.group(1), 16)).gateway_mac
    except OSError:
        return False


SWEEP = sweep
"""What the service runs at start and now and then (every minute is plenty), off its accept loop:
it asks the RMS once per recorded job."""
