"""`[guest]`: what every vjob guest gets from the site — its filesystems and its network —
declared once by the operator (composed into the one file by vjob.config.composed).

Why a section of its own and not per-job options: a job's user controls its script and its
`#VJOB` line, never which of the site's exports a guest may mount or how the guest reaches
the network; the node-side service (provisioning.node_service) reads this and nothing the
user wrote.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vjob.config import Section

ABSOLUTE_PATH_RE = re.compile(r"/(?:[A-Za-z0-9._+-]+/?)*")
"""An absolute path of plain names (no spaces, quotes or glob characters): it goes into the
NFS server's configuration and the guest's mount table."""
MOUNT_OPTION_RE = re.compile(r"[a-z0-9_]+(?:=[A-Za-z0-9._-]+)?")
BRIDGE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
"""An interface name the kernel takes (≤ 15 characters) of a safe alphabet (the node service
checks it again, and that it is a bridge, at every net.up: provisioning.node_service.site_bridge)."""
JOB_BRIDGE_RE = re.compile(r"(?:vjob|vsal)-.*")


class GuestMount(Section):
    """One of the site's filesystems, as every guest sees it."""

    source: str
    """The directory as the node sees it (an NFS mount of the node at a real site; a plain
    directory on the dev cluster), e.g. "/home"."""
    target: str = ""
    """Where it appears in the guest; empty means the same path as on the node."""
    options: list[str] = Field(default_factory=list)
    """Extra mount options for the guest's NFS client (e.g. "noatime", "rsize=1048576")."""

    @field_validator("source", "target")
    @classmethod
    def _path(cls, value: str) -> str:
        if value and (not ABSOLUTE_PATH_RE.fullmatch(value) or "/../" in f"{value}/" or "/./" in f"{value}/"):
            raise ValueError(f"{value[:80]!r}: an absolute path of plain names (no '..', spaces or quotes)")
        return value.rstrip("/") or "/"

    @field_validator("options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for opt in value:
            if not MOUNT_OPTION_RE.fullmatch(opt) or len(opt) > 64:
                raise ValueError(f"{opt[:80]!r}: a mount option is name or name=value of letters, digits, . _ -")
        return value

    @property
    def guest_path(self) -> str:
        return self.target or self.source


class GuestConfig(Section):
    mounts: list[GuestMount] = Field(default_factory=list)
    """The site's filesystems every guest mounts for its job's user, e.g.
    `mounts = [{source = "/home"}, {source = "/scratch"}]`."""
    network: Literal["nat", "none", "bridge"] = "nat"
    """How guests reach the site network: "nat" through the node (default: the node service's
    firewall and NAT, docs/realjobs.md "Network"), "none" for the job's own network only (the
    NFS gateway stays reachable), "bridge" for a second NIC on the operator's bridge `bridge`
    whose address, route and name servers come from the site's DHCP server (the job's own
    network keeps its NFS gateway and its VMs' private network)."""
    bridge: str = ""
    """With network = "bridge": the name of an existing Linux bridge on every node, joined to
    the site's network (e.g. "br0"); checked on the node at every job's start."""
    dns: list[str] = Field(default_factory=list)
    """Name servers the guests use; empty means the node's own (/etc/resolv.conf, loopback
    resolvers left out)."""

    @field_validator("bridge")
    @classmethod
    def _bridge(cls, value: str) -> str:
        if value and (not BRIDGE_NAME_RE.fullmatch(value) or JOB_BRIDGE_RE.fullmatch(value)):
            raise ValueError(
                f"{value[:40]!r}: the name of the operator's Linux bridge, 1..15 letters, digits, '.', '_', '-' "
                "(not a job bridge vjob-*/vsal-*)"
            )
        return value

    @model_validator(mode="after")
    def _bridge_with_network(self) -> GuestConfig:
        if self.network == "bridge" and not self.bridge:
            raise ValueError('network = "bridge" needs bridge = the name of the operator\'s bridge on the nodes')
        if self.bridge and self.network != "bridge":
            raise ValueError(
                f'bridge = {self.bridge!r} is used only with network = "bridge" (network is {self.network!r})'
            )
        return self

    @field_validator("dns")
    @classmethod
    def _dns(cls, value: list[str]) -> list[str]:
        for ip in value:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError:
                raise ValueError(f"{ip[:60]!r}: an IPv4 address") from None
        return value
