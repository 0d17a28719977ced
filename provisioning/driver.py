"""The VM driver: a job's VMs through libvirt, from definition to suspend, resume and move.

Why these operations and no others: they are the actions of the vjob life cycle (Entropy
section 2: run, stop, suspend, resume locally or on another node, migrate) plus the periodic
snapshot Saline needs. Each is idempotent: after a crash of the agent, calling it again
finds what was already done (a domain already running, a state file already written) and
only finishes the rest, so a context switch cut in half can be completed.

Disks: every VM writes to its own qcow2 overlay over an OS image; the image is its backing
file and is never written, so one image serves every VM of every job on a node, and a
checkpoint is the overlay plus the memory state (UBIS III.D, Saline 3.1).

Snapshots hold users' memory: they are written owner-only (0600 in a 0700 directory), get a
manifest beside them and, when a store is given, a row in `snapshots` with size, sha256 and
location. A restore checks the file against both first; a missing or altered file is a
clear error and the VM is not started from a broken state.

Every libvirt call runs with a timeout (`operation_timeout_s`) and every error names the VM,
the node, its URI and libvirt's own message.

`Driver` is the one object callers hold; what it is made of, from the ground up:
- `vm_places`: where each node's VM files are, and who owns them;
- `libvirt_link`: the connections and every libvirt call under its timeout;
- `vm_lifecycle`: define, boot, pause, stop, delete, state (`vm_records`: their store rows;
  `disk_placement`: overlays and job disks; `kvm_choice`: kvm or qemu);
- the verbs below, each carried out in its own module: `checkpoint` (save, restore,
  verify), `saved_move` (a saved VM to another node), `labelled_snapshots`, `migration`.
The types are in `vm_types`, the manifests and their check in `integrity`, the domain XML in
`domain_xml`.
"""

from __future__ import annotations

from typing import Any

import libvirt

from provisioning import checkpoint, disk_placement, labelled_snapshots, migration
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import (
    MANIFEST_SUFFIX,
    NAME_RE,
    OVERLAY_COPY_SUFFIX,
    STATE_SUFFIX,
    DriverError,
    Snapshot,
    SnapshotError,
    VMInfo,
    VMSpec,
    check_name,
)
from vjob import log

_log = log.get("provisioning")

# The driver's vocabulary (vm_types) is imported from here by its callers: one import for the
# driver and the types its verbs take and return.
__all__ = [
    "MANIFEST_SUFFIX",
    "NAME_RE",
    "OVERLAY_COPY_SUFFIX",
    "STATE_SUFFIX",
    "Driver",
    "DriverError",
    "Snapshot",
    "SnapshotError",
    "VMInfo",
    "VMSpec",
    "check_name",
]


class Driver(VMLifecycle):
    """The VM driver for a set of nodes, each reached through its own libvirt URI: the life
    cycle (`VMLifecycle`), and the verbs that write, check and move memory states."""

    # -- job disk --------------------------------------------------------------------------
    def place_job_disk(self, vm: str, node: str) -> dict[str, Any]:
        """The job disk built here for `node`'s VM, put where that node's own pilot defines the
        VM; its size and sha256 as built (disk_placement.place_job_disk)."""
        return disk_placement.place_job_disk(self, vm, node)

    # -- suspend / resume ------------------------------------------------------------------
    def save(
        self, vm: str, node: str, *, job_id: int | None = None, bypass_cache: bool = False, with_disks: bool = True
    ) -> Snapshot:
        """Suspend the VM to disk: memory state to the snapshot dir, overlay kept in place.

        A paused VM (coordinated checkpoint) is saved as running, so that its restore needs no
        extra resume. `bypass_cache` writes the state with O_DIRECT
        (VIR_DOMAIN_SAVE_BYPASS_CACHE): it does not evict the node's page cache, and a save is
        then timed like a copy that also bypasses it. Repeating it on a VM already saved
        returns the existing snapshot. `with_disks`: the overlay and job disk are hashed into
        the manifest too (integrity.disk_digests), so a copy of them is checked on arrival;
        `snapshot`, which copies the overlay itself, skips it.
        """
        return checkpoint.save(self, vm, node, job_id=job_id, bypass_cache=bypass_cache, with_disks=with_disks)

    def restore(
        self, vm: str, node: str, *, from_node: str | None = None, paused: bool = False, bypass_cache: bool = False
    ) -> None:
        """Resume a saved VM on `node`, from its state on `from_node` (default: the same node).

        From another node: the memory state and the overlay are copied over, the copy is
        checked on the destination against what was recorded at save time, and restored there;
        the source's copies and definition are removed only afterwards (saved_move). A copy
        that does not match is removed from the destination and refused; the source is kept.
        `paused`: the VM comes back paused (a coordinated restore lets all VMs of a job run
        together with `unpause`). `bypass_cache` reads the state with O_DIRECT.
        """
        checkpoint.restore(self, vm, node, from_node=from_node, paused=paused, bypass_cache=bypass_cache)

    def verify(self, vm: str, node: str) -> Snapshot:
        """Check the saved memory state of `vm` on `node` before it is restored."""
        return checkpoint.verify(self, vm, node)

    # -- migrate ---------------------------------------------------------------------------
    def migrate(self, vm: str, src: str, dst: str, *, live: bool | None = None) -> bool:
        """Migrate a running VM; where the nodes share no VM directory its overlay and job
        disk go too (copied and checked on arrival while paused, or mirrored by QEMU when
        live). Returns whether the copy was live: live on KVM, paused for the whole copy
        under QEMU's emulator, TCG, unless `live` says otherwise (migration: why)."""
        return migration.migrate(self, vm, src, dst, live=live)

    # -- memory ----------------------------------------------------------------------------
    def memory(self, vm: str, node: str) -> tuple[int, int]:
        """(current, maximum) MiB of a running VM: its balloon target and the domain's `<memory>`,
        which the balloon cannot exceed."""
        dom = self.require_domain("memory", vm, node)
        info = self.call("memory", vm, node, dom.info)
        return int(info[2]) // 1024, int(info[1]) // 1024

    def set_memory(self, vm: str, node: str, mib: int) -> None:
        """Set a running VM's balloon target (live only: a node kind's memory belongs to the node
        it runs on, not to its definition). Above the domain's maximum is an error naming both."""
        dom = self.require_domain("set memory", vm, node)
        if not self.active(dom):
            raise DriverError("set memory", vm, node, "the VM is not running")
        most = int(self.call("set memory", vm, node, dom.maxMemory)) // 1024
        if not 16 <= mib <= most:
            raise DriverError("set memory", vm, node, f"{mib} MiB: must be 16..{most} (the domain's maximum)")
        self.call("set memory", vm, node, lambda: dom.setMemoryFlags(mib * 1024, libvirt.VIR_DOMAIN_AFFECT_LIVE))
        _log.info("vm memory set", vm=vm, node=node, mib=mib, max_mib=most)

    # -- snapshot --------------------------------------------------------------------------
    def snapshot(
        self, vm: str, node: str, *, label: str, job_id: int | None = None, keep_running: bool = True
    ) -> Snapshot:
        """A consistent memory + overlay snapshot of a running VM, named `label`.

        With `keep_running` the VM runs on after a pause of one save and one restore; without
        it the VM stays stopped at the snapshot (an RMS's checkpoint signal before a kill: work
        done after the snapshot would be lost anyway). Why not libvirt's own snapshots:
        labelled_snapshots.
        """
        return labelled_snapshots.snapshot(self, vm, node, label=label, job_id=job_id, keep_running=keep_running)

    def restore_snapshot(
        self, vm: str, node: str, *, label: str, from_node: str | None = None, paused: bool = False
    ) -> None:
        """Start the VM on `node` from snapshot `label` (taken on `from_node`), e.g. after the
        RMS killed its job; whatever the VM did since the snapshot is lost, as intended.
        `paused`: it comes back paused (a coordinated restore lets a job's VMs run together)."""
        labelled_snapshots.restore_snapshot(self, vm, node, label=label, from_node=from_node, paused=paused)
