"""The VM a job gets: its image, memory and spec, and the VM driver as the job's user reaches it.

Why apart from the life cycle (pilot.pilot): these are decided once, before the first boot, from
the configuration and the node's image catalogue; a refusal here (an unknown image) comes before
anything is started. The counter guest (`debian-tiny`, provisioning.guest) is the one image vjob
can always offer; a catalogue image runs the job's unchanged script with its own kernel.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from preemption.remap.farm import load_subclusters
from preemption.remap.memory import domain_max_mib
from provisioning import guest, images, safe_dirs
from vjob import log
from vjob.allocation import GUEST_MIN_MEMORY_MIB
from vjob.config import Config, ProvisioningConfig
from vjob.errors import CommandError, InputError, VjobError
from vjob.pilot_files import USER_DATA_DIR

TINY_IMAGE = "debian-tiny"
"""The tiny counter guest (provisioning.guest): the image vjob can always offer."""
TINY_MEMORY_MIB = 128
"""The counter guest's memory unless `vjob run --memory` says."""
REAL_MIN_MEMORY_MIB = GUEST_MIN_MEMORY_MIB
"""A Debian guest with Python needs more than the counter guest's 128 MiB (vjob.allocation)."""


def memory_ceiling(cfg: Config, asked_mib: int) -> int:
    """The most a one-VM vjob's balloon may later give it: with remapping on, the largest node
    kind's memory per slot of the farm file, at most 4 × what it asked (the agent sets the
    balloon per kind after a move, docs/remap.md), else what it asked (0). A farm file the
    pilot cannot read costs the job nothing but the growth: a warning, the VM keeps its memory."""
    if not cfg.remap.farm_file:
        return 0
    try:
        return domain_max_mib(asked_mib, load_subclusters(cfg.remap.farm_file))
    except VjobError as exc:
        log.get("pilot").warning("remap farm file unreadable: the VM cannot grow", error=str(exc))
        return 0


def partner_hold_s(cfg: Config) -> float:
    """How long a pilot holds its node for a VM a remapping swap lent it (pilot.pilot): only
    where remapping is on, since only the remap step releases a holding pilot."""
    return cfg.remap.partner_hold_s if cfg.remap.farm_file else 0.0


def user_provisioning(prov: ProvisioningConfig, node: str = "") -> ProvisioningConfig:
    """The provisioning settings of a pilot that is not root: the user's own libvirt.

    Why: a job runs as its user, who cannot use root's libvirt (qemu:///system) nor write its
    VM directories. With qemu:///session QEMU runs as the user, the VM's disks and memory
    states are the user's own files (under $XDG_DATA_HOME/vjob, normally on the shared home,
    so a resume on another node finds them), and no privilege is involved anywhere.
    With `user_vm_dir` they are on this node's own disk instead, and a resume elsewhere copies
    them from the node that saved them over ssh as the user (`hosts`, `copy_method`; `node`, the
    pilot's own, is this machine): found on two hosts sharing nothing but the home (issue 38).
    """
    if os.geteuid() == 0:
        return own_node(prov, node)
    if prov.user_vm_dir:
        base = user_vm_base(prov)
        hosts = {**prov.hosts, node: ""} if node else dict(prov.hosts)
        return prov.model_copy(
            update={
                "default_uri": "qemu:///session",
                "nodes": {},
                "vm_dir": str(base / "vms"),
                "snapshot_dir": str(base / "snapshots"),
                "hosts": hosts,
            }
        )
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) / "vjob" if xdg else Path.home() / USER_DATA_DIR
    return prov.model_copy(
        update={
            "default_uri": "qemu:///session",
            "nodes": {},
            "vm_dir": str(base / "vms"),
            "snapshot_dir": str(base / "snapshots"),
            "copy_method": "local",
        }
    )


def own_node(prov: ProvisioningConfig, node: str) -> ProvisioningConfig:
    """`prov` as the pilot running on `node` sees it: that node's files are on this machine
    (`hosts` maps it to ""), the other nodes' over ssh. Why: a root pilot on host A migrating
    its VM to host B copied its disks from "hosta" to "hostb", two remote ends, which rsync
    refuses (found with the remap swap across two hosts, issue 38)."""
    return prov.model_copy(update={"hosts": {**prov.hosts, node: ""}}) if node else prov


def user_vm_base(prov: ProvisioningConfig) -> Path:
    """This user's node-local directory under `user_vm_dir` (0700, made when missing).

    Why checked and not just made: its parent is shared by every user (mode 1777, like /tmp),
    so another user could have made the name first, or a symlink there to a directory of
    theirs, and would then read this user's VM memory and disks. It must be a real directory
    of this user (UnsafePathError otherwise, naming the path), and it is made private if it
    is not yet (a copy's `mkdir -p` may have made it with the default mode: it is ours, so
    tightening it is safe, and nobody can enter it afterwards)."""
    import pwd

    name = pwd.getpwuid(os.geteuid()).pw_name
    base = safe_dirs.ensure_dir(Path(prov.user_vm_dir.replace("{user}", name)), 0o700)
    if os.lstat(base).st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def node_local_session(prov: ProvisioningConfig) -> None:
    """Point the user's session libvirt (which the first connection starts) at this node's
    disk when `user_vm_dir` is set: its socket ($XDG_RUNTIME_DIR, else ~/.cache), domain
    definitions ($XDG_CONFIG_HOME) and logs ($XDG_CACHE_HOME) would otherwise be in the shared
    home, where another node's session daemon reads the same definitions and, on one
    machine, even answers on the same socket. Called after the job's environment was taken."""
    if os.geteuid() == 0 or not prov.user_vm_dir:
        return
    base = user_vm_base(prov) / "s"  # short: QEMU's monitor socket lives under XDG_CONFIG_HOME (108 bytes)
    for var, sub in (("XDG_RUNTIME_DIR", "r"), ("XDG_CONFIG_HOME", "c"), ("XDG_CACHE_HOME", "h")):
        (base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ[var] = str(base / sub)


def open_driver(cfg: Config, prov: ProvisioningConfig | None = None) -> Any:
    """The VM driver with `prov` (a user pilot's, user_provisioning) or the configuration's."""
    from provisioning.driver import Driver  # heavy: libvirt-python

    node_local_session(cfg.provisioning)

    return Driver(prov or cfg.provisioning, data_dir=cfg.data_path)


def known_images(cfg: Config, node: str) -> list[str]:
    """The images this node holds, for the message that refuses an unknown one."""
    directory = images.node_image_dir(cfg.provisioning, cfg.data_path, node)
    try:
        names = [
            p.name[: -len(images.INDEX_SUFFIX)] for p in directory.iterdir() if p.name.endswith(images.INDEX_SUFFIX)
        ]
    except OSError:
        names = []
    return sorted({TINY_IMAGE, *names})


def check_image(image: str, cfg: Config | None = None, node: str = "") -> images.LocalImage | None:
    """The image as this node holds it (None for the counter guest); refused before anything
    is started when the node does not hold it."""
    if image == TINY_IMAGE:
        return None
    local = images.local_image(cfg.provisioning, cfg.data_path, node, image) if cfg is not None else None
    if local is None or local.kernel is None or local.initrd is None:
        known = ", ".join(known_images(cfg, node)) if cfg is not None else TINY_IMAGE
        raise InputError(f"OS image {image!r}: unknown on this node; known images: {known}")
    return local


def real_spec(
    local: images.LocalImage, vm: str, memory_mib: int, disk: Path, *, cpu_model: str = "", vcpus: int = 1
) -> Any:
    """The VMSpec of a real job: the image's own kernel and initrd, its job disk, output ports;
    `vcpus` and `memory_mib` as pilot.sizing chose them from the allocation."""
    from provisioning.driver import VMSpec  # heavy: libvirt-python

    return VMSpec(
        name=vm,
        image=local.path,
        image_format=local.format,
        memory_mib=memory_mib,
        vcpus=vcpus,
        kernel=local.kernel,
        initrd=local.initrd,
        cmdline=local.cmdline,
        job_disk=disk,
        output_ports=True,
        cpu_model=cpu_model,
    )


def guest_spec(image: str, vm: str, memory_mib: int, payload: str | None, *, qemu_user: str = "libvirt-qemu") -> Any:
    """The VMSpec of `image` (today the tiny counter guest, the one image vjob ships)."""
    from provisioning.driver import VMSpec  # heavy: libvirt-python

    check_image(image)
    files = guest.build(payload, qemu_user=qemu_user)
    base = files.kernel.parent / "base-64M.qcow2"
    if not base.exists():
        tmp = base.with_name(f".{base.name}.{os.getpid()}")
        try:
            subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", str(tmp), "64M"],
                check=True,
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise CommandError(["qemu-img", "create"], f"cannot create the base disk {base}: {exc}") from None
        os.chmod(tmp, 0o644)
        os.replace(tmp, base)
    return VMSpec(
        name=vm, image=base, memory_mib=memory_mib, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline
    )
