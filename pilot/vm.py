"""One vjob's VM on one node, as the pilot sees it: provisioning's VM driver behind the few
verbs the pilot's life cycle needs (pilot.pilot). A multi-node job's `JobVMs` (pilot.multinode)
offers the same verbs for all its VMs at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pilot.site_network import SiteLink
from provisioning import job_disk
from vjob.errors import VjobError
from vjob.model import VMState


class DriverVM:
    """One vjob's VM on one node, through provisioning's VM driver."""

    def __init__(
        self, driver: Any, name: str, node: str, spec_factory: Callable[[], Any], site: SiteLink | None = None
    ) -> None:
        """`site`: the VM's site network (pilot.site_network), asked for before each boot and
        restore, given back after each save and at the end."""
        self.driver = driver
        self.name = name
        self.node = node
        self.uri = driver.uri(node)
        self._spec_factory = spec_factory
        self.site = site

    def console_log(self) -> Path:
        return Path(self.driver.console_log(self.name, self.node))

    def active(self) -> bool:
        return bool(self.driver.state(self.name, self.node) is VMState.RUNNING)

    def leftover(self) -> bool:
        """Whether anything of a VM of this name is on the node: a domain, in any state, or its
        saved memory (what a first start must not find)."""
        return self.driver.state(self.name, self.node) is not None

    def boot(self) -> None:
        if self.site is not None:
            self.site.up()
        self.driver.define(self._spec_factory(), self.node)
        self.driver.boot(self.name, self.node)

    def save(self) -> tuple[Path, int]:
        snap = self.driver.save(self.name, self.node)
        if self.driver.config.user_vm_dir and os.geteuid() != 0:
            self._undefine()
        if self.site is not None:
            self.site.down()
        return Path(snap.memory_path), int(snap.size_bytes)

    def _undefine(self) -> None:
        """Forget the saved VM's definition in the user's session libvirt of this node (its
        state file holds the domain, a restore here defines it again). Why: with node-local VMs
        (`user_vm_dir`) a resume on another node cannot reach this node's session libvirt, so
        the definition would stay here for good (found on two hosts, issue 38)."""
        import libvirt  # heavy: libvirt-python, only in a pilot that runs a VM

        try:
            self.driver.connection(self.node).lookupByName(self.name).undefine()
        except (libvirt.libvirtError, VjobError):  # gone already: nothing to forget
            return

    def restore(self, saved_on: str, member_nodes: Sequence[str] = ()) -> None:
        """`member_nodes`: a multi-node job's (pilot.multinode); one VM has none."""
        if self.site is not None:
            self.site.up()
        self.driver.restore(self.name, self.node, from_node=saved_on or self.node)

    def nodes(self) -> list[str]:
        """The node of each VM of the job: one here (pilot.multinode has several)."""
        return [self.node]

    def delete(self) -> None:
        self.driver.delete(self.name, self.node)
        if self.site is not None:
            self.site.down()

    def output_logs(self) -> tuple[Path, Path]:
        return self.driver.output_logs(self.name, self.node)

    def collect(self, workdir: Path) -> int | None:
        """A real job's exit status, after copying its files back (None: it never ended)."""
        return job_disk.collect(self.driver.job_disk_path(self.name, self.node), workdir).exit_code

    def cpu(self) -> tuple[float, int] | None:
        """CPU seconds used so far and vCPUs, from libvirt's domain info; None when unreadable."""
        import libvirt  # heavy: libvirt-python, only in a pilot that runs a VM

        try:
            info = self.driver.connection(self.node).lookupByName(self.name).info()
        except (libvirt.libvirtError, VjobError):  # a domain gone, a node unreachable: a reading is never needed
            return None
        return info[4] / 1e9, int(info[3])

    def forget(self, node: str) -> None:
        """Delete whatever an older job of the same name left on `node` (VM, disk, state)."""
        self.driver.delete(self.name, node)
