"""provisioning.kvm_access: spotting the /dev/kvm setup that makes libvirt re-probe QEMU at every
domain start, and the distribution's rule the test harness applies (docs/provisioning.md)."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from provisioning import kvm_access

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")

USER = "nobody"
GROUP = "nogroup"  # nobody's primary group on Debian


def _device(tmp_path: Path, mode: int, gid: int = 0) -> Path:
    dev = tmp_path / "kvm"
    os.mknod(dev, stat.S_IFCHR | mode, os.makedev(1, 3))
    os.chown(dev, 0, gid)
    os.chmod(dev, mode)
    return dev


def test_a_root_only_device_locks_the_qemu_user_out_until_the_group_rule_is_applied(tmp_path: Path) -> None:
    dev = _device(tmp_path, 0o600)
    assert kvm_access.qemu_user_locked_out(USER, dev)
    assert kvm_access.grant_kvm_group(dev, GROUP)
    st = dev.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, grp.getgrnam(GROUP).gr_gid, 0o660)
    assert not kvm_access.qemu_user_locked_out(USER, dev)
    assert not kvm_access.grant_kvm_group(dev, GROUP)  # applied once; a device set up otherwise is left alone


def test_a_device_of_another_group_or_open_to_all_is_judged_by_its_bits(tmp_path: Path) -> None:
    dev = _device(tmp_path, 0o660)  # group root: nobody is not in it
    assert kvm_access.qemu_user_locked_out(USER, dev)
    assert not kvm_access.grant_kvm_group(dev, GROUP)  # not root-only 0600: not touched
    dev.chmod(0o666)
    assert not kvm_access.qemu_user_locked_out(USER, dev)


def test_no_device_no_user_or_a_plain_file_is_never_a_lock_out(tmp_path: Path) -> None:
    assert not kvm_access.qemu_user_locked_out(USER, tmp_path / "absent")
    assert not kvm_access.qemu_user_locked_out("no-such-user-c16", _device(tmp_path, 0o600))
    plain = tmp_path / "file"
    plain.write_text("")
    plain.chmod(0o600)
    assert not kvm_access.qemu_user_locked_out(USER, plain)
    assert not kvm_access.grant_kvm_group(plain, GROUP)
    assert not kvm_access.grant_kvm_group(tmp_path / "absent", GROUP)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o600
