"""Provisioning: the OS image catalogue and its distribution tree, the libvirt VM life-cycle
driver, copy-on-write overlays and snapshots, OS-aware node choice.
"""
