"""`[saline]` and its `[[saline.sites]]`: the best-effort manager's timings, socket, network
identities (MAC and IP layout, the NAT interface) and sites, read by this package (composed
into the one file by vjob.config.composed).
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, field_validator, model_validator

from vjob.config import AgentConfig, Section

# Checked with `fullmatch`: `$` would accept a trailing newline.
_MAC_PREFIX = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){2}")
_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,14}")


class SiteConfig(Section):
    name: str
    """The site's name (its master allocates identities under it)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SITE_NAME.fullmatch(value):
            raise ValueError(f"{value!r}: must be letters, digits, '.', '_' or '-' (at most 64, no newline)")
        return value

    oar_api_url: str = ""
    """Base URL of the site's OAR REST API; empty: use the OAR commands."""
    oar_bin_dir: str = ""
    """Directory of the site's oarsub, oarstat...; empty means search PATH."""
    repository: str = ""
    """Directory (or host:path) of the site's snapshot repository."""
    oar_properties: str = ""
    """oarsub -p filter selecting this site's resources when several sites share one OAR."""
    default_image: str = ""
    """Every best-effort job of this site (its `oar_properties`) becomes a Saline vjob of this
    image with no `-t vjob=IMAGE` (`vjob oar install-rules` writes it into the admission rule);
    empty: only jobs asking for an image."""
    allow_opt_out: bool = False
    """With `default_image`: whether `-t vjob=off` lets a best-effort job run bare (else refused)."""

    @field_validator("default_image")
    @classmethod
    def _image(cls, value: str) -> str:
        if value and not _SITE_NAME.fullmatch(value):
            raise ValueError(f"{value[:80]!r}: an image name is letters, digits, '.', '_' or '-' (at most 64)")
        return value


class SalineConfig(Section):
    snapshot_period_s: float = Field(600.0, gt=0)
    """Seconds between two periodic snapshots of a best-effort vjob (at most this much work is lost)."""
    checkpoint_signal: int = Field(12, ge=1, le=64)
    """The signal OAR sends before a best-effort kill (oarsub --signal; 12 is SIGUSR2)."""
    checkpoint_delay_s: int = Field(60, ge=0)
    """oarsub --checkpoint: OAR signals this long before a best-effort kill; 0: no signal."""
    mac_prefix: str = "52:54:00"
    """Three octets; a VM's MAC is prefix + subnetID (2 octets) + vmID (1 octet)."""
    network: str = "10.0.0.0/8"
    """Base network (a /8 or larger); a VM's IP is base + subnetID·256 + vmID (10.hi.lo.vm)."""
    sites: list[SiteConfig] = Field(default_factory=list)
    metrics_port: int = Field(0, ge=0, le=65535)
    """The Saline manager's Prometheus port; 0 disables its exporter."""
    metrics_address: str = "127.0.0.1"
    """Address the manager's exporter binds to (an IP; 0.0.0.0 for every interface)."""

    @field_validator("metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return AgentConfig._address(value)  # one rule for every exporter address

    metrics_web_config: str = ""
    """Prometheus' web configuration file for the manager's exporter (TLS, basic auth), the
    same format and rules as `[agent] metrics_web_config`; empty: plain HTTP."""

    @field_validator("metrics_web_config")
    @classmethod
    def _web_config(cls, value: str) -> str:
        return AgentConfig._web_config(value)  # one rule for every exporter's web configuration

    poll_interval_s: float = Field(2.0, gt=0, le=600)
    """How often the manager looks at OAR and at each vjob's VMs."""
    requeue_after_s: float = Field(30.0, gt=0)
    """A resubmitted vjob still waiting after this long moves to a site with free resources."""
    migrate_wait_s: float = Field(20.0, ge=0)
    """On OAR's checkpoint signal the manager asks OAR for new resources (same site, then
    another) and live-migrates the VMs there; this is the longest wait for such a job to
    start before the next try or the suspension to the repository. 0: always suspend."""
    default_walltime: str = "2:00:00"
    """Walltime of a best-effort submission that names none (OAR's h:mm:ss)."""
    socket: str = "/run/vjob/saline.sock"
    """The manager's Unix socket (users' `vjob besteffort` commands and OAR's admission rule
    talk to it); `--socket` and $VJOB_SALINE_SOCKET override it."""
    socket_group: str = ""
    """Only this group (and root) may use the socket (mode 0660; with the OAR admission rule,
    put OAR's `oar` account in it too); empty: everyone (0666). `--socket-group` overrides it."""
    socket_connections_per_user: int = Field(16, ge=1, le=10_000)
    """Connections one user (uid) may hold open on the socket at once; more are refused at once
    (root never is). Each is a thread and a descriptor of the root manager."""
    socket_connections: int = Field(128, ge=1, le=100_000)
    """Connections of all users at once on the socket (root's excepted); keep it above
    socket_connections_per_user and below the manager's descriptor limit."""
    socket_read_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A client's whole request line must arrive within this many seconds of connecting (and
    its answer be taken within as long), or the connection is closed."""
    lease_s: float = Field(0.0, ge=0)
    """Seconds a vjob's lease outlives its manager's last renewal (a dead master's vjobs wait
    this long); 0: max(120, 30 × poll_interval_s). Keep it far above the masters' clock skew."""
    nat_network: str = ""
    """The libvirt network of every VM's second NIC, the paper's NAT interface (the same name on
    every node; defined by vjob with `<forward mode='nat'>` where absent, an operator's own used
    as it is); empty: VMs have only the vjob's private network. docs/saline.md."""
    nat_range: str = "100.64.0.0/10"
    """The NAT network's addresses (a /8../16 apart from `network`): a VM's is base +
    subnetID·256 + vmID, static, the same at every site; the gateway is base + 1 on every node."""
    nat_mac_prefix: str = "52:54:01"
    """Three octets (not `mac_prefix`): a VM's NAT MAC is prefix + subnetID + vmID, the
    gateway's prefix:00:00:00 on every node."""
    nat_dns: list[str] = Field(default_factory=list)
    """Name servers the guests put in resolv.conf; empty: the gateway (libvirt's dnsmasq, which
    the nodes then need); given: the network vjob defines runs no DNS (no dnsmasq)."""

    @field_validator("mac_prefix", "nat_mac_prefix")
    @classmethod
    def _mac(cls, value: str) -> str:
        if not _MAC_PREFIX.fullmatch(value):
            raise ValueError(f"{value!r}: must be three hex octets like 52:54:00")
        return value.lower()

    @field_validator("nat_network")
    @classmethod
    def _nat_name(cls, value: str) -> str:
        if value and (not _NAT_NAME.fullmatch(value) or value.startswith(("vjob-", "vsal-"))):
            raise ValueError(f"{value!r}: must match {_NAT_NAME.pattern} (a bridge name) and not start vjob-/vsal-")
        return value

    @field_validator("nat_range")
    @classmethod
    def _nat_range(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"{value!r}: not an IPv4 network ({exc})") from None
        if not 8 <= net.prefixlen <= 16:
            raise ValueError(f"{value!r}: must be a /8 to /16 (room for subnetID·256 + vmID)")
        return str(net)

    @field_validator("nat_dns")
    @classmethod
    def _nat_dns(cls, value: list[str]) -> list[str]:
        for ip in value:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError:
                raise ValueError(f"{ip!r}: not an IPv4 address") from None
        return value[:3]  # the resolver reads at most three

    @model_validator(mode="after")
    def _nat_apart(self) -> SalineConfig:
        if self.nat_network:
            if self.nat_mac_prefix == self.mac_prefix:
                raise ValueError(f"nat_mac_prefix = {self.nat_mac_prefix!r}: must differ from mac_prefix")
            try:
                private = ipaddress.IPv4Network(self.network)
            except ValueError:
                return self  # `network` is refused where it is used (saline_bew.identity)
            if ipaddress.IPv4Network(self.nat_range).overlaps(private):
                raise ValueError(f"nat_range = {self.nat_range!r}: overlaps network = {self.network!r}")
        return self
