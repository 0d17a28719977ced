"""`vjob run`: the pilot, as a job's command inside its RMS allocation (see agent.pilot).

    #!/bin/bash
    #SBATCH -N1 --exclusive
    #VJOB os=debian-tiny
    vjob run                      # or: vjob run --os debian-tiny --payload work.sh

A real job (docs/realjobs.md) runs an unchanged script in a Debian guest of the catalogue:

    vjob run --os debian12 --script job.sh -- arg1 arg2
    vjob run --os debian12 --script - --base64 < job.b64     # what job_submit.lua's wrapper does

The job id and node come from the RMS's environment (the variables its adapter declares,
plugins.job_environment: SLURM_JOB_ID and SLURMD_NODENAME; PBS and OAR equivalents), or
--job-id/--node. The OS image comes from --os, $VJOB_OS, or the
`#VJOB os=NAME` line of the job's script (already validated by job_submit.lua at submission).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import os
import pwd
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent import member_launch, member_link, member_workdir
from agent.member_leader import Members
from agent.pilot import DriverVM, Pilot, PilotSettings, empty_file
from agent.pilot_member import Member
from agent.pilot_multinode import JobVMs, network_of
from plugins import RMS_PACKAGES, job_environment
from plugins.slurm import hostlist
from plugins.slurm.images import requested_image
from preemption.remap.farm import load_subclusters
from preemption.remap.memory import domain_max_mib
from provisioning import guest, images, job_disk, network, safe_dirs
from provisioning.vm_types import Nic
from vjob import log
from vjob.cli import load_config
from vjob.config import Config, ProvisioningConfig
from vjob.errors import CommandError, InputError, UsageError, VjobError
from vjob.pilot_files import PilotDir, pilot_root, vm_name, vm_names
from vjob.rms import JobEnvironment

TINY_IMAGE = "debian-tiny"
"""The tiny counter guest (provisioning.guest): the image vjob can always offer."""
REAL_MIN_MEMORY_MIB = 256
"""A Debian guest with Python needs more than the counter guest's 128 MiB."""
MAX_SCRIPT_READ = 8 << 20
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
HOST_NAME = member_launch.NODE_NAME


RUN_EPILOG = """\
examples:
  vjob run                                         in a job script: image from #VJOB os= or $VJOB_OS
  vjob run --os debian12 --script job.sh -- a b     the unchanged job.sh in a Debian guest, args a b
  vjob run --os debian-tiny --payload work.sh       the counter guest runs work.sh
  vjob run --rms pbs --memory 512 --script job.sh   under PBS, a 512 MiB guest

The job id and node come from the RMS's environment (e.g. SLURM_JOB_ID, SLURMD_NODENAME);
see docs/realjobs.md."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="the in-job pilot: run this job inside a VM that survives checkpoints",
        description="Run as a job's command inside its RMS allocation: start the job's VM (the tiny\n"
        "counter guest, or a catalogue image running the job's script unchanged), resume it from its\n"
        "snapshot after a requeue, save it when the agent checkpoints the job, and exit with the\n"
        "script's status. Normally started by the RMS hook (job_submit.lua, the PBS hook), not by hand.",
        epilog=RUN_EPILOG,
    )
    p.add_argument(
        "--rms", choices=sorted(RMS_PACKAGES), default="slurm", help="the RMS running this job (default slurm)"
    )
    p.add_argument("--job-id", help="the RMS job id (default: from the job's environment)")
    p.add_argument("--node", help="the RMS node name (default: from the job's environment)")
    p.add_argument(
        "--nodes",
        help="a multi-node job's nodes, comma-separated (default: the job's node list: one VM per node;"
        " the counter guest is one VM unless --nodes names several)",
    )
    p.add_argument("--os", dest="os_image", help="OS image (default: $VJOB_OS or the script's #VJOB os= line)")
    p.add_argument(
        "--memory",
        type=int,
        default=128,
        metavar="MIB",
        help="VM memory in MiB (default 128, at least 72; a real image gets at least 256)",
    )
    p.add_argument("--payload", metavar="FILE", help="shell script the guest runs instead of its counter")
    p.add_argument(
        "--script", metavar="FILE", help="real image: the job's script, run unchanged in the guest ('-': stdin)"
    )
    p.add_argument("--base64", action="store_true", help="the script is base64 (the Slurm wrapper's encoding)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    p.add_argument(
        "--member",
        action="store_true",
        help="a member pilot of a multi-node job, started by the first node's pilot (Slurm: srun, the leader's"
        f" address and token in ${member_link.LEADER_ENV} and ${member_link.TOKEN_ENV}; OAR: oarsh, one line on"
        " stdin; PBS: pbsdsh, --leader and --nonce, the token from $PBS_JOBCOOKIE)",
    )
    p.add_argument(
        "--leader", metavar="HOST:PORT", help="with --member under PBS: the leader's address (put there by its pbsdsh)"
    )
    p.add_argument(
        "--nonce", metavar="HEX", help="with --member under PBS: the nonce the job's token is derived from (not secret)"
    )
    p.add_argument(
        "--orphan-resume",
        type=float,
        default=30.0,
        metavar="S",
        help="after a save the agent asked for, resume here if not requeued within S seconds (default 30)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    env = job_environment(args.rms)
    job_id = args.job_id or env.job_id_from(os.environ)
    if not job_id:
        raise UsageError(f"vjob run: no job id: run inside a {args.rms} job (${env.job_id}) or give --job-id")
    node = args.node or os.environ.get(env.node_name) or socket.gethostname().split(".")[0]
    if args.member:
        return _run_member(cfg, args, node)
    image = args.os_image or os.environ.get("VJOB_OS") or _script_image(env) or TINY_IMAGE
    if args.memory < 72:
        raise InputError(f"--memory {args.memory}: must be at least 72 MiB (the guest kernel's floor)")
    payload = None
    if args.payload:
        try:
            payload = Path(args.payload).read_text()
        except OSError as exc:
            raise InputError(f"--payload {args.payload}: cannot read: {exc.strerror}") from None
    name = vm_name(args.rms, job_id)
    if image == TINY_IMAGE:
        return _run_tiny(args, cfg, env, job_id, node, name, payload)
    local = check_image(image, cfg, node)
    prov = user_provisioning(cfg.provisioning)
    script = _read_script(args)
    workdir = Path.cwd()
    job_disk.measure(workdir, prov.stage_limit_mb * 2**20)  # refused before anything starts
    job = job_description(script, _script_args(args.args), node)
    settings = PilotSettings(
        rms=args.rms, job_id=job_id, node=node, image=image, memory_mb=max(args.memory, REAL_MIN_MEMORY_MIB),
        orphan_resume_s=args.orphan_resume, restart_count=_restart_count(args, env), workdir=workdir,
        partner_hold_s=partner_hold_s(cfg),
    )  # fmt: skip
    driver = _driver(cfg, prov)
    nodes = _job_nodes(args, env, node)
    if len(nodes) > 1:
        try:
            return _run_multinode(args, cfg, prov, driver, settings, job, local, nodes)
        finally:
            driver.close()
    try:

        def spec() -> Any:
            disk = driver.job_disk_path(name, node)
            safe_dirs.ensure_dir(disk.parent, 0o711)
            job_disk.build(workdir, job, disk, limit_bytes=prov.stage_limit_mb * 2**20,
                           free_bytes=prov.job_disk_free_mb * 2**20)  # fmt: skip
            own = real_spec(local, name, settings.memory_mb, disk, cpu_model=prov.cpu_model)
            return dataclasses.replace(own, max_memory_mib=memory_ceiling(cfg, settings.memory_mb))

        vm = DriverVM(driver, name, node, spec)
        return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vm).run()
    finally:
        driver.close()


def _run_tiny(
    args: argparse.Namespace, cfg: Config, env: JobEnvironment, job_id: str, node: str, name: str, payload: str | None
) -> int:
    settings = PilotSettings(
        rms=args.rms, job_id=job_id, node=node, image=TINY_IMAGE, memory_mb=args.memory,
        orphan_resume_s=args.orphan_resume, restart_count=_restart_count(args, env),
        partner_hold_s=partner_hold_s(cfg),
    )  # fmt: skip
    driver = _driver(cfg)
    try:
        # The counter guest is one VM unless --nodes names several (it has no network stack; a
        # multi-node counter job is how the test driver exercises agent.pilot_multinode).
        nodes = _job_nodes(args, env, node) if args.nodes else [node]
        if len(nodes) > 1:
            subnet = network.pilot_subnet_id(args.rms, job_id)
            vms = JobVMs(driver, name, nodes, subnet, lambda _rank, vm, _node: guest_spec(
                TINY_IMAGE, vm, args.memory, payload, qemu_user=cfg.provisioning.qemu_user))  # fmt: skip
            return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vms).run()  # type: ignore[arg-type]
        vm = DriverVM(
            driver,
            name,
            node,
            lambda: dataclasses.replace(
                guest_spec(TINY_IMAGE, name, args.memory, payload, qemu_user=cfg.provisioning.qemu_user),
                max_memory_mib=memory_ceiling(cfg, args.memory),
            ),
        )
        return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vm).run()
    finally:
        driver.close()


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


def _run_multinode(
    args: argparse.Namespace,
    cfg: Config,
    prov: ProvisioningConfig,
    driver: Any,
    settings: PilotSettings,
    job: job_disk.JobDescription,
    local: images.LocalImage,
    nodes: list[str],
) -> int:
    """One VM per node on the job's network (agent.pilot_multinode); the first runs the script."""
    name = vm_name(args.rms, settings.job_id)
    names = vm_names(args.rms, settings.job_id, len(nodes))
    addresses = network.pilot_addresses(args.rms, settings.job_id, names)
    keys: list[tuple[str, str]] = []

    def spec(rank: int, vm: str, node: str) -> Any:
        if not keys:  # one key for the job, made at its first boot only
            keys.append(network.job_ssh_key(f"vjob-{args.rms}-{settings.job_id}"))
        disk = driver.job_disk_path(vm, node)
        safe_dirs.ensure_dir(disk.parent, 0o711)
        mine = dataclasses.replace(job, hostname=f"vm{rank}", network=network_of(addresses, rank, keys[0]))
        job_disk.build(settings.workdir or Path.cwd(), mine, disk, limit_bytes=prov.stage_limit_mb * 2**20,
                       free_bytes=prov.job_disk_free_mb * 2**20)  # fmt: skip
        nics = (Nic(addresses[rank].mac, network.bridge_name(addresses[rank].subnet_id)),)
        return dataclasses.replace(real_spec(local, vm, settings.memory_mb, disk, cpu_model=prov.cpu_model), nics=nics)

    pdir = PilotDir(pilot_root(cfg), args.rms, settings.job_id)
    if cfg.agent.multinode_pilots == "leader":
        vms = JobVMs(driver, name, nodes, addresses[0].subnet_id, spec)
        return Pilot(settings, pdir, vms).run()  # type: ignore[arg-type]
    secret = member_launch.leader_secret(args.rms, os.environ)  # refuses an RMS without a launcher

    def describe(rank: int) -> dict[str, Any]:
        """What member `rank` builds its VM from: never the script, which only rank 0 runs."""
        if not keys:
            keys.append(network.job_ssh_key(f"vjob-{args.rms}-{settings.job_id}"))
        mine = dataclasses.replace(job, script=b"", hostname=f"vm{rank}", network=network_of(addresses, rank, keys[0]))
        fields = {k: v for k, v in mine.__dict__.items() if k not in ("script", "skipped")}
        return {"image": settings.image, "memory_mb": settings.memory_mb, "job": fields}

    replay = empty_file(sys.stdout)  # before the members' first log lines reach the job's output
    members = Members(nodes[1:], host=cfg.agent.member_address, secret=secret)
    try:
        members.launch(args.rms, config=getattr(args, "config", None) or os.environ.get("VJOB_CONFIG"),
                       node_file=_node_file(args.rms) if args.rms == "pbs" else ())  # fmt: skip
        members.join()
        remotes = members.vms(names[1:], addresses[0].subnet_id, driver,
                              prov.operation_timeout_s)  # fmt: skip
        vms = JobVMs(driver, name, nodes, addresses[0].subnet_id, spec, remotes, describe)
        return Pilot(settings, pdir, vms, replay=replay).run()  # type: ignore[arg-type]
    finally:
        members.close()


def _run_member(cfg: Config, args: argparse.Namespace, node: str) -> int:
    """A member pilot: connect to its leader, learnt the way its RMS's launcher passes it
    (agent.member_launch), then obey it (agent.pilot_member)."""
    call = member_launch.calling(args.rms, os.environ, node, leader=args.leader or "", nonce=args.nonce or "")
    node = call.node
    os.environ.pop(member_link.TOKEN_ENV, None)  # nothing this process starts needs it
    prov = user_provisioning(cfg.provisioning)
    link = member_link.connect(call.leader, call.token, node)
    driver = _driver(cfg, prov)

    def spec(msg: dict[str, Any], vm: str, rank: int, workdir: Path | None) -> Any:
        """`workdir` None: the leader built and sent the job disk (agent.member_workdir)."""
        job = member_job(msg.get("job"))
        local = check_image(str(msg.get("image", "")), cfg, node)
        memory = msg.get("memory_mb")
        if not isinstance(memory, int) or isinstance(memory, bool) or not REAL_MIN_MEMORY_MIB <= memory <= 1 << 22:
            raise InputError(f"memory_mb = {str(memory)[:20]!r}: must be MiB, at least {REAL_MIN_MEMORY_MIB}")
        disk = driver.job_disk_path(vm, node)
        safe_dirs.ensure_dir(disk.parent, 0o711)
        if workdir is not None:
            job_disk.build(workdir, job, disk, limit_bytes=prov.stage_limit_mb * 2**20,
                           free_bytes=prov.job_disk_free_mb * 2**20)  # fmt: skip
        if local is None or job.network is None:
            raise InputError(f"image = {msg.get('image')!r}: a member pilot runs a real image on the job's network")
        nics = (Nic(str(job.network["mac"]), str(msg["bridge"])),)
        return dataclasses.replace(real_spec(local, vm, memory, disk, cpu_model=prov.cpu_model), nics=nics)

    try:
        return Member(link, driver, node, spec, member_workdir.own_workdir()).serve()
    finally:
        driver.close()


def member_job(data: object) -> job_disk.JobDescription:
    """A member's job description from its leader: every field typed, the user this process's."""
    if not isinstance(data, dict):
        raise InputError("job: must be an object")
    try:
        job = job_disk.JobDescription(
            script=b"", args=[str(a) for a in data["args"]], env={str(k): str(v) for k, v in data["env"].items()},
            uid=int(data["uid"]), gid=int(data["gid"]), user=str(data["user"]), home=str(data["home"]),
            cwd=str(data["cwd"]), hostname=str(data["hostname"]), network=dict(data["network"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"job: a field is missing or mistyped: {exc}") from None
    if job.uid != os.getuid():
        raise InputError(f"job.uid = {job.uid}: this member pilot runs as uid {os.getuid()}")
    return job_disk.check_description(job)


def _job_nodes(args: argparse.Namespace, env: JobEnvironment, node: str) -> list[str]:
    """The allocation's nodes, this one first (it runs the script): --nodes, else the RMS's list
    (Slurm: the hostlist in $SLURM_JOB_NODELIST; PBS, OAR: the node file, one line per slot)."""
    if args.nodes:
        names = [n.strip() for n in args.nodes.split(",") if n.strip()]
    elif args.rms == "slurm":
        raw = os.environ.get(env.node_list, "")
        names = list(hostlist.expand(raw, f"${env.node_list}")) if raw else []
    else:
        names = [member_launch.short_name(line) for line in _node_file(args.rms) if line.strip()]
    for n in names:
        if not HOST_NAME.fullmatch(n):
            raise InputError(f"node list: {n[:80]!r} is not a node name")
    unique = list(dict.fromkeys(names))
    if len(unique) <= 1:
        return [node]  # a job of one node, whatever name the RMS's list gives it
    if node not in unique:
        raise InputError(f"node {node}: not in the job's node list {','.join(unique)[:200]}; give --node or --nodes")
    return [node, *(n for n in unique if n != node)]


def _node_file(rms: str) -> list[str]:
    """The RMS's node file, one line per slot (PBS: line i is TM's node i, pbsdsh -n's index)."""
    var = job_environment(rms).node_list
    try:
        return Path(os.environ.get(var, "")).read_text().splitlines() if os.environ.get(var) else []
    except OSError as exc:
        raise InputError(f"${var}: cannot read the node file: {exc.strerror}") from None


def partner_hold_s(cfg: Config) -> float:
    """How long a pilot holds its node for a VM a remapping swap lent it (agent.pilot): only
    where remapping is on, since only the remap step releases a holding pilot."""
    return cfg.remap.partner_hold_s if cfg.remap.farm_file else 0.0


def user_provisioning(prov: ProvisioningConfig) -> ProvisioningConfig:
    """The provisioning settings of a pilot that is not root: the user's own libvirt.

    Why: a job runs as its user, who cannot use root's libvirt (qemu:///system) nor write its
    VM directories. With qemu:///session QEMU runs as the user, the VM's disks and memory
    states are the user's own files (under $XDG_DATA_HOME/vjob, normally on the shared home,
    so a resume on another node finds them), and no privilege is involved anywhere.
    """
    if os.geteuid() == 0:
        return prov
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "vjob"
    return prov.model_copy(
        update={"default_uri": "qemu:///session", "nodes": {}, "vm_dir": str(base / "vms"),
                "snapshot_dir": str(base / "snapshots"), "copy_method": "local"}
    )  # fmt: skip


def _read_script(args: argparse.Namespace) -> bytes:
    if not args.script:
        raise UsageError("vjob run: a real image runs a script: give --script FILE (or - for stdin)")
    try:
        data = sys.stdin.buffer.read(MAX_SCRIPT_READ) if args.script == "-" else Path(args.script).read_bytes()
    except OSError as exc:
        raise InputError(f"--script {args.script}: cannot read: {exc.strerror}") from None
    if args.base64:
        try:
            data = base64.b64decode(b"".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"--script {args.script}: not valid base64") from None
    return data


def _script_args(raw: list[str]) -> list[str]:
    return raw[1:] if raw and raw[0] == "--" else list(raw)


def job_description(script: bytes, args: list[str], node: str) -> job_disk.JobDescription:
    """The job as the guest agent runs it: this process's user (the kernel's word, not the
    environment's), its working directory, environment and the node name as host name."""
    uid, gid = os.getuid(), os.getgid()
    try:
        pw = pwd.getpwuid(uid)
        user, home = pw.pw_name, os.path.normpath(pw.pw_dir or "/")
    except KeyError:
        user, home = f"u{uid}", "/"
    if not USER_NAME.fullmatch(user):
        user = f"u{uid}"
    if home == "/":
        home = f"/home/{user}"
    env = {k: v for k, v in os.environ.items() if ENV_NAME.fullmatch(k) and "\0" not in v}
    env.update({"VJOB_IMAGE_GUEST": "1", "VJOB_NODE": node})
    host = node if HOST_NAME.fullmatch(node) else "vjob"
    job = job_disk.JobDescription(script=script, args=args, env=env, uid=uid, gid=gid, user=user, home=home,
                                  cwd=os.path.normpath(os.getcwd()), hostname=host)  # fmt: skip
    return job_disk.check_description(job)


def _restart_count(args: argparse.Namespace, env: JobEnvironment) -> int | None:
    """How often the RMS restarted this job; None when we cannot know (--job-id given by hand
    outside a job, or an RMS that exports no restart counter)."""
    in_job = not args.job_id and bool(env.job_id_from(os.environ))
    return env.restarts_from(os.environ, in_job=in_job)


def _driver(cfg: Config, prov: ProvisioningConfig | None = None) -> Any:
    from provisioning.driver import Driver  # heavy: libvirt-python

    return Driver(prov or cfg.provisioning, data_dir=cfg.data_path)


def known_images(cfg: Config, node: str) -> list[str]:
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


def real_spec(local: images.LocalImage, vm: str, memory_mib: int, disk: Path, *, cpu_model: str = "") -> Any:
    """The VMSpec of a real job: the image's own kernel and initrd, its job disk, output ports."""
    from provisioning.driver import VMSpec  # heavy: libvirt-python

    return VMSpec(
        name=vm, image=local.path, image_format=local.format, memory_mib=memory_mib, kernel=local.kernel,
        initrd=local.initrd, cmdline=local.cmdline, job_disk=disk, output_ports=True, cpu_model=cpu_model,
    )  # fmt: skip


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
