"""`[node]`: the node service's socket, the node names it serves, and the limits and deadlines
every caller meets (composed into the one file by vjob.config.composed).

Why here and not in `[agent]`: the service runs on every compute node, the agent on one host;
the pilots (ordinary users) read `socket` from the same file to know whether to ask at all.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, field_validator

from vjob.config import Section

DEFAULT_SOCKET = "/run/vjob/node.sock"
"""Where `vjob node-service` listens when `[node] socket` is empty."""
_SOCKET_RE = re.compile(r"/(?:[A-Za-z0-9._+-]+/)*[A-Za-z0-9._+-]+")
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")


class NodeConfig(Section):
    socket: str = ""
    """The node service's Unix socket, e.g. "/run/vjob/node.sock". Pilots ask it for what needs
    root (bridges and taps, NAT, the NFS gateway, usage records); empty means the site runs no
    node service and pilots do what they can without it. `vjob node-service` listens on this
    path (on /run/vjob/node.sock when empty)."""
    names: list[str] = Field(default_factory=list)
    """The node names (as the RMS knows them) this service answers for; empty means the host's
    short name. Several when one host runs several RMS nodes (the dev cluster's node1..node8)."""
    rms: str = "slurm"
    """Whose record says a job runs here: slurm, oar or pbs (Torque or OpenPBS, as `[pbs] dialect`
    says; `vjob node-service --rms` overrides)."""
    max_connections: int = Field(64, ge=1, le=4096)
    """Open connections the service holds at once, all users together (one thread each)."""
    max_connections_per_user: int = Field(4, ge=1, le=1024)
    """Open connections (and operations still running) one uid may hold; more are refused."""
    requests_per_minute_per_user: int = Field(600, ge=1, le=1_000_000)
    """Requests one uid may make per minute; past it requests are refused until the minute turns."""
    read_deadline_s: float = Field(5.0, gt=0, le=300)
    """Time to send one whole request line, counted from the connection (or the last answer): an
    idle or slow connection is closed when it passes."""
    operation_deadline_s: float = Field(20.0, gt=0, le=3600)
    """Time an operation may take before the caller is answered with a deadline error (an
    operation may ask for longer in its spec)."""
    usage_interval_s: float = Field(5.0, ge=1, le=3600)
    """How often the VMs' CPU time and memory are sampled for the job's RMS record (a VM that
    ends between two samples loses at most this much of its CPU time; a sample reads /proc)."""
    sweep_interval_s: float = Field(60.0, ge=0, le=86400)
    """How often what ended jobs left on the node (networks, NFS gateways) is reaped, asking the
    RMS once per job; 0 never (only for a second service beside the node's own, as the tests
    run: a sweep takes every job object of this host that its own records do not claim)."""

    tunnel_networks: list[str] = Field(default_factory=list, max_length=16)
    """The cluster networks (IPv4 CIDRs, e.g. "10.1.0.0/16") that may carry a multi-node job's
    private network between hosts: when a job's nodes sit on several hosts, each node's service
    joins the job's bridge to the others' by VXLAN over these, to the nodes' addresses from the RMS
    (Slurm's NodeAddr), and refuses a node address outside them. Empty: no tunnels (a job's VMs on
    different hosts do not reach each other). docs/multinode.md, "Spanning real hosts"."""
    tunnel_port: int = Field(4789, ge=1, le=65535)
    """UDP port of those tunnels on every node (IANA's VXLAN port by default): the nodes must
    let it through between them."""

    @field_validator("tunnel_networks")
    @classmethod
    def _tunnel_networks(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                net = ipaddress.IPv4Network(text)
            except ValueError as exc:
                raise ValueError(f"{text[:60]!r}: an IPv4 network such as 10.1.0.0/16 ({exc})") from None
            if net.is_loopback or net.is_multicast or net.is_unspecified or net.prefixlen == 0:
                raise ValueError(f"{text[:60]!r}: the cluster network, not loopback, multicast or everything")
        return value

    @field_validator("socket")
    @classmethod
    def _socket(cls, value: str) -> str:
        if value and (not _SOCKET_RE.fullmatch(value) or "/../" in value + "/" or len(value) > 100):
            raise ValueError(f"{value[:80]!r}: an absolute path of plain names, at most 100 characters")
        return value

    @field_validator("names")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _NODE_RE.fullmatch(name):
                raise ValueError(f"{name[:80]!r}: a node name (letters, digits, '.', '-')")
        return value

    @field_validator("rms")
    @classmethod
    def _rms(cls, value: str) -> str:
        if value not in ("slurm", "oar", "pbs"):
            raise ValueError(f"{value[:40]!r}: slurm, oar or pbs")
        return value
