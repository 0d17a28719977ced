"""Provisioning: the OS image catalogue and its distribution tree, the libvirt VM life-cycle
driver, copy-on-write overlays and snapshots.

Modules:
- `driver`: `Driver` (define/boot/stop/save/restore local or remote/migrate/snapshot/delete
  over libvirt, snapshots checked before every restore). `VMSpec`, `Snapshot`, `DriverError`
  and `SnapshotError` are importable from it. It is built of `vm_places`, `libvirt_link`,
  `vm_lifecycle` (with `vm_records`, `disk_placement`, `kvm_choice`); its verbs are carried
  out in `checkpoint`, `saved_move`, `labelled_snapshots` and `migration`.
- `vm_types`: those types, `VMInfo` and `check_name` (the name rule for VMs, nodes, images).
- `integrity`: the manifests (size, sha256) beside saved states and the check before a restore.
- `domain_xml`: the libvirt domain XML of a VM, and a saved one's paths rewritten for a node.
- `performer`: `DriverPerformer`, the driver as the context-switch executor's actions.
- `images`: `Catalogue` (the OS images in the store, which node holds which) and the
  distribution down the tree; `distribution`: the pure tree and round planning.
- `transfer`: node-to-node copies (local, rsync, scp) and sha256.
- `guest`: the tiny counter guest used by the real-VM tests, `vjob run` and Saline; built from
  packages fetched and checked by `apt_fetch`, in a cache checked by `safe_dirs`.
- `safe_dirs`: cache and working directories only their owner can change, checked before use.
The libvirtd helpers and the guest's console probe are in the dev kit (`devkit/`).
See docs/provisioning.md.
"""
