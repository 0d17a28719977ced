"""Configuration: one TOML file, validated at load, with embedded defaults for a first run.

Why pydantic models with `extra="forbid"`: an operator's typo (`[priorty]`, `weigth = 1`) must
be an error naming the key, not a silently ignored setting. Each capability owns one section
class below; the defaults are what a one-machine development cluster needs.

Lookup order for the file: `--config PATH`, then `$VJOB_CONFIG`, then `/etc/vjob/vjob.toml`
when it exists; with none of them the embedded defaults apply (SQLite under the data dir).
"""

from __future__ import annotations

import ast
import inspect
import ipaddress
import os
import re
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vjob.errors import ConfigError
from vjob.secrets import MASK, is_secret_name, mask_text, mask_url, raw_at_in_userinfo

DEFAULT_PATH = Path("/etc/vjob/vjob.toml")
ENV_VAR = "VJOB_CONFIG"


def default_data_dir() -> Path:
    """Where vjob keeps its SQLite store and snapshots when nothing is configured."""
    env = os.environ.get("VJOB_DATA_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/vjob")
    return Path.home() / ".local" / "share" / "vjob"


# Checked with `fullmatch`: `$` would accept a trailing newline.
_MAC_PREFIX = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){2}")
_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,14}")


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment."""

    # No use_attribute_docstrings: it parses every class's source at import (70 ms of each
    # `vjob` command); only `vjob config reference` reads the docstrings (_attribute_docs).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DatabaseConfig(Section):
    url: str = ""
    """Any SQLAlchemy URL; empty means SQLite at <data_dir>/vjob.sqlite. A `@`, `:` or `/` in
    the password is percent-encoded (`%40`, `%3A`, `%2F`)."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # Issue 39, item 13: a raw '@' made the password's tail the host name, quoted in the
        # driver's error on every tick. Refused here, once, without the value (see _describe).
        if raw_at_in_userinfo(value):
            raise ValueError(
                "the user name or password holds a raw '@', so the URL would be cut at it and the "
                "rest taken for the host name; write each '@' in it as %40"
            )
        return value

    connect_timeout_s: float = Field(5.0, gt=0, le=300)
    """How long to wait for a database server before reporting it unreachable."""
    busy_timeout_s: float = Field(30.0, gt=0, le=600)
    """SQLite: how long a writer waits for another process's write lock."""


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level that is logged."""
    format: Literal["auto", "console", "json"] = "auto"
    """auto: readable on a terminal, one JSON object per line otherwise."""


class PriorityWeights(Section):
    """The UBIS weights w1..w7 (paper defaults), named after the term they scale."""

    usage: float = Field(0.07, ge=0)
    """w1, scales Target−Usage: a user below their share goes first."""
    queue_time: float = Field(0.13, ge=0)
    """w2, scales the time in queue."""
    os_available: float = Field(0.10, ge=0)
    """w3, scales N_availableOS − N_reqOS: nodes already running the job's OS."""
    preempt_count: float = Field(0.10, ge=0)
    """w4, scales Pn, how often the job was preempted."""
    preempt_time: float = Field(0.16, ge=0)
    """w5, scales Pt, how long the job has been preempted in total."""
    free_nodes: float = Field(0.20, ge=0)
    """w6, scales N_free − (N_reqOS − N_availableOS): can it start now."""
    interactive: float = Field(0.24, ge=0)
    """w7, scales I: 1 for an interactive job under the interactive cap."""


class PriorityConfig(Section):
    weights: PriorityWeights = PriorityWeights()
    max_queue_time_s: float = Field(7 * 24 * 3600.0, gt=0)
    """Queue time at which the queue-time term saturates at 1 (like Slurm's PriorityMaxAge)."""
    max_preempt_count: int = Field(5, ge=1)
    """Preemption count (Pn) at which the preempt-count term saturates at 1."""
    max_preempt_time_s: float = Field(24 * 3600.0, gt=0)
    """Total preempted time (Pt) at which the preempt-time term saturates at 1."""
    usage_half_life_s: float = Field(7 * 24 * 3600.0, gt=0)
    """Half-life of the exponential decay of recorded usage (node-seconds)."""
    interactive_cap: float = Field(0.15, ge=0, le=1)
    """Largest share of the nodes interactive jobs may hold before their I term drops to 0."""
    interactive_user_cap: float | None = Field(None, ge=0, le=1)
    """Optional share of the nodes one user's interactive jobs may hold."""
    targets: dict[str, float] = {}
    """Target share per user (0..1); users not listed share what is left equally."""
    account_targets: dict[str, float] = {}
    """Target share per account (0..1)."""

    @field_validator("targets", "account_targets")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for name, share in value.items():
            if not 0 <= share <= 1:
                raise ValueError(f"target of {name!r} = {share}: must be between 0 and 1")
        if sum(value.values()) > 1 + 1e-9:
            raise ValueError(f"targets add up to {sum(value.values()):.3f}: must be at most 1")
        return value


class SchedulingConfig(Section):
    """The scheduling pass's policy (preemption/scheduling/tick.decide), for the agent and
    `vjob simulate` alike. docs/policy.md explains the policies and why vjob is the default."""

    policy: Literal["vjob", "ubis", "mms", "mms-block", "fcfs-easy"] = "vjob"
    """Queue order and preemption rule: vjob (interactive jobs first, may checkpoint batch jobs
    by cost while the queue head's reservation holds), ubis (the paper's priority order),
    mms, mms-block, fcfs-easy (no preemption)."""
    max_preemptions: int = Field(2, ge=0, le=1000)
    """vjob: a batch job checkpointed this many times is no longer a victim (0 = never preempt)."""
    head_slack_s: float = Field(600.0, ge=0)
    """vjob: seconds an interactive job's preemption may push back the reserved start of the
    first batch job in the queue; beyond that the interactive job waits (reserves) instead."""
    interactive_ahead: Literal["off", "backfill", "queue", "guarded"] = "backfill"
    """vjob, interactive jobs beyond the cap (they neither preempt nor count against it): off =
    they queue with the batch jobs by submission time; backfill = that too, but EASY looks at
    them first when it backfills; queue = they queue ahead of every batch job (and can become
    the head); guarded = they are looked at before the batch jobs and start when they fit and
    keep the first batch job's reservation within head_slack_s, but never hold a reservation."""
    victims: Literal["cost", "guard", "fallback"] = "cost"
    """vjob, the order victims are taken in: cost = fewest earlier preemptions, nodes on the
    image, smallest checkpoint; guard = first those whose return would not move the first batch
    job's reserved start (they end after it, or are back and done before it), then by cost
    (shorter interactive waits, but more preemptions cost batch work; docs/policy.md);
    fallback = by cost, and when the guard refuses those, once more in guard's order."""
    interactive_reserve_nodes: int = Field(0, ge=0, le=1_000_000)
    """vjob: free nodes kept for interactive jobs not yet arrived (0 = off): other jobs start,
    and are backfilled, only if they leave this many free (at most the cap's room; a job larger
    than the machine minus the reserve is not held to it), and the queue head's EASY
    reservation counts them (preemption/scheduling/reserve.py). Costs batch work on the Lublin
    grid, hence off (docs/policy.md)."""
    interactive_reserve_arrivals: int = Field(0, ge=0, le=1_000_000)
    """vjob: hold `interactive_reserve_nodes` only while at least this many interactive jobs
    submitted within the last `interactive_reserve_window_s` are queued or running (0 = always;
    preemption/scheduling/reserve.py, docs/policy.md)."""
    interactive_reserve_window_s: float = Field(3600.0, gt=0, le=30 * 24 * 3600)
    """vjob: the window of `interactive_reserve_arrivals`, in seconds."""


class AgentConfig(Section):
    interval_s: float = Field(10.0, gt=0, le=3600)
    """Seconds between two observe-decide-act rounds (a new interactive job wakes it at once)."""
    rms: Literal["slurm", "pbs", "oar", "sim"] = "slurm"
    """The resource manager `vjob agent` and `vjob status` use when not given --rms."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """Prometheus metrics port (TCP); 0 disables the exporter."""
    metrics_address: str = "127.0.0.1"
    """IP address the Prometheus exporter listens on: 127.0.0.1 (this host only), an interface's
    address, or 0.0.0.0 / :: for every interface (then restrict the port with a firewall)."""

    @field_validator("metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value[:80]!r}: must be an IPv4 or IPv6 address, e.g. 127.0.0.1 or 0.0.0.0") from None

    command_timeout_s: float = Field(30.0, gt=0, le=600)
    """Timeout of one RMS command (squeue, qstat, oarstat...)."""
    checkpoint_timeout_s: float = Field(120.0, gt=0, le=3600)
    """How long a switch waits for a victim's pilot to save its VM before withdrawing: the
    floor, to which checkpoint_timeout_per_gib_s adds per GiB of the VM's memory."""
    checkpoint_timeout_per_gib_s: float = Field(10.0, ge=0, le=600)
    """Seconds added to checkpoint_timeout_s per GiB of the victim VM's memory (a save writes
    about 5 s/GiB on a local disk: 2x that by default), so a big VM is not withdrawn mid-save."""
    checkpoint_timeout_max_s: float = Field(7200.0, gt=0, le=86400)
    """The longest a switch waits for one save, whatever the VM's memory; at least
    checkpoint_timeout_s. While a switch waits, the agent's lease keeper feeds systemd's
    watchdog, so the unit's WatchdogSec need not exceed it."""
    cleanup_after_s: float = Field(3600.0, ge=0)
    """A vjob the RMS no longer knows (cancelled, timed out) keeps its saved VM this long, then
    the agent deletes it (its memory state and disk overlay hold user data)."""
    pilot_dir: str = ""
    """Where pilots and the agent exchange state and checkpoint requests (one directory per
    job); empty means <data_dir>/pilots. Must be shared by the agent and the compute nodes."""
    multinode_pilots: Literal["leader", "per-node"] = "leader"
    """A multi-node vjob's VMs: "leader", the first node's pilot drives every VM (through each
    node's libvirt); "per-node", it starts a member pilot on every other node (srun, oarsh, pbsdsh) that
    builds, boots, saves and restores its own node's VM at the leader's word (docs/multinode.md)."""
    member_address: str = ""
    """The IP address a per-node job's leader pilot listens on and gives its member pilots: one of
    the first node's addresses the other nodes reach. Empty: the source address of this node's
    route toward the first member node (its name resolved; no packet sent), else the address of
    the node's host name. Set it where that route is not the one members come back by."""

    @field_validator("member_address")
    @classmethod
    def _member_address(cls, value: str) -> str:
        if not value:
            return value
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value[:80]!r}: must be an IP address of this node (IPv4 or IPv6), e.g. "
                             "10.1.0.5, or empty to take the route toward the member nodes") from None  # fmt: skip

    lease_s: float = Field(30.0, ge=5, le=3600)
    """The agent's lease on its cluster in the store: one agent per RMS acts at a time; a
    standby (e.g. on the second controller of an HA pair) takes over this long after the active
    agent dies. Renewed every third of it, also by a thread while a switch waits for saves (an
    agent that loses it stops acting); keep it well above the hosts' clock skew."""

    @model_validator(mode="after")
    def _timeouts(self) -> AgentConfig:
        if self.checkpoint_timeout_max_s < self.checkpoint_timeout_s:
            raise ValueError(f"checkpoint_timeout_max_s = {self.checkpoint_timeout_max_s:g} is below "
                             f"checkpoint_timeout_s = {self.checkpoint_timeout_s:g}: the cap must be at least "
                             "the floor")  # fmt: skip
        return self

    def checkpoint_timeout_for(self, memory_mb: float) -> float:
        """How long to wait for the save of a VM of `memory_mb` MiB: the floor plus
        checkpoint_timeout_per_gib_s per GiB, at most checkpoint_timeout_max_s."""
        gib = max(0.0, float(memory_mb)) / 1024
        return min(self.checkpoint_timeout_max_s, self.checkpoint_timeout_s + self.checkpoint_timeout_per_gib_s * gib)


class ProvisioningConfig(Section):
    image_dir: str = ""
    """Where the OS image catalogue keeps base images; empty means <data_dir>/images. `{node}`
    is replaced by the node name (one directory per node when nodes share a filesystem)."""
    head_node: str = "head"
    """The node holding the catalogue: the root of the image distribution tree."""
    snapshot_dir: str = ""
    """VM memory states and snapshot copies of overlays; empty means <data_dir>/snapshots (mode
    0700). `{node}` is replaced by the node name."""
    nodes: dict[str, str] = {}
    """libvirt URI per node name, e.g. {n1 = "qemu:///system"}."""
    default_uri: str = "qemu:///system"
    """libvirt URI of a node not listed in `nodes`."""
    copy_method: Literal["local", "rsync", "scp"] = "local"
    """How images and snapshots travel between nodes."""
    operation_timeout_s: float = Field(300.0, gt=0)
    """Timeout of one VM operation (save, restore, migrate)."""
    vm_dir: str = ""
    """Per-VM disk overlays and console logs; empty means <data_dir>/vms. `{node}` is replaced
    by the node name (one directory per node when nodes share a filesystem)."""
    hosts: dict[str, str] = {}
    """ssh host per node for rsync/scp copies; a node not listed is reached by its name, and
    `""` means this machine (no ssh). `$VJOB_SSH_CONFIG` names an ssh config file (ssh -F)."""
    migrate_uris: dict[str, str] = {}
    """QEMU migration URI per destination node (e.g. tcp://10.0.0.2:49152); default: libvirt's."""
    domain_type: Literal["auto", "qemu", "kvm"] = "auto"
    """libvirt domain type on qemu:// nodes: "auto" uses KVM only where a probe boot proved it
    works (answer cached per host), "qemu" (TCG) always, "kvm" always."""
    cpu_model: str = "qemu64"
    """CPU model every real-job VM gets (KVM and TCG alike), so that a saved VM restores on any
    host of the site; "" lets libvirt choose (then a state may not restore elsewhere)."""
    qemu_user: str = "libvirt-qemu"
    """The user QEMU runs as; VM overlays are owned by it (mode 0600) and never relabelled."""
    free_page_reporting: bool = True
    """Free page reporting on every VM's balloon: the guest hands the memory it frees back to
    QEMU, so a checkpoint writes it as zero pages (16–27 % fewer bytes, docs/provisioning.md).
    A state restores with the balloon it was saved with, whatever this says."""
    stage_limit_mb: int = Field(2048, ge=1)
    """Largest working directory (MiB of files) a real job may stage into its VM's job disk;
    a job over it is refused before anything starts (docs/realjobs.md)."""
    job_disk_free_mb: int = Field(4096, ge=64)
    """Room on a job disk for what the job writes (sparse: costs nothing until written)."""


class PlannerConfig(Section):
    optimizer: Literal["cpsat", "ffd"] = "cpsat"
    """cpsat: OR-Tools CP-SAT minimises the plan cost; ffd: first-fit decreasing baseline."""
    time_limit_s: float = Field(10.0, gt=0, le=3600)
    """Wall-clock budget of one planning, model building included: CP-SAT improves on the best
    heuristic placement until then, and the plan comes from the heuristics alone when it is
    too short for the solver."""
    interval_s: float = Field(0.0, ge=0, le=86400)
    """The agent's control loop (Entropy): every this many seconds it re-plans the vjobs it holds
    from the CPU and memory demand it measures (libvirt) and carries the switch out live; 0 turns
    the loop off."""
    busy: float = Field(0.5, gt=0, le=1)
    """Share of an interval a vCPU must want — compute, or wait for a host CPU (starved, not idle) —
    to count as busy (one CPU of demand), measured by the agent through libvirt."""


class SlurmConfig(Section):
    bin_dir: str = ""
    """Directory of the Slurm commands; empty means search PATH."""
    site_factor_max: int = Field(1_000_000, ge=1)
    """The site factor a priority of 1.0 maps to (Slurm's PriorityWeightSite scale)."""
    conf: str = ""
    """slurm.conf the commands use (passed as SLURM_CONF); empty means Slurm's own default."""
    image_list: str = ""
    """The OS image list job_submit.lua reads (vjob-images.list next to slurm.conf); empty: none."""


class PbsConfig(Section):
    dialect: Literal["torque", "openpbs"] = "openpbs"
    """Which PBS the agent talks to: Torque (qstat -x XML) or OpenPBS / PBS Pro (-F json)."""
    bin_dir: str = ""
    """Directory of qstat, pbsnodes, qalter, ...; empty means search PATH."""
    torque_format: Literal["xml", "text"] = "xml"
    """Torque only: read `qstat -x`/`pbsnodes -x` (xml) or, for servers without XML, the text forms."""
    interactive_queues: list[str] = ["interactive"]
    """Queues whose jobs are interactive even without `qsub -I`."""
    besteffort_queues: list[str] = []
    """Queues whose jobs are best-effort (preempted first, never preempting)."""
    os_property_prefix: str = "os_"
    """A node property `os_centos7` means the node runs image centos7 (UBIS's VM_os)."""
    os_images: list[str] = []
    """OS images the submit filter and hook accept; empty accepts any well-formed name."""
    filter_budget_s: float = Field(2.0, gt=0, le=60)
    """The submit filter passes the script through unchanged when it needs longer than this."""


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
    sites: list[SiteConfig] = []
    metrics_port: int = Field(0, ge=0, le=65535)
    """The Saline manager's Prometheus port; 0 disables its exporter."""
    metrics_address: str = "127.0.0.1"
    """Address the manager's exporter binds to (an IP; 0.0.0.0 for every interface)."""

    @field_validator("metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        return AgentConfig._address(value)  # one rule for every exporter address

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
    nat_dns: list[str] = []
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


TUNE_OBJECTIVES = (
    "interactive_response",
    "interactive_wait",
    "batch_response",
    "batch_slowdown",
    "large_batch_response",
    "utilization",
)
"""What a `vjob tune` trial can optimise (simulator/tune/space.py measures them)."""
TUNE_BOUNDS: dict[str, tuple[float, float]] = {
    **{name: (0.0, 0.5) for name in PriorityWeights.model_fields},
    "interactive_cap": (0.02, 0.5),
    "head_slack_s": (0.0, 7200.0),
    "max_preemptions": (0.0, 5.0),
}
"""Tunable parameters and their built-in search ranges (the first value is also the floor)."""


class TuneConfig(Section):
    """`vjob tune`: what is searched, within which bounds, for which objectives (docs/tune.md)."""

    objectives: list[Literal[TUNE_OBJECTIVES]] = ["interactive_response", "batch_slowdown"]  # type: ignore[valid-type]
    """What a trial measures on the training part of the trace: interactive_response,
    interactive_wait, batch_response, batch_slowdown, large_batch_response (lowered) or
    utilization (raised)."""
    policy: Literal["ubis", "vjob"] = "ubis"
    """The policy the trials replay: the weights rank the queue under ubis; vjob's knobs
    (head_slack_s, max_preemptions) act under vjob."""
    sampler: Literal["nsga2", "tpe"] = "nsga2"
    """Optuna's sampler: NSGA-II (a genetic front) or multi-objective TPE (better with few trials)."""
    search: list[str] = list(TUNE_BOUNDS)[:8]
    """Parameters searched: the weights (usage ... interactive), interactive_cap, head_slack_s,
    max_preemptions; the others keep their [priority] / [scheduling] values."""
    bounds: dict[str, tuple[float, float]] = {}
    """Search range per parameter, [low, high]; parameters not listed use the built-in range
    (weights 0..0.5, interactive_cap 0.02..0.5, head_slack_s 0..7200, max_preemptions 0..5)."""
    train_fraction: float = Field(0.7, gt=0.05, lt=1)
    """Share of the trace's span (from its start) the trials replay; the rest is held back."""

    @field_validator("search")
    @classmethod
    def _search(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in TUNE_BOUNDS:
                raise ValueError(f"{name!r}: not a tunable parameter ({', '.join(TUNE_BOUNDS)})")
        if not value:
            raise ValueError("nothing to search: name at least one parameter")
        return value

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for name, (low, high) in value.items():
            if name not in TUNE_BOUNDS:
                raise ValueError(f"{name!r}: not a tunable parameter ({', '.join(TUNE_BOUNDS)})")
            if not low < high:
                raise ValueError(f"{name} = [{low:g}, {high:g}]: bounds inverted or empty (need low < high)")
            if low < TUNE_BOUNDS[name][0]:
                raise ValueError(f"{name} = [{low:g}, {high:g}]: low must be >= {TUNE_BOUNDS[name][0]:g}")
        return value


class RemapConfig(Section):
    """Heterogeneity-aware remapping (ARRIVE-F; preemption/remap, docs/remap.md): the paper's
    β and τ, the gain threshold and the guards against ping-pong."""

    beta: float = Field(20.0, gt=0, le=10_000)
    """Profiling windows a predicted gain is counted over (the paper's β)."""
    tau_s: float = Field(50.0, gt=0, le=86_400)
    """Seconds of one profiling window (the paper's τ); a job is profiled a whole window on its
    sub-cluster before it can be moved for gain."""
    threshold_s: float = Field(60.0, allow_inf_nan=False)
    """A move or swap is made only when its predicted gain (VM-seconds, migration cost
    deducted) exceeds this."""
    max_migrations: int = Field(2, ge=0, le=1000)
    """Migrations per job at most (thrashing moves included): no ping-pong."""
    thrash_pages_s: float = Field(1000.0, ge=0)
    """Pages swapped in per second above which a guest thrashes and is moved at once."""
    migrate_bandwidth_mb_s: float = Field(110.0, gt=0)
    """Bandwidth of a live migration (MB/s), for its cost: memory × 1.2 / bandwidth."""
    farm_file: str = ""
    """Sub-cluster file (the `[[subcluster]]` entries of `vjob simulate --subclusters`): set, the
    agent remaps running vjobs live every tau_s (swaps only, docs/remap.md); empty: off."""
    partner_hold_s: float = Field(25.0, ge=0, le=600)
    """A pilot whose job ends while a swap has its VM away waits at most this long (read by the
    pilot) for the agent to send the partner's VM, still on its own node, home before it lets the
    RMS free the node; then it ends anyway (logged). 0: no wait. Keep it below Slurm's KillWait."""


class DeadlineConfig(Section):
    """Deadline-aware admission (docs/deadline.md): a job is accepted, or kept running, while its
    x-factor (how late it is projected to end, as a share of what it has left) is below X."""

    admission: str = Field("none", pattern=r"^(none|static|adaptive|cdf)$")
    """How X is set: none (no deadline policy), static, adaptive (towards target_failure) or cdf
    (from past jobs' headroom so that cdf_probability of them would succeed)."""
    action: str = Field("cancel", pattern=r"^(cancel|checkpoint)$")
    """A running vjob over X: cancel it, or checkpoint it and resume it where it can still finish."""
    buffer: float = Field(0.05, ge=0, le=10)
    """Deadline slack given to replayed trace jobs: deadline = submit + (1 + buffer) × requested time."""
    static_x: float = Field(0.1, ge=-1, le=10)
    """X for `static`, and the starting X of `adaptive` and `cdf`."""
    x_min: float = Field(0.1, ge=-1, le=10)
    """Lowest X the adaptive and cdf thresholds may reach."""
    x_max: float = Field(0.9, ge=-1, le=10)
    """Highest X the adaptive and cdf thresholds may reach."""
    delta_x: float = Field(0.05, ge=0, le=1)
    """Adaptive step: X moves by delta_x × |target − measured failure rate| per finished job."""
    target_failure: float = Field(0.15, ge=0, le=1)
    """Failure rate the adaptive threshold steers to."""
    cdf_probability: float = Field(0.8, gt=0, le=1)
    """cdf: share of past jobs that would have met their deadline at x = X."""
    window: int = Field(100, ge=1, le=100_000)
    """Finished jobs in the measured failure rate (and, ×20, headroom samples for cdf)."""
    threshold_file: str = ""
    """Where the agent publishes X for the submit hooks; empty: vjob-deadline.threshold beside
    slurm.conf (Slurm) — the hook reads it and refuses jobs with x >= X."""
    stale_after_s: float = Field(600.0, gt=0, le=86400)
    """A threshold file older than this is ignored by the hooks (they accept every job)."""
    checkpoint_s: float = Field(120.0, ge=0, le=86400)
    """Wall seconds a checkpoint and its restore cost a vjob: counted in its x when the agent
    weighs checkpointing it for its deadline and releasing it afterwards (the simulator's 120 s)."""
    vo_min_samples: int = Field(20, ge=1, le=100_000)
    """Finished jobs of a kind needed before the learned VO model replaces the configured one."""
    vo_max_slowdown: float = Field(3.0, ge=1, le=100)
    """Largest slowdown one finished job may show in the VO fit (actual / time limit is clipped
    to [1, this]): bounds what one hostile or absurd job can move the model."""
    vo_observations: int = Field(1000, ge=1, le=5000)
    """Newest finished-job observations the VO model is refitted from (the store keeps 5,000)."""

    @model_validator(mode="after")
    def _bounds(self) -> DeadlineConfig:
        if self.x_min > self.x_max:
            raise ValueError(f"x_min = {self.x_min} > x_max = {self.x_max}: need x_min <= x_max")
        return self


class Config(Section):
    """The whole configuration file."""

    data_dir: str = ""
    """Where vjob keeps its SQLite store, images and snapshots; empty means /var/lib/vjob as
    root, ~/.local/share/vjob otherwise (or $VJOB_DATA_DIR)."""
    database: DatabaseConfig = DatabaseConfig()
    logging: LoggingConfig = LoggingConfig()
    priority: PriorityConfig = PriorityConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    agent: AgentConfig = AgentConfig()
    provisioning: ProvisioningConfig = ProvisioningConfig()
    planner: PlannerConfig = PlannerConfig()
    slurm: SlurmConfig = SlurmConfig()
    pbs: PbsConfig = PbsConfig()
    saline: SalineConfig = SalineConfig()
    deadline: DeadlineConfig = DeadlineConfig()
    tune: TuneConfig = TuneConfig()
    remap: RemapConfig = RemapConfig()

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir else default_data_dir()

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.data_path / 'vjob.sqlite'}"


def parse(data: dict[str, Any], *, source: str = "<config>") -> Config:
    """Validate a configuration mapping; the error names the key, the value and the rule."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _masked(value: Any) -> Any:
    """`value` as an error may echo it: a URL whole through mask_url (its password may hold
    spaces or quotes that would end a URL found in free text), other text through mask_text."""
    if not isinstance(value, str):
        return value
    return mask_text(mask_url(value))


def _describe(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
            continue
        value = err.get("input")
        # The value is echoed so the operator sees what was read, but a URL's secrets never
        # are (vjob.secrets): a refused database.url is shown masked, its password never.
        shown = "(missing)" if err["type"] == "missing" else repr(_masked(value))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg = "must be " + msg.removeprefix("Input should be ")
        lines.append(f"{source}: {key} = {shown}: {msg}")
    return "; ".join(lines)


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Load the configuration from `path`, `$VJOB_CONFIG`, /etc/vjob/vjob.toml, or defaults."""
    chosen: Path | None
    if path is not None:
        chosen = Path(path)
    elif os.environ.get(ENV_VAR):
        chosen = Path(os.environ[ENV_VAR])
    elif DEFAULT_PATH.exists():
        chosen = DEFAULT_PATH
    else:
        return Config()
    try:
        with chosen.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{chosen}: cannot read the configuration file: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{chosen}: the configuration file is larger than {MAX_CONFIG_BYTES} bytes")
    return parse(parse_toml(raw, str(chosen)), source=str(chosen))


MAX_CONFIG_BYTES = 1 << 20
"""A configuration file is a few kilobytes; anything this large is a mistake, not a setting."""
_LONG_NUMBER = re.compile(r"[0-9_]{4000,}")


def parse_toml(raw: bytes, source: str) -> dict[str, Any]:
    """TOML bytes to a mapping; every way tomllib can fail is a ConfigError naming `source`.

    Why more than TOMLDecodeError: tomllib also raises ValueError for an integer longer than
    Python's int conversion limit (4300 digits) and RecursionError for arrays or inline tables
    nested a thousand deep, and bytes that are not UTF-8 are a UnicodeDecodeError. Each gets the
    file and, where it can be found, the line.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{source}:{line}: not valid TOML: byte {raw[exc.start]:#04x} is not UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except ValueError:  # int() over its digit limit, inside tomllib
        limit = sys.get_int_max_str_digits()
        found = _LONG_NUMBER.search(text)
        if found is None:
            raise ConfigError(f"{source}: not valid TOML: a number longer than {limit} digits") from None
        line = text.count("\n", 0, found.start()) + 1
        key = _key_of_line(text, found.start())
        raise ConfigError(
            f"{source}:{line}: not valid TOML: {key}a number of {len(found.group())} digits (at most {limit})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: arrays or inline tables nested too deeply") from None


def _key_of_line(text: str, pos: int) -> str:
    """The "key 'name': " prefix for the line holding `pos` ("" when the line has no key)."""
    start = text.rfind("\n", 0, pos) + 1
    key, sep, _ = text[start:pos].partition("=")
    return f"key {key.strip()[:60]!r}: " if sep and key.strip() else ""


def masked(config: Config) -> dict[str, Any]:
    """The effective configuration as a dict with secrets masked (vjob.secrets: a key named like
    a secret has its value replaced, every URL loses its password and secret query values)."""
    data = config.model_dump(mode="json")
    data["database"]["effective_url"] = config.database_url
    return _mask(data)


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str) and value:
        if is_secret_name(key):
            return MASK
        return mask_text(value)
    return value


def reference() -> str:
    """The Markdown reference of every key (docs/configuration.md is this text; a test checks it)."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration models by `vjob config reference`; a test keeps this page",
        "equal to the code. The file is TOML: `/etc/vjob/vjob.toml`, or `--config FILE`, or",
        "`$VJOB_CONFIG`. Every key is optional; unknown keys are errors.",
        "",
        "`vjob config show` and every message naming a URL mask its secrets: the password of",
        "`user:password@host` (up to the last `@` before the host, so a raw `@` in it is masked",
        "too) and query parameters named like `password`, `passwd`, `pass`, `secret`, `token`,",
        '`key` (any case). See docs/security.md, "Secrets and the store".',
        "",
    ]
    _reference_section(Config, "", lines)
    return "\n".join(lines).rstrip() + "\n"


def _reference_section(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    nested: list[tuple[str, type[BaseModel], bool]] = []
    rows: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        sub = _model_of(ann)
        if sub is not None:
            nested.append((name, sub, ann is not sub))
            continue
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = "(required)" if field.is_required() else "(unset)" if default is None else f"`{_short(default)}`"
        limits = ", ".join(
            f"{op} {getattr(m, attr)}"
            for m in field.metadata
            for attr, op in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
            if getattr(m, attr, None) is not None
        )
        desc = " ".join((field.description or _attribute_docs(model).get(name, "")).split())
        rows.append(f"| `{name}` | {_type_name(ann)} | {shown} | {limits} | {desc} |")
    if rows:
        lines += [f"## `[{prefix}]`" if prefix else "## top level", ""]
        doc = " ".join((model.__doc__ or "").split()) if model is not Config else ""
        if doc and not doc.startswith("Base of") and not doc.startswith("!!!"):
            lines += [doc, ""]
        lines += ["| key | type | default | limits | meaning |", "|---|---|---|---|---|", *rows, ""]
    for name, sub, is_list in nested:
        key = f"{prefix}.{name}" if prefix else name
        _reference_section(sub, f"[{key}]" if is_list else key, lines)


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The string under each field of `model` and its bases, read from their source."""
    docs: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel) and c is not BaseModel]):
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = after.value.value
    return docs


def _model_of(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type_name(ann: Any) -> str:
    if getattr(ann, "__origin__", None) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in ann.__args__)
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return (text or str(ann).replace("typing.", "")).replace("|", "or")


def _short(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value else '""'
    return repr(value)
