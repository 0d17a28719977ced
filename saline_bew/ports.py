"""What the manager's steps need from it, in one small record: never the whole `Manager`.

Why: the steps of a vjob's life (saline_bew.submission, deployment, snapshots, evacuation,
staging, output, lifecycle) used to be fifty methods of one class that reached into each
other's state. Each now is a module of functions taking `Ports`: the store with the vjob's
lease, the sites, the VMs, the clock, the metrics and the lock that serialises acting on
vjobs. What a step keeps for itself stays in its own module; the manager (saline_bew.manager)
only runs the passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saline_bew import identity, journal, lease
from saline_bew.config import SalineConfig
from saline_bew.events import EventKind
from saline_bew.journal import LeaseLost, SalineJob
from saline_bew.metrics import SalineMetrics
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs
from vjob.config import Config
from vjob.errors import VjobError
from vjob.store.db import Store


@dataclass(eq=False)
class Ports:
    """The manager's store, sites, VMs, clock and metrics, and its hold on the vjobs' leases."""

    config: Config
    store: Store
    sites: dict[str, Site]
    vms: SalineVMs
    clock: Callable[[], float]
    owner: str
    """This manager's lease owner name (saline_bew.lease)."""
    lease_s: float
    """How long a lease outlives its last renewal: a dead manager's vjobs wait this long."""
    metrics: SalineMetrics = field(default_factory=SalineMetrics)
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Serialises acting on vjobs between the loop and the socket server's requests."""
    socket: Path | None = None
    """The socket this manager's server listens on (set by saline_bew.server.Server): the
    holder is told it, to talk back as the user."""

    @property
    def cfg(self) -> SalineConfig:
        """The [saline] section: what every step reads of the configuration."""
        return self.config.saline

    def site(self, name: str) -> Site:
        """A configured site; a vjob journalled at a site no longer configured fails clearly."""
        try:
            return self.sites[name]
        except KeyError:
            raise VjobError(
                f"site {name!r} is not configured any more (saline.sites: {', '.join(self.sites)})"
            ) from None

    def lease(self, key: str) -> bool:
        """Take or renew the vjob's lease; False when another manager holds it."""
        return lease.acquire(self.store, key, self.owner, now=self.clock(), ttl_s=self.lease_s)

    def take(self, key: str) -> None:
        """Take the vjob's lease for a user's request, or say who holds it (LeaseLost)."""
        if not self.lease(key):
            holder = lease.holder(self.store, key)[0]
            raise LeaseLost(f"best-effort vjob {key}: handled by the manager {holder}; try again later")

    def record(
        self, key: str, kind: EventKind, detail: dict[str, object] | None = None, **changes: object
    ) -> SalineJob:
        """journal.record, only while this manager holds the vjob's lease (else LeaseLost)."""
        return journal.record(self.store, key, kind, detail, owner=self.owner, **changes)

    def identities(self, job: SalineJob) -> dict[str, identity.NetworkIdentity]:
        """The VMs' network identities: allocated at the first deployment, the same afterwards."""
        got = identity.assign(
            self.store,
            site=job.site,
            job_key=job.key,
            vm_names=job.vm_names,
            mac_prefix=self.cfg.mac_prefix,
            network=self.cfg.network,
        )
        return {i.vm_name: i for i in got}

    def subnet(self, job: SalineJob) -> int:
        """The vjob's own network (its first VM's subnet), brought up on every node it runs on."""
        return self.identities(job)[job.vm_names[0]].subnet_id

    def real(self, job: SalineJob, node: str) -> bool:
        """The vjob's image boots its own kernel (a job disk per VM, part of each snapshot)."""
        return self.vms.real(job.image, node) is not None

    def free_nodes(self, job: SalineJob) -> None:
        """Delete the vjob's VMs from its nodes and take its network off them."""
        for vm, node in zip(job.vm_names, job.hosts, strict=False):
            self.vms.stop(vm, node)
        if job.hosts:
            self.vms.network_down(self.subnet(job), list(job.hosts))

    @property
    def output_dir(self) -> Path:
        """Root's copies of the vjobs' output (saline_bew.output)."""
        return self.vms.driver.data_dir / "saline-output"
