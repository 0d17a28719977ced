"""The tiny test guest: its console-log readers (devkit.guest_probe), and the initramfs it boots from."""

from __future__ import annotations

import gzip
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devkit import guest_probe
from provisioning import guest
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig


def test_console_log_readers(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert guest_probe.last_counter(log) is None and guest_probe.counters(log) == [] and guest_probe.boots(log) == 0
    log.write_bytes(b"\x1b[0m[    0.5] noise\r\nGUEST: booted\r\nCOUNTER 1\r\nCOUNTER 2\r\nxCOUNTER 9\r\nCOUNTER 3")
    assert guest_probe.counters(log) == [1, 2, 3]  # only whole lines count
    assert guest_probe.last_counter(log) == 3
    assert guest_probe.boots(log) == 1


def _cpio_names(data: bytes) -> dict[str, bytes]:
    """Parse a newc archive (the format the kernel unpacks) into {name: content}."""
    out, pos = {}, 0
    while True:
        assert data[pos : pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        size, namesize = fields[6], fields[11]
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        pos += 110 + namesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            return out
        out[name] = data[pos : pos + size]
        pos += size
        pos += -pos % 4


@pytest.mark.realvm
def test_build_is_cached_and_carries_the_payload(tmp_path: Path) -> None:
    """A real build (apt-get download of the kernel and busybox, checked against apt's SHA256)
    in a cache of its own: the cache is 0755/0644 and the effective user's, nothing in it is
    writable by others, and the payload's initrd is the QEMU user's only."""
    root = tmp_path / "cache" / "guest"
    counter = guest.build(root=root)
    assert guest.build(root=root) == counter  # cached: same files
    payload = guest.build(payload="echo hello from the job\n", root=root)
    assert payload.initrd != counter.initrd and payload.kernel == counter.kernel
    for path in (counter.kernel, counter.initrd):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # QEMU runs as libvirt-qemu
    assert stat.S_IMODE(payload.initrd.stat().st_mode) == 0o600
    assert stat.S_IMODE(payload.initrd.parent.stat().st_mode) == 0o711
    euid = os.geteuid()
    qemu_uid = pwd.getpwnam(guest.DEFAULT_QEMU_USER).pw_uid if euid == 0 else euid
    for path in [root, *root.rglob("*")]:
        st_ = path.lstat()
        assert not stat.S_ISLNK(st_.st_mode), path
        assert st_.st_mode & 0o022 == 0, f"{path} is {stat.S_IMODE(st_.st_mode):o}"
        assert st_.st_uid == (qemu_uid if path == payload.initrd else euid), path
        if path.is_dir():
            assert stat.S_IMODE(st_.st_mode) in (0o755, 0o711), path
    assert not [p for p in root.iterdir() if p.name.startswith(".") and p.name != ".lock"]  # no temp leftovers
    files = _cpio_names(gzip.decompress(payload.initrd.read_bytes()))
    assert files["payload.sh"] == b"echo hello from the job\n"
    assert b"/bin/sh /payload.sh" in files["init"]
    assert "mods/virtio_blk.ko" in files and files["bin/sh"] == b"busybox"
    assert b"COUNTER" in _cpio_names(gzip.decompress(counter.initrd.read_bytes()))["init"]


@pytest.mark.libvirt
@pytest.mark.realvm
def test_qemu_boots_from_the_private_payload_initrd(libvirt_system: str) -> None:
    """The payload's initrd is 0600 for the QEMU user in a 0711 directory: QEMU still opens it."""
    files = guest.build(payload="echo payload-ran\n")  # the default cache: QEMU must reach it
    assert stat.S_IMODE(files.initrd.stat().st_mode) == 0o600
    work = Path(tempfile.mkdtemp(prefix="vjob-payload-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU runs as libvirt-qemu and must reach the overlay and the image
    image = work / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True, timeout=30)
    driver = Driver(ProvisioningConfig(nodes={"a": libvirt_system}, operation_timeout_s=120), data_dir=work)
    vm = "vjob-payload-initrd"
    spec = VMSpec(vm, image, memory_mib=128, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline)
    try:
        driver.delete(vm, "a")  # a leftover of an interrupted earlier run
        driver.define(spec, "a")
        driver.boot(vm, "a")
        log = driver.console_log(vm, "a")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and b"GUEST: payload exited" not in (
            log.read_bytes() if log.exists() else b""
        ):
            time.sleep(0.5)
        assert b"payload-ran" in log.read_bytes()
    finally:
        driver.delete(vm, "a")
        driver.close()
        shutil.rmtree(work, ignore_errors=True)
