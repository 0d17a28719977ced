"""Provisioning: the OS image catalogue and its distribution tree, the libvirt VM life-cycle
driver, copy-on-write overlays and snapshots.

Modules:
- `driver`: `Driver` (define/boot/stop/save/restore local or remote/migrate/snapshot/delete
  over libvirt, snapshots checked before every restore), `VMSpec`, `DriverError`,
  `SnapshotError`.
- `performer`: `DriverPerformer`, the driver as the context-switch executor's actions.
- `images`: `Catalogue` (the OS images in the store, which node holds which) and the
  distribution down the tree; `distribution`: the pure tree and round planning.
- `transfer`: node-to-node copies (local, rsync, scp) and sha256.
- `libvirtd`: starting virtlogd + libvirtd under tini, and a second libvirtd as a second node.
- `guest`: the tiny counter guest used by the real-VM tests and the benchmarks.
See docs/provisioning.md.
"""
