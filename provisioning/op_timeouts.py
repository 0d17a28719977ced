"""The timeout of one save, restore, migration or state copy, from the size of what it moves.

Why: these calls write or read the guest's memory, so their time grows with the VM
(vjob.save_time); a flat `[provisioning] operation_timeout_s` (300 s) aborted the save of a
64 GiB guest at 5 s/GiB (320 s) half written. Each call now gets the floor plus 10 s per GiB of
the VM's memory (`ProvisioningConfig.operation_timeout_for`), read where it is cheapest: from
the running domain (libvirt's maxMemory) for a save or a migration, from the file's size for a
restore or a copy. A figure that cannot be read falls back to the floor, as before.
"""

from __future__ import annotations

import libvirt

from provisioning import transfer
from provisioning.transfer import Endpoint
from vjob.config import ProvisioningConfig
from vjob.errors import VjobError


def for_domain(config: ProvisioningConfig, dom: libvirt.virDomain) -> float:
    """The timeout of a save or migration of the running `dom`: its memory (maxMemory, KiB)."""
    try:
        kib = dom.maxMemory()
    except libvirt.libvirtError:
        kib = 0
    return config.operation_timeout_for(max(0, kib) / 1024)


def for_file(config: ProvisioningConfig, target: Endpoint) -> float:
    """The timeout of a restore from, or a copy of, the file `target` (a state, an overlay)."""
    try:
        size = transfer.size(target) or 0
    except (OSError, VjobError):
        size = 0
    return config.operation_timeout_for(size / 2**20)


__all__ = ["for_domain", "for_file"]
