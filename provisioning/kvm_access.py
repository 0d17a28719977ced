"""Whether libvirt's QEMU user may open /dev/kvm, and the distribution's rule when it may not.

Why this matters even for TCG guests: libvirt probes QEMU's capabilities as root, where KVM
works, but judges its cached probe by the QEMU user's access to /dev/kvm
(virQEMUCapsKVMUsable, libvirt 9.0: "KVM was enabled when probing …, but it is not available
now"). When root may use the device and the QEMU user may not — a container's /dev without
udev leaves it root:root 0600 — every capability lookup finds the cache stale and probes QEMU
again: two QEMU processes, over half a second each under TCG, several times for every domain
XML libvirt parses (a boot, a define, a restore given an XML). Measured here: a domain start
10–19 s instead of 1.1–2.4 s, a remote resume 13.6 s of restore instead of ~1.5 s
(docs/provisioning.md, "Why a restore was slow").
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

KVM_DEVICE = Path("/dev/kvm")
KVM_GROUP = "kvm"
FIX = "give /dev/kvm group kvm and mode 0660 (Debian's udev rule) and put the QEMU user in group kvm"


def qemu_user_locked_out(qemu_user: str, device: Path = KVM_DEVICE) -> bool:
    """True when this process may use `device` and `qemu_user` may not: libvirt then re-probes.

    Judged by the mode bits, owner and groups (ACLs are not read). False when the device or
    the user does not exist, or when this process may not use it either (then the probe and
    the check agree: no KVM, no re-probe).
    """
    try:
        st = device.stat()
        pw = pwd.getpwnam(qemu_user)
    except (FileNotFoundError, KeyError):
        return False
    if not stat.S_ISCHR(st.st_mode) or not os.access(device, os.R_OK | os.W_OK):
        return False
    groups = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if qemu_user in g.gr_mem}
    if st.st_uid == pw.pw_uid:
        need = stat.S_IRUSR | stat.S_IWUSR
    elif st.st_gid in groups:
        need = stat.S_IRGRP | stat.S_IWGRP
    else:
        need = stat.S_IROTH | stat.S_IWOTH
    return st.st_mode & need != need


def grant_kvm_group(device: Path = KVM_DEVICE, group: str = KVM_GROUP) -> bool:
    """Apply the distribution's rule to a root-only `device` (group `group`, mode 0660).

    For machines without udev (CI containers): only a device owned by root, of group root and
    mode 0600 is changed, and only when `group` exists; True when it was changed.
    """
    try:
        st = device.stat()
        gid = grp.getgrnam(group).gr_gid
    except (FileNotFoundError, KeyError):
        return False
    if not stat.S_ISCHR(st.st_mode) or (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (0, 0, 0o600):
        return False
    os.chown(device, 0, gid)
    os.chmod(device, 0o660)
    return True
