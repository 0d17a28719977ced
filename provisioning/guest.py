"""The tiny test guest: Debian's cloud kernel plus a busybox initramfs that counts.

Why this guest: it proves checkpoints on a real QEMU without a root filesystem image. Its
init prints `COUNTER n` on the serial console once per second (and writes it to /dev/vda, so
the disk overlay grows like a job's would). After a save/restore, a resume on another node
or a live migration, the next line must be `COUNTER n+1` with one `GUEST: booted` in the
log: the job continued instead of restarting (devkit.guest_probe reads these lines). A
payload script (a job's command) can replace the counter.

Nothing is installed: the two .debs are fetched with `apt-get download` and checked against
apt's SHA256 (provisioning.apt_fetch), and the few files the guest needs are kept in a cache
outside the repository. Root builds every guest from that cache, so it is root's alone:
created 0755 (files 0644) by the effective user, checked before every use with
provisioning.safe_dirs, and refused if anyone else could have changed it. Binaries are never
committed.

Who reads what: QEMU runs as the QEMU user (libvirt-qemu) and opens kernel and initrd
itself, so the kernel and the counter initrd are world-readable. An initrd embedding a
payload holds a user's data: it is 0600, owned by the QEMU user, in a directory nobody can
list (0711).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from provisioning import apt_fetch, safe_dirs
from vjob import log, proc
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
    "virtio/virtio_balloon",  # the balloon's memory statistics: swap activity (docs/remap.md)
)
_log = log.get("provisioning")

MIN_MEMORY_MIB = 72
"""Debian's cloud kernel does not boot in less (64 MiB hangs, see the libvirt notes)."""

DEFAULT_QEMU_USER = "libvirt-qemu"
"""The QEMU user of Debian's libvirt (and the default of `[provisioning] qemu_user`)."""
PARTS = "parts"
"""The build inputs (kernel, busybox, modules, manifest.json): root-only, never given to QEMU."""
LEGACY_DOWNLOAD_DIR = "debs"
"""Where vjob before issue 23 downloaded and unpacked the packages, world-writable: never read
now, removed on sight (what it holds may be anyone's)."""
PAYLOAD_DIR = "payload"
"""Initrds that embed a payload: 0711, so QEMU reaches a file by name and nobody lists them."""

_INIT_HEAD = r"""#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk virtio_balloon; do
  insmod /mods/$m.ko 2>/dev/null || echo "GUEST: insmod $m failed"
done
FILL=$(sed -n 's/.*vjob_fill=\([0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$FILL" ] && [ "$FILL" -gt 0 ]; then
  mount -t tmpfs -o size=${FILL}m tmpfs /tmp
  dd if=/dev/urandom of=/tmp/fill bs=1M count=$FILL 2>/dev/null
  echo "GUEST: filled ${FILL} MiB of RAM"
fi
CHURN=$(sed -n 's/.*vjob_churn=\([0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$CHURN" ] && [ "$CHURN" -gt 0 ]; then
  mkdir -p /churn && mount -t tmpfs -o size=${CHURN}m tmpfs /churn
  dd if=/dev/urandom of=/churn/data bs=1M count=$CHURN 2>/dev/null
  rm /churn/data && umount /churn
  echo "GUEST: touched and freed ${CHURN} MiB of RAM"
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
    """What a domain needs to boot the tiny guest (the payload's initrd is the QEMU user's only)."""

    kernel: Path
    initrd: Path
    cmdline: str = "console=ttyS0 quiet panic=-1 no_timer_check"
    """no_timer_check: see provisioning.image_build.CMDLINE (a guest booting on a busy host under TCG)."""


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
    """Serialise builds between processes sharing the cache (`directory` is checked already)."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
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
    return apt_fetch.check_package(match.group(1))


def _fetch(into: Path) -> tuple[list[apt_fetch.AptRecord], dict[str, Path]]:
    """The kernel and busybox records and their verified .debs, downloaded into `into`."""

    def once() -> tuple[list[apt_fetch.AptRecord], dict[str, Path]]:
        records = [apt_fetch.candidate(_kernel_package()), apt_fetch.candidate(BUSYBOX_PACKAGE)]
        return records, apt_fetch.download(records, into)

    try:
        return once()
    except VjobError:
        if os.geteuid() != 0:
            raise
        # A fresh machine (CI) may have no package lists yet: fetch them once and retry.
        _run(["apt-get", "update", "-qq"], timeout_s=600)
        return once()


def _copy(src: Path, dst: Path, mode: int) -> None:
    shutil.copyfile(src, dst, follow_symlinks=False)
    os.chmod(dst, mode)


def _parts(root: Path) -> tuple[Path, str]:
    """The build inputs under `root/parts`, fetched once; returns the directory and a digest
    of its manifest (part of every initrd's cache key, so new packages mean new initrds)."""
    parts = root / PARTS
    manifest = parts / "manifest.json"
    if os.path.lexists(parts):
        safe_dirs.check_tree(parts)
        complete = all(os.path.lexists(parts / "mods" / f"{m.rsplit('/', 1)[-1]}.ko") for m in VIRTIO_MODULES)
        if os.path.lexists(manifest) and complete:
            return parts, hashlib.sha256(manifest.read_bytes()).hexdigest()
        shutil.rmtree(parts)  # cut short by a crash, or from before a module was added: rebuilt
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))  # 0700, ours
    try:
        debs_dir = work / "debs"
        debs_dir.mkdir(mode=0o700)
        records, debs = _fetch(debs_dir)
        kernel_pkg, busybox_pkg = records[0].package, records[1].package
        _run(["dpkg-deb", "-x", str(debs[kernel_pkg]), str(work / "k")])
        _run(["dpkg-deb", "-x", str(debs[busybox_pkg]), str(work / "bb")])
        staging = work / PARTS
        for directory in (staging, staging / "mods"):
            directory.mkdir(mode=0o755)
            os.chmod(directory, 0o755)
        _copy(next((work / "k" / "boot").glob("vmlinuz-*")), staging / "vmlinuz", 0o644)
        _copy(work / "bb" / "bin" / "busybox", staging / "busybox", 0o755)
        modules_root = next((work / "k" / "lib" / "modules").iterdir()) / "kernel" / "drivers"
        for module in VIRTIO_MODULES:
            src = modules_root / f"{module}.ko"
            _copy(src, staging / "mods" / src.name, 0o644)
        described = {r.package: {"version": r.version, "sha256": r.sha256} for r in records}
        (staging / "manifest.json").write_text(json.dumps(described, indent=1, sort_keys=True))
        os.chmod(staging / "manifest.json", 0o644)
        os.rename(staging, parts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return parts, hashlib.sha256(manifest.read_bytes()).hexdigest()


def _qemu_ids(qemu_user: str) -> tuple[int, int] | None:
    """uid and gid of the QEMU user when we run as root and it exists (else: we own it all)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(qemu_user)
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


def _install(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> Path:
    """`path` holds exactly `data` with `mode` (and `owner`): kept if it already does, else
    written to a private temporary file and renamed over it.

    Why compare instead of trusting an existing file: libvirt gives kernel and initrd to the
    QEMU user while a VM runs, so an existing one may not be root's; its content is checked
    instead (both are small and built deterministically).
    """
    try:  # O_NONBLOCK: a FIFO planted here would otherwise hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        fd = -1  # missing, or a symlink: replaced below
    if fd >= 0:
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            same = (
                stat.S_ISREG(st.st_mode)
                and st.st_size == len(data)
                and stat.S_IMODE(st.st_mode) == mode
                and st.st_uid in {os.geteuid(), *(owner[:1] if owner else ())}
                and fh.read() == data
            )
        if same:
            return path
    tmp_fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(tmp_fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            if owner is not None:
                os.fchown(fh.fileno(), *owner)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _remove_leftovers(root: Path) -> None:
    """Temporary files and directories of a build killed midway (we hold the lock; `root`
    was checked). Only the names `build` itself uses: others may write into the cache."""
    for directory in (root, root / PAYLOAD_DIR):
        for pattern in (".fetch-*", ".vmlinuz-*", ".initrd-*"):
            for leftover in directory.glob(pattern):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()


def _remove_legacy(root: Path) -> None:
    """Drop the old world-writable download directory: nothing is built from it any more (the
    kernel is compared with the verified parts, initrd keys include the parts' digest)."""
    legacy = root / LEGACY_DOWNLOAD_DIR
    if os.path.lexists(legacy):
        _log.warning("removing the old world-writable guest download directory", path=str(legacy))
        if legacy.is_dir() and not legacy.is_symlink():
            shutil.rmtree(legacy)  # fd-based on Linux: does not follow symlinks planted in it
        else:
            legacy.unlink()


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


def build(payload: str | None = None, *, root: Path | None = None, qemu_user: str = DEFAULT_QEMU_USER) -> GuestFiles:
    """The guest's kernel and initrd, built once per distinct init and cached under `root`.

    `payload` is a shell script run by busybox sh instead of the counter loop; the guest
    powers off when it ends. Its initrd is given to `qemu_user` (0600) when we run as root.
    Raises safe_dirs.UnsafePathError when the cache could have been changed by others.
    """
    root = safe_dirs.ensure_dir(root or cache_dir() / "guest", 0o755)
    with _locked(root):
        qemu = _qemu_ids(qemu_user)
        _remove_leftovers(root)
        _remove_legacy(root)
        safe_dirs.check_tree(root, file_owners=(qemu[0],) if qemu else ())
        parts, parts_digest = _parts(root)
        kernel = _install(root / "vmlinuz", (parts / "vmlinuz").read_bytes(), 0o644)
        init = _init_script(payload)
        key = hashlib.sha256(parts_digest.encode() + init.encode() + (payload or "").encode()).hexdigest()[:16]
        data = _initramfs(parts, init, payload)
        if payload is None:
            initrd = _install(root / f"initrd-{key}.gz", data, 0o644)
        else:
            private = safe_dirs.ensure_dir(root / PAYLOAD_DIR, 0o711)
            os.chmod(private, 0o711)  # ours (checked): an older 0755 one becomes unlistable
            initrd = _install(private / f"initrd-{key}.gz", data, 0o600, owner=qemu)
    return GuestFiles(kernel=kernel, initrd=initrd)


def _initramfs(parts: Path, init: str, payload: str | None) -> bytes:
    entries: list[tuple[str, int, bytes]] = [(d, 0o040755, b"") for d in ("bin", "proc", "sys", "dev", "tmp", "mods")]
    entries.append(("bin/busybox", 0o100755, (parts / "busybox").read_bytes()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    for module in VIRTIO_MODULES:
        name = f"{module.rsplit('/', 1)[-1]}.ko"
        entries.append((f"mods/{name}", 0o100644, (parts / "mods" / name).read_bytes()))
    entries.append(("init", 0o100755, init.encode()))
    if payload is not None:
        entries.append(("payload.sh", 0o100755, payload.encode()))
    return gzip.compress(_cpio_newc(entries), compresslevel=6, mtime=0)
