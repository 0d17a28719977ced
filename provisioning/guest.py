"""The tiny test guest: Debian's cloud kernel plus a busybox initramfs that counts.

Why this guest: it proves checkpoints on a real QEMU without a root filesystem image. Its
init prints `COUNTER n` on the serial console once per second (and writes it to /dev/vda, so
the disk overlay grows like a job's would). After a save/restore, a resume on another node
or a live migration, the next line must be `COUNTER n+1` with one `GUEST: booted` in the
log: the job continued instead of restarting. A payload script can replace the counter.

Nothing is installed: the two .debs are fetched with `apt-get download` (a Debian mirror)
and unpacked into a cache outside the repository, kept world-readable because QEMU runs as
libvirt-qemu and opens the kernel and initrd itself. Binaries are never committed.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vjob import proc
from vjob.errors import VjobError

KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
BUSYBOX_PACKAGE = "busybox-static"
VIRTIO_MODULES = (
    "virtio/virtio_ring",
    "virtio/virtio",
    "virtio/virtio_pci_legacy_dev",
    "virtio/virtio_pci_modern_dev",
    "virtio/virtio_pci",
    "block/virtio_blk",
)
MIN_MEMORY_MIB = 72
"""Debian's cloud kernel does not boot in less (64 MiB hangs, see the libvirt notes)."""

_COUNTER_RE = re.compile(rb"^COUNTER (\d+)", re.MULTILINE)

_INIT_HEAD = r"""#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk; do
  insmod /mods/$m.ko 2>/dev/null || echo "GUEST: insmod $m failed"
done
FILL=$(sed -n 's/.*vjob_fill=\([0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$FILL" ] && [ "$FILL" -gt 0 ]; then
  mount -t tmpfs -o size=${FILL}m tmpfs /tmp
  dd if=/dev/urandom of=/tmp/fill bs=1M count=$FILL 2>/dev/null
  echo "GUEST: filled ${FILL} MiB of RAM"
fi
echo "GUEST: booted"
"""

_COUNTER_BODY = r"""i=0
while true; do
  i=$((i+1))
  echo "COUNTER $i"
  [ -b /dev/vda ] && printf 'COUNTER %08d\n' $i | dd of=/dev/vda bs=65536 seek=$i conv=sync,notrunc 2>/dev/null
  sleep 1
done
"""

_PAYLOAD_BODY = r"""/bin/sh /payload.sh
echo "GUEST: payload exited with status $?"
poweroff -f
"""


@dataclass(frozen=True)
class GuestFiles:
    """What a domain needs to boot the tiny guest (all world-readable)."""

    kernel: Path
    initrd: Path
    cmdline: str = "console=ttyS0 quiet panic=-1"


def cache_dir() -> Path:
    """$VJOB_CACHE_DIR, else /var/cache/vjob as root, else $XDG_CACHE_HOME/vjob."""
    env = os.environ.get("VJOB_CACHE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/vjob")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vjob"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialise builds between test processes sharing the cache."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], cwd: Path | None = None, timeout_s: float = 300.0) -> str:
    return proc.run(cmd, timeout_s=timeout_s, cwd=cwd)


def _kernel_package() -> str:
    out = _run(["apt-cache", "depends", KERNEL_META_PACKAGE])
    match = re.search(r"Depends: (linux-image-\S+)", out)
    if not match:
        raise VjobError(f"apt-cache depends {KERNEL_META_PACKAGE}: no linux-image dependency (run apt-get update)")
    return match.group(1)


def _unpacked(root: Path) -> Path:
    """Download and unpack the kernel and busybox .debs once; returns the unpack directory."""
    debs = root / "debs"
    done = debs / ".complete"
    if done.exists():
        return debs
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    debs.chmod(0o777)  # apt-get download drops privileges to _apt and must write here
    try:
        _run(["apt-get", "download", "-q", _kernel_package(), BUSYBOX_PACKAGE], cwd=debs)
    except VjobError:
        if os.geteuid() != 0:
            raise
        # A fresh machine (CI) may have no package lists yet: fetch them once and retry.
        _run(["apt-get", "update", "-qq"], timeout_s=600)
        _run(["apt-get", "download", "-q", _kernel_package(), BUSYBOX_PACKAGE], cwd=debs)
    kernel_deb = next(debs.glob("linux-image-*.deb"))
    busybox_deb = next(debs.glob("busybox-static*.deb"))
    _run(["dpkg-deb", "-x", str(kernel_deb), str(debs / "k")])
    _run(["dpkg-deb", "-x", str(busybox_deb), str(debs / "bb")])
    kernel_deb.unlink()
    busybox_deb.unlink()
    done.touch()
    return debs


def _init_script(payload: str | None) -> str:
    return _INIT_HEAD + (_COUNTER_BODY if payload is None else _PAYLOAD_BODY)


def _cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries; directories have empty data.

    Why by hand: it keeps the initramfs byte-for-byte reproducible (fixed mtimes and
    inodes), so its cache key is a content hash, and needs no cpio binary.
    """
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields))
        out.write(encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def build(payload: str | None = None, *, root: Path | None = None) -> GuestFiles:
    """The guest's kernel and initrd, built once per distinct init and cached under `root`.

    `payload` is a shell script run by busybox sh instead of the counter loop; the guest
    powers off when it ends.
    """
    root = root or cache_dir() / "guest"
    with _locked(root):
        root.chmod(0o755)
        debs = _unpacked(root)
        kernel = root / "vmlinuz"
        if not kernel.exists():
            src = next((debs / "k" / "boot").glob("vmlinuz-*"))
            shutil.copyfile(src, kernel)
            kernel.chmod(0o644)
        init = _init_script(payload)
        key = hashlib.sha256(init.encode() + (payload or "").encode()).hexdigest()[:16]
        initrd = root / f"initrd-{key}.gz"
        if not initrd.exists():
            data = _initramfs(debs, init, payload)
            fd, tmp = tempfile.mkstemp(dir=root, prefix=".initrd-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, initrd)
    return GuestFiles(kernel=kernel, initrd=initrd)


def _initramfs(debs: Path, init: str, payload: str | None) -> bytes:
    modules_root = next((debs / "k" / "lib" / "modules").iterdir()) / "kernel" / "drivers"
    entries: list[tuple[str, int, bytes]] = [(d, 0o040755, b"") for d in ("bin", "proc", "sys", "dev", "tmp", "mods")]
    entries.append(("bin/busybox", 0o100755, (debs / "bb" / "bin" / "busybox").read_bytes()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    for module in VIRTIO_MODULES:
        path = modules_root / f"{module}.ko"
        entries.append((f"mods/{path.name}", 0o100644, path.read_bytes()))
    entries.append(("init", 0o100755, init.encode()))
    if payload is not None:
        entries.append(("payload.sh", 0o100755, payload.encode()))
    return gzip.compress(_cpio_newc(entries), compresslevel=6, mtime=0)


def last_counter(console_log: Path) -> int | None:
    """The last `COUNTER n` the guest printed in `console_log`, or None before the first."""
    try:
        data = console_log.read_bytes()
    except FileNotFoundError:
        return None
    found = _COUNTER_RE.findall(data)
    return int(found[-1]) if found else None


def counters(console_log: Path) -> list[int]:
    """Every counter value in the log, in order (to check n → n+1 across a checkpoint)."""
    try:
        return [int(v) for v in _COUNTER_RE.findall(console_log.read_bytes())]
    except FileNotFoundError:
        return []


def boots(console_log: Path) -> int:
    """How many times the guest booted according to its log (1 means it never restarted)."""
    try:
        return console_log.read_bytes().count(b"GUEST: booted")
    except FileNotFoundError:
        return 0
