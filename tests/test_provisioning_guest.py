"""The tiny test guest: its console-log readers, and the initramfs it boots from."""

from __future__ import annotations

import gzip
import stat
from pathlib import Path

import pytest

from provisioning import guest


def test_console_log_readers(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert guest.last_counter(log) is None and guest.counters(log) == [] and guest.boots(log) == 0
    log.write_bytes(b"\x1b[0m[    0.5] noise\r\nGUEST: booted\r\nCOUNTER 1\r\nCOUNTER 2\r\nxCOUNTER 9\r\nCOUNTER 3")
    assert guest.counters(log) == [1, 2, 3]  # only whole lines count
    assert guest.last_counter(log) == 3
    assert guest.boots(log) == 1


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
def test_build_is_cached_and_carries_the_payload() -> None:
    counter = guest.build()
    assert guest.build() == counter  # cached: same files
    payload = guest.build(payload="echo hello from the job\n")
    assert payload.initrd != counter.initrd and payload.kernel == counter.kernel
    for path in (counter.kernel, counter.initrd, payload.initrd):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # QEMU runs as libvirt-qemu
    files = _cpio_names(gzip.decompress(payload.initrd.read_bytes()))
    assert files["payload.sh"] == b"echo hello from the job\n"
    assert b"/bin/sh /payload.sh" in files["init"]
    assert "mods/virtio_blk.ko" in files and files["bin/sh"] == b"busybox"
    assert b"COUNTER" in _cpio_names(gzip.decompress(counter.initrd.read_bytes()))["init"]
