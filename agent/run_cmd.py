"""`vjob run`: the pilot, as a job's command inside its RMS allocation (see agent.pilot).

    #!/bin/bash
    #SBATCH -N1 --exclusive
    #VJOB os=debian-tiny
    vjob run                      # or: vjob run --os debian-tiny --payload work.sh

The job id and node come from the RMS's environment (the variables its adapter declares,
plugins.job_environment: SLURM_JOB_ID and SLURMD_NODENAME; PBS and OAR equivalents), or
--job-id/--node. The OS image comes from --os, $VJOB_OS, or the
`#VJOB os=NAME` line of the job's script (already validated by job_submit.lua at submission).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from agent.pilot import DriverVM, Pilot, PilotSettings
from plugins import RMS_PACKAGES, job_environment
from plugins.slurm.images import requested_image
from provisioning import guest
from vjob.cli import load_config
from vjob.config import Config
from vjob.errors import CommandError, InputError, UsageError
from vjob.pilot_files import PilotDir, pilot_root, vm_name
from vjob.rms import JobEnvironment

TINY_IMAGE = "debian-tiny"
"""The tiny counter guest (provisioning.guest): the image vjob can always offer."""


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the in-job pilot: run this job inside a VM that survives checkpoints")
    p.add_argument("--rms", choices=sorted(RMS_PACKAGES), default="slurm")
    p.add_argument("--job-id", help="the RMS job id (default: from the job's environment)")
    p.add_argument("--node", help="the RMS node name (default: from the job's environment)")
    p.add_argument("--os", dest="os_image", help="OS image (default: $VJOB_OS or the script's #VJOB os= line)")
    p.add_argument("--memory", type=int, default=128, metavar="MIB", help="VM memory in MiB (default 128)")
    p.add_argument("--payload", metavar="FILE", help="shell script the guest runs instead of its counter")
    p.add_argument(
        "--orphan-resume",
        type=float,
        default=30.0,
        metavar="S",
        help="after a save the agent asked for, resume here if not requeued within S seconds",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    env = job_environment(args.rms)
    job_id = args.job_id or env.job_id_from(os.environ)
    if not job_id:
        raise UsageError(f"vjob run: no job id: run inside a {args.rms} job (${env.job_id}) or give --job-id")
    node = args.node or os.environ.get(env.node_name) or socket.gethostname().split(".")[0]
    image = args.os_image or os.environ.get("VJOB_OS") or _script_image(env) or TINY_IMAGE
    if args.memory < 72:
        raise InputError(f"--memory {args.memory}: must be at least 72 MiB (the guest kernel's floor)")
    payload = None
    if args.payload:
        try:
            payload = Path(args.payload).read_text()
        except OSError as exc:
            raise InputError(f"--payload {args.payload}: cannot read: {exc.strerror}") from None
    check_image(image)
    name = vm_name(args.rms, job_id)
    settings = PilotSettings(
        rms=args.rms, job_id=job_id, node=node, image=image, memory_mb=args.memory,
        orphan_resume_s=args.orphan_resume, restart_count=_restart_count(args, env),
    )  # fmt: skip
    driver = _driver(cfg)
    try:
        vm = DriverVM(
            driver,
            name,
            node,
            lambda: guest_spec(image, name, args.memory, payload, qemu_user=cfg.provisioning.qemu_user),
        )
        return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vm).run()
    finally:
        driver.close()


def _restart_count(args: argparse.Namespace, env: JobEnvironment) -> int | None:
    """How often the RMS restarted this job; None when we cannot know (--job-id given by hand
    outside a job, or an RMS that exports no restart counter)."""
    in_job = not args.job_id and bool(env.job_id_from(os.environ))
    return env.restarts_from(os.environ, in_job=in_job)


def _driver(cfg: Config) -> Any:
    from provisioning.driver import Driver  # heavy: libvirt-python

    return Driver(cfg.provisioning, data_dir=cfg.data_path)


def check_image(image: str) -> str:
    """Refuse an image this node cannot run before anything is started."""
    if image != TINY_IMAGE:
        raise InputError(f"OS image {image!r}: unknown on this node; known images: {TINY_IMAGE}")
    return image


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
                check=True, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            raise CommandError(["qemu-img", "create"], f"cannot create the base disk {base}: {exc}") from None
        os.chmod(tmp, 0o644)
        os.replace(tmp, base)
    return VMSpec(
        name=vm, image=base, memory_mib=memory_mib, kernel=files.kernel, initrd=files.initrd, cmdline=files.cmdline
    )


def _script_image(env: JobEnvironment) -> str:
    """The `#VJOB os=` line of the job's batch script (the file our parent shell runs)."""
    if env.script_name is None:
        return ""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    for arg in argv[1:]:
        path = Path(arg.decode(errors="replace"))
        if path.name == env.script_name and path.is_file():
            return requested_image(script=path.read_text(errors="replace"))
    return ""
