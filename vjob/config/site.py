"""The kernel's sections about how this site runs vjob: the store, the log, the agent daemon and
the VM provisioning (its images, overlays and snapshots).
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from vjob.config.section import Section
from vjob.save_time import BUDGET_S_PER_GIB, budget_s
from vjob.secrets import raw_at_in_userinfo, secret_values


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

    password_file: str = ""
    """A file holding the database password (its first line), so that vjob.toml holds none: an
    absolute path (owned by root or vjob's user, no access for others, e.g. 0600), or a bare
    name read in systemd's $CREDENTIALS_DIRECTORY (the unit's LoadCredential=NAME:PATH). url
    then names the user and no password. Read when the store is opened."""

    @field_validator("password_file")
    @classmethod
    def _password_file(cls, value: str, info: ValidationInfo) -> str:
        if not value:
            return value
        if not value.startswith("/") and ("/" in value or value in (".", "..")):
            raise ValueError("must be an absolute path, or a bare credential name (systemd LoadCredential=)")
        url = str(info.data.get("url", ""))
        if not url or url.startswith("sqlite"):
            raise ValueError(
                "needs a database url with a user name (a server database, e.g. postgresql://vjob@db/vjob)"
            )
        if secret_values(url):
            raise ValueError("url holds a password already: keep it in one place only (remove it from url)")
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

    metrics_web_config: str = ""
    """Prometheus' web configuration file for the exporter (exporter-toolkit's format, as given
    to node_exporter's --web.config.file): tls_server_config (cert_file, key_file,
    client_auth_type, client_ca_file) and basic_auth_users (bcrypt hashes); read and checked
    when the agent starts; needs the `exporter` extra. Empty: plain HTTP, no authentication."""

    @field_validator("metrics_web_config")
    @classmethod
    def _web_config(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError(f"{value[:80]!r}: must be an absolute path, e.g. /etc/vjob/web.yml")
        return value

    command_timeout_s: float = Field(30.0, gt=0, le=600)
    """Timeout of one RMS command (squeue, qstat, oarstat...)."""
    checkpoint_timeout_s: float = Field(120.0, gt=0, le=3600)
    """How long a switch waits for a victim's pilot to save its VM before withdrawing: the
    floor, to which checkpoint_timeout_per_gib_s adds per GiB of the VM's memory."""
    checkpoint_timeout_per_gib_s: float = Field(BUDGET_S_PER_GIB, ge=0, le=600)
    """Seconds added to checkpoint_timeout_s per GiB of the victim VM's memory (a save writes
    about 5 s/GiB on a local disk: 2x that by default, vjob.save_time), so a big VM is not
    withdrawn mid-save: a 64 GiB guest gets 120 + 640 s."""
    checkpoint_timeout_max_s: float = Field(7200.0, gt=0, le=86400)
    """The longest a switch waits for one save, whatever the VM's memory; at least
    checkpoint_timeout_s. While a switch waits, the agent's lease keeper feeds systemd's
    watchdog, so the unit's WatchdogSec need not exceed it."""
    pause_first: Literal[True, False, "auto"] = "auto"
    """Checkpoint a victim by pausing its VM first: its CPUs go to the interactive job at once
    (Slurm: `scontrol suspend`, which keeps its memory allocated) while its memory drains to
    disk, then it is requeue-held. "auto": on where that is safe, Slurm whose ProctrackType
    (read from `scontrol show config`) is linuxproc or pgid and whose SelectTypeParameters
    count memory; off under proctrack/cgroup (its freezer stops the process that saves the
    VM), the reason logged once. true: on wherever the RMS can hand CPUs over this way
    (Slurm); false: always save-first. PBS, OAR and multi-node vjobs (saved as one cut) are
    always save-first. docs/preempt-pause.md."""

    @field_validator("pause_first", mode="before")
    @classmethod
    def _pause_first(cls, value: object) -> object:
        # Exactly true, false or "auto": pydantic's lax bool would take "yes", "off" or 1.
        if value is True or value is False or value == "auto":
            return value
        raise ValueError('must be true, false or "auto" (a TOML boolean, or the string)')

    cleanup_after_s: float = Field(3600.0, ge=0)
    """A vjob the RMS no longer knows (cancelled, timed out) keeps its saved VM this long, then
    the agent deletes it (its memory state and disk overlay hold user data)."""
    pilot_dir: str = ""
    """Where pilots and the agent exchange state and checkpoint requests (one directory per
    job); empty means <data_dir>/pilots. Must be shared by the agent and the compute nodes."""
    multinode_pilots: Literal["leader", "per-node"] = "leader"
    """A multi-node vjob's VMs: "leader", the first node's pilot drives every VM (through each
    node's libvirt); "per-node", it starts a member pilot on every other node (srun, oarsh, pbsdsh) that
    builds, boots, saves and restores its own node's VM at the leader's word (docs/multinode.md). A
    pilot that is not root always runs per-node: the first node cannot reach another node's
    qemu:///session."""
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
            raise ValueError(
                f"{value[:80]!r}: must be an IP address of this node (IPv4 or IPv6), e.g. "
                "10.1.0.5, or empty to take the route toward the member nodes"
            ) from None

    lease_s: float = Field(30.0, ge=5, le=3600)
    """The agent's lease on its cluster in the store: one agent per RMS acts at a time; a
    standby (e.g. on the second controller of an HA pair) takes over this long after the active
    agent dies. Renewed every third of it, also by a thread while a switch waits for saves (an
    agent that loses it stops acting); keep it well above the hosts' clock skew."""

    @model_validator(mode="after")
    def _timeouts(self) -> AgentConfig:
        if self.checkpoint_timeout_max_s < self.checkpoint_timeout_s:
            raise ValueError(
                f"checkpoint_timeout_max_s = {self.checkpoint_timeout_max_s:g} is below "
                f"checkpoint_timeout_s = {self.checkpoint_timeout_s:g}: the cap must be at least the floor"
            )
        return self

    def checkpoint_timeout_for(self, memory_mb: float) -> float:
        """How long to wait for the save of a VM of `memory_mb` MiB: the floor plus
        checkpoint_timeout_per_gib_s per GiB, at most checkpoint_timeout_max_s."""
        return budget_s(
            memory_mb,
            self.checkpoint_timeout_s,
            per_gib_s=self.checkpoint_timeout_per_gib_s,
            cap_s=self.checkpoint_timeout_max_s,
        )


class ProvisioningConfig(Section):
    image_dir: str = ""
    """Where the OS image catalogue keeps base images; empty means <data_dir>/images. `{node}`
    is replaced by the node name (one directory per node when nodes share a filesystem)."""
    head_node: str = "head"
    """The node holding the catalogue: the root of the image distribution tree."""
    snapshot_dir: str = ""
    """VM memory states and snapshot copies of overlays; empty means <data_dir>/snapshots (mode
    0700). `{node}` is replaced by the node name."""
    nodes: dict[str, str] = Field(default_factory=dict)
    """libvirt URI per node name, e.g. {n1 = "qemu:///system"}."""
    default_uri: str = "qemu:///system"
    """libvirt URI of a node not listed in `nodes`."""
    copy_method: Literal["local", "rsync", "scp"] = "local"
    """How images and snapshots travel between nodes."""
    operation_timeout_s: float = Field(300.0, gt=0)
    """Timeout of one VM operation (save, restore, migrate, a state's copy): the floor, to
    which a save, restore, migration or copy adds 10 s per GiB of the VM's memory
    (vjob.save_time: twice the measured 5 s/GiB), so a 64 GiB guest's save gets 940 s."""

    def operation_timeout_for(self, memory_mib: float) -> float:
        """The timeout of a save, restore, migration or state copy of a VM of `memory_mib` MiB."""
        return budget_s(memory_mib, self.operation_timeout_s)

    vm_dir: str = ""
    """Per-VM disk overlays and console logs; empty means <data_dir>/vms. `{node}` is replaced
    by the node name (one directory per node when nodes share a filesystem)."""
    hosts: dict[str, str] = Field(default_factory=dict)
    """ssh host per node for rsync/scp copies; a node not listed is reached by its name, and
    `""` means this machine (no ssh). `$VJOB_SSH_CONFIG` names an ssh config file (ssh -F)."""
    user_vm_dir: str = ""
    """Where the pilot of an ordinary user's job keeps its VMs (disks, memory states and its
    session libvirt's files), `{user}` replaced by the user's name: a node-local directory (the
    site makes its parent mode 1777), so that a resume on another node copies them there with
    `copy_method` over ssh as the user (`hosts`) and checks them on arrival. Empty: the user's
    $XDG_DATA_HOME/vjob or ~/.local/share/vjob, normally on the shared home (nothing copied)."""
    migrate_uris: dict[str, str] = Field(default_factory=dict)
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
    vm_overhead_mib: int = Field(256, ge=0, le=65536)
    """What a real job's VM costs beyond its guest RAM, taken off the job's memory on each node
    before the guest gets the rest (pilot.sizing): QEMU's resident memory beyond guest RAM (its
    code and heap, the TCG translation cache, device buffers). Measured by bench/vm_overhead.py
    (debian12 under TCG, 2 vCPUs, the job holding most of guest RAM): 246.8 MiB at 512 MiB,
    247.4 MiB at 1024 MiB, flat with the guest's size; rounded up to 256. KVM has no translation
    cache: a KVM site may lower it (docs/realjobs.md, "Size")."""
