"""`vjob image build`: a bootable Debian 12 guest for real jobs, from Debian packages.

Why this recipe (docs/realjobs.md has the figures):

* **mmdebstrap, minbase**: a root filesystem from the Debian archive apt already trusts here
  (signed indexes), with the packages a site's jobs need (`--packages`), in about a minute;
* **the distribution kernel booted directly** (linux-image-cloud-amd64, its own initramfs
  limited to virtio and ext4): libvirt loads kernel and initrd from beside the image, no
  bootloader, no partition table;
* **no systemd**: `init=/sbin/vjob-init` mounts what a job needs and starts the guest agent
  (provisioning.guest_agent), which runs the job and powers the guest off;
* **no mount**: `mkfs.ext4 -d ROOTDIR` writes the filesystem from the directory, then
  `qemu-img convert -O qcow2`.

Images are cached by content (suite, packages, agent, its helper modules and init) under root's cache
(`<cache>/images/<key>`, provisioning.safe_dirs rules), then added to the catalogue (os_images,
size and sha256) with their kernel and initrd beside them. Nothing touches the catalogue before
the build succeeded: a package that does not exist is named and the catalogue is unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provisioning import apt_fetch, guest, safe_dirs
from provisioning.guest_agent import AGENT, GUEST_LIB, INIT, helper_modules
from provisioning.images import Catalogue, ImageInfo, detect_format
from provisioning.vm_types import check_name
from vjob import log, proc
from vjob.errors import CommandError, InputError, UsageError, VjobError

DEFAULT_IMAGE = "debian12"
SUITE = "bookworm"
BASE_PACKAGES = (
    "linux-image-cloud-amd64",
    "python3",
    "mount",
    "procps",
    "openssh-server",
    "openssh-client",
    "openmpi-bin",
    "python3-mpi4py",
    "nfs-common",
    "netbase",
)
"""The kernel, the guest agent's Python, mount (not Essential in bookworm), ps/kill for jobs,
ssh between the VMs of a multi-node job, and Open MPI with mpi4py so `mpirun --hostfile
"$VJOB_NODEFILE"` works in the default image (the image has Python and no compiler): +64 MiB
and ~14 s of a quiet build (docs/multinode.md, "A private network per job"); nfs-common for
mount.nfs4, the site's filesystems from the job's NFS gateway, and netbase for its /etc/protocols
(without it: "mount.nfs4: Failed to find 'tcp' protocol") (docs/realjobs.md, "Filesystems")."""
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4", "virtio_net")
"""What the initramfs must hold to mount the root disk, and the NIC of a multi-node job (no udev
in the guest loads it later); MODULES=list keeps it ~5 MB."""
OPENMPI_PARAMS = "\n# vjob: no resource manager in a guest\nplm = rsh\nras = ^slurm,gridengine\n"
"""Appended to Open MPI's system parameters: the job's environment in the guest carries the host
allocation's SLURM_* variables, so Open MPI would take the host nodes for its allocation (refusing
`--hostfile "$VJOB_NODEFILE"`: "vm0 not in the allocation") and launch with srun, which the guest
has not; the VMs are reached over ssh (docs/multinode.md). Part of the cache key. It starts with a
newline: Debian's file does not end with one."""
PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{0,99}")
MAX_PACKAGES = 200
RECIPE_VERSION = "4"
"""Bumped when the recipe changes: part of the cache key."""
CMDLINE = "root=/dev/vda rw console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check init=/sbin/vjob-init"
"""The guest kernel's command line (part of the cache key). `no_timer_check`: under TCG on a busy
host the kernel's early check that the timer interrupt arrives can time out, and the guest panics
("IO-APIC + timer doesn't work!"): seen on one of the demo's 8 guests booting together at load 8
(issue 32). The check proves nothing about a virtual machine's timer; skipping it is what cloud
images booted under QEMU do."""
ROOT_FREE_MB = 1536
"""Free room in the root filesystem for what jobs write outside their working directory."""
_log = log.get("provisioning")


@dataclass(frozen=True)
class BuildResult:
    image: ImageInfo
    cached: bool
    build_s: float
    size_bytes: int


def parse_packages(text: str | None) -> list[str]:
    """`--packages a,b`: Debian package names, matched whole, at most MAX_PACKAGES."""
    names = [p.strip() for p in (text or "").split(",") if p.strip()]
    if len(names) > MAX_PACKAGES:
        raise InputError(f"--packages: {len(names)} packages: at most {MAX_PACKAGES}")
    for name in names:
        if not PACKAGE_RE.fullmatch(name):
            raise InputError(f"--packages: {name[:80]!r} is not a Debian package name")
    return sorted(set(names))


def check_packages_exist(packages: list[str]) -> None:
    """Every package has a candidate in apt's (signed) indexes; else InputError naming them."""
    found = apt_fetch.available(packages)
    missing = [name for name in packages if name not in found]
    if missing:
        raise InputError(
            f"--packages: no such package in the Debian archive apt knows here: {', '.join(missing)} "
            "(check the name with `apt-cache policy NAME`; run apt-get update if it is new); "
            "nothing was built and the catalogue is unchanged"
        )


def _cache_key(packages: list[str]) -> str:
    h = hashlib.sha256()
    for part in (RECIPE_VERSION, SUITE, ",".join(packages), CMDLINE, OPENMPI_PARAMS):
        h.update(part.encode() + b"\0")
    h.update(AGENT.read_bytes() + b"\0" + INIT.read_bytes())
    for module in helper_modules():
        h.update(b"\0" + module.name.encode() + b"\0" + module.read_bytes())
    return h.hexdigest()[:20]


def image_cache() -> Path:
    return guest.cache_dir() / "images"


def _run(cmd: list[str], timeout_s: float = 1800.0) -> str:
    return proc.run(cmd, timeout_s=timeout_s)


def _install_guest_files(root: Path) -> None:
    """The guest agent and init, root's, 0755 (merged /usr: /sbin is /usr/sbin); the agent's
    helper modules under GUEST_LIB, root's, 0644."""
    sbin = root / "usr" / "sbin"
    lib = root / GUEST_LIB.lstrip("/")
    lib.mkdir(mode=0o755, parents=True, exist_ok=True)
    files = [(AGENT, sbin / "vjob-guest-agent", 0o755), (INIT, sbin / "vjob-init", 0o755)]
    files += [(module, lib / module.name, 0o644) for module in helper_modules()]
    for src, dst, mode in files:
        shutil.copyfile(src, dst)
        os.chmod(dst, mode)
        os.chown(dst, 0, 0)


def _inject_script() -> str:
    """debugfs commands writing the agent, init and helper modules into an imported image (an
    `rm` or `mkdir` that fails because the file is absent or the directory present is harmless)."""
    lines = ["cd /usr/sbin"]
    for src, name in ((AGENT, "vjob-guest-agent"), (INIT, "vjob-init")):
        lines += [f"rm {name}", f"write {src} {name}", f"sif {name} mode 0100755"]
    lines += [f"mkdir {GUEST_LIB}", f"cd {GUEST_LIB}"]
    for module in helper_modules():
        lines += [f"rm {module.name}", f"write {module} {module.name}", f"sif {module.name} mode 0100644"]
    return "".join(f"{line}\n" for line in lines)


def _mmdebstrap(work: Path, packages: list[str]) -> Path:
    cfg = work / "cfg"
    cfg.mkdir(mode=0o700)
    (cfg / "vjob.conf").write_text("MODULES=list\nCOMPRESS=gzip\n")
    (cfg / "modules").write_text("".join(f"{m}\n" for m in INITRAMFS_MODULES))
    (cfg / "openmpi.conf").write_text(OPENMPI_PARAMS)
    root = work / "root"
    include = ",".join([*BASE_PACKAGES, *packages])
    # The hooks are constant text and our own private paths: no user data reaches a shell.
    cmd = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        f"--include={include}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        '--setup-hook=mkdir -p "$1/etc/initramfs-tools/conf.d"',
        f"--setup-hook=upload {cfg / 'vjob.conf'} /etc/initramfs-tools/conf.d/vjob.conf",
        f"--setup-hook=upload {cfg / 'modules'} /etc/initramfs-tools/modules",
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
        '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*',  # one host key per VM, made at its boot
        f'--customize-hook=cat {cfg / "openmpi.conf"} >> "$1"/etc/openmpi/openmpi-mca-params.conf',
        SUITE,
        str(root),
    ]
    try:
        _run(cmd)
    except CommandError as exc:
        raise VjobError(f"image build: mmdebstrap failed (is the Debian archive reachable?): {exc}") from None
    return root


def _boot_files(root: Path, into: Path) -> tuple[Path, Path]:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    initrds = sorted((root / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise VjobError(f"image build: no kernel or initrd under {root / 'boot'} (linux-image-cloud-amd64 failed?)")
    kernel, initrd = into / "vmlinuz", into / "initrd"
    shutil.copyfile(kernels[-1], kernel)
    shutil.copyfile(initrds[-1], initrd)
    for f in (kernel, initrd):
        os.chmod(f, 0o644)
    return kernel, initrd


def _du(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _filesystem(root: Path, out: Path) -> None:
    """ext4 written from the directory (nothing mounted), then qcow2."""
    raw = out.with_suffix(".raw")
    size_mib = _du(root) * 5 // 4 // 2**20 + ROOT_FREE_MB
    with open(raw, "wb") as fh:
        fh.truncate(size_mib * 2**20)
    _run(["mkfs.ext4", "-q", "-F", "-L", "vjob-root", "-d", str(root), str(raw)])
    _run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(out)])
    raw.unlink()
    os.chmod(out, 0o644)


def _complete(done: Path) -> bool:
    return all((done / f).is_file() for f in ("image.qcow2", "vmlinuz", "initrd"))


def _build_into_cache(packages: list[str], say: Callable[[str], None]) -> tuple[Path, bool]:
    """The cached build directory of `packages` (image.qcow2, vmlinuz, initrd), built if absent."""
    cache = safe_dirs.ensure_dir(image_cache(), 0o755)
    key = _cache_key(packages)
    done = cache / key
    if os.path.lexists(done):
        safe_dirs.check_tree(done)
        if _complete(done):
            return done, True
        shutil.rmtree(done)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        say(f"mmdebstrap {SUITE} with {', '.join([*BASE_PACKAGES, *packages])}")
        root = _mmdebstrap(work, packages)
        _install_guest_files(root)
        out = work / "out"
        out.mkdir(mode=0o755)
        _boot_files(root, out)
        say("mkfs.ext4 -d + qemu-img convert")
        _filesystem(root, out / "image.qcow2")
        try:
            os.rename(out, done)
        except OSError as exc:  # another build of the same key finished first: same content, keep theirs
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not _complete(done):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done, False


def _import(src: Path, work: Path) -> Path:
    """`--from FILE`: a site's image whose whole disk is an ext4 root filesystem with a kernel
    and initrd under /boot; the guest agent and init are written into a copy (debugfs -w)."""
    detect_format(src)
    raw = work / "import.raw"
    _run(["qemu-img", "convert", "-q", "-O", "raw", str(src), str(raw)])
    try:
        listing = _run(["debugfs", "-R", "ls -p /boot", str(raw)], timeout_s=120)
    except CommandError:
        raise InputError(
            f"--from {src}: not an ext4 filesystem on the whole disk (partitioned images are not supported: "
            "give the root partition as its own image)"
        ) from None
    names = [f.split("/")[5] for f in listing.splitlines() if f.count("/") >= 6]
    kernels = sorted(n for n in names if n.startswith("vmlinuz-"))
    initrds = sorted(n for n in names if n.startswith("initrd.img-"))
    if not kernels or not initrds:
        raise InputError(f"--from {src}: no /boot/vmlinuz-* and /boot/initrd.img-* in the image")
    out = work / "out"
    out.mkdir(mode=0o755)
    for name, dst in ((kernels[-1], out / "vmlinuz"), (initrds[-1], out / "initrd")):
        if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
            raise InputError(f"--from {src}: odd file name /boot/{name[:80]!r}")
        _run(["debugfs", "-R", f"dump /boot/{name} {dst}", str(raw)], timeout_s=120)
        os.chmod(dst, 0o644)
    script = work / "inject.debugfs"
    script.write_text(_inject_script())
    _run(["debugfs", "-w", "-f", str(script), str(raw)], timeout_s=120)
    _run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(out / "image.qcow2")])
    return out


def build(
    catalogue: Catalogue,
    name: str = DEFAULT_IMAGE,
    *,
    packages: str | None = None,
    from_file: Path | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> BuildResult:
    """Build (or import) image `name` and add it to the catalogue; see the module docstring."""
    check_name("image", name)
    wanted = parse_packages(packages)
    if from_file is not None and wanted:
        raise UsageError("vjob image build: --packages and --from exclude each other (an imported image is as it is)")
    if os.geteuid() != 0:
        raise UsageError("vjob image build: run as root (mmdebstrap installs packages into a root filesystem)")
    t0 = time.monotonic()
    work: Path | None = None
    if from_file is not None:
        if not from_file.is_file():
            raise InputError(f"--from {from_file}: no such file")
        work = Path(tempfile.mkdtemp(prefix=".import-", dir=safe_dirs.ensure_dir(image_cache(), 0o755)))
        built, cached = _import(from_file, work), False
    else:
        check_packages_exist([*BASE_PACKAGES, *wanted])
        built, cached = _build_into_cache(wanted, say)
    try:
        image = built / "image.qcow2"
        info = catalogue.add_or_reuse(name, image, kernel=built / "vmlinuz", initrd=built / "initrd", cmdline=CMDLINE)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t0
    _log.info("image built", image=name, cached=cached, seconds=round(took, 1), bytes=info.size_bytes)
    return BuildResult(info, cached, took, info.size_bytes)


def describe(result: BuildResult) -> str:
    i = result.image
    how = "from the cache" if result.cached else f"in {result.build_s:.0f} s"
    return (
        f"image {i.name} version {i.version}: {i.format}, {i.size_bytes / 2**20:.0f} MiB, sha256 {i.sha256[:16]}…, "
        f"built {how}"
    )
