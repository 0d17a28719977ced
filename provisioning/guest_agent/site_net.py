"""The guest's way to the site network: job.json's `network.site`, checked.

Why the job network's own NIC and not a second one: the node service puts the node's address,
the gateway G (10.hi.lo.254, provisioning.network.gateway_address), on the job's bridge, the
same on every node; a VM's address on the job network (10.hi.lo.vmID) then needs only a default
route via G and a resolv.conf to reach the site through the node's NAT. A one-node job gets
that NIC too (vmID 1); a multi-node job's VMs keep their private network on it.

The agent applies it with its NAT interface's code (agent.setup_nat): the NIC's static address,
the default route via G, resolv.conf. A guest resumed or migrated to another node keeps all of
it: the same gateway address and MAC answer there.

Standard library only (installed under /usr/lib/vjob-guest, imported by the agent).
"""

from __future__ import annotations

import ipaddress

MAX_DNS = 3


class SiteError(Exception):
    """`network.site` is unusable; the message names the field."""


def _ipv4(field: str, value: object) -> str:
    try:
        return str(ipaddress.IPv4Address(value if isinstance(value, str) else ""))
    except ValueError:
        raise SiteError(f"network.site.{field}: {str(value)[:40]!r}: must be an IPv4 address") from None


def parse_site(data: object, mac: str, ip: str, prefix: int) -> dict[str, object]:
    """The fields of the agent's `Nat` for the job NIC (`mac`, `ip`/`prefix`): its gateway,
    another address of the NIC's own network, and 0..3 name servers (none: the node had no
    usable resolver and the operator set no `[guest] dns`; names then do not resolve)."""
    if not isinstance(data, dict):
        raise SiteError("network.site: must be an object")
    gateway = _ipv4("gateway", data.get("gateway"))
    own = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if ipaddress.IPv4Address(gateway) not in own or gateway == ip:
        raise SiteError(f"network.site.gateway: {gateway}: must be another address of {own}")
    dns = data.get("dns", [])
    if not isinstance(dns, list) or len(dns) > MAX_DNS:
        raise SiteError(f"network.site.dns: must be a list of at most {MAX_DNS} IPv4 addresses")
    return {"mac": mac, "ip": ip, "prefix": prefix, "gateway": gateway, "dns": [_ipv4("dns", d) for d in dns]}
