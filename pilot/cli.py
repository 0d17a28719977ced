"""`vjob run`: the pilot, as a job's command inside its RMS allocation (see pilot.pilot).

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
The options are declared in pilot.run_args, which imports this module only when `vjob run` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from pathlib import Path
from typing import Any

from pilot import site_mounts, site_network
from pilot.job import job_description, job_nodes, member_job, read_script, restart_count, script_args, script_image
from pilot.members import workdir as member_workdir
from pilot.members.launch import check_user_network, launcher, pilots_mode
from pilot.members.leader import Members
from pilot.members.link import connect
from pilot.members.member import Member
from pilot.multinode import JobVMs, network_of
from pilot.output import empty_file
from pilot.pilot import Pilot
from pilot.settings import PilotSettings
from pilot.sizing import VMSize, choose
from pilot.specs import (
    REAL_MIN_MEMORY_MIB,
    TINY_IMAGE,
    TINY_MEMORY_MIB,
    check_image,
    guest_spec,
    memory_ceiling,
    open_driver,
    own_node,
    partner_hold_s,
    real_spec,
    user_provisioning,
)
from pilot.usage import for_pilot
from pilot.vm import DriverVM
from plugins import job_allocations, job_environment
from plugins.member_launch import TOKEN_ENV
from provisioning import images, job_disk, network, safe_dirs
from provisioning.vm_types import Nic
from vjob.allocation import MAX_CPUS, MAX_MEMORY_MIB
from vjob.cli import load_config
from vjob.config import Config, ProvisioningConfig
from vjob.errors import InputError, UsageError
from vjob.pilot_files import PilotDir, pilot_root, vm_name, vm_names
from vjob.rms import JobEnvironment


def _build_disk(prov: ProvisioningConfig, workdir: Path, job: job_disk.JobDescription, disk: Path) -> None:
    """The VM's job disk from `workdir`, within the site's staging limit and free-space margin:
    one call for the one-node, leader and member VMs alike."""
    job_disk.build(
        workdir, job, disk, limit_bytes=prov.stage_limit_mb * 2**20, free_bytes=prov.job_disk_free_mb * 2**20
    )


def run(args: argparse.Namespace) -> int:
    """`vjob run` (its arguments: pilot.run_args)."""
    cfg = load_config(args)
    env = job_environment(args.rms)
    job_id = args.job_id or env.job_id_from(os.environ)
    if not job_id:
        raise UsageError(f"vjob run: no job id: run inside a {args.rms} job (${env.job_id}) or give --job-id")
    node = args.node or os.environ.get(env.node_name) or socket.gethostname().split(".")[0]
    if args.member:
        return _run_member(cfg, args, node, job_id)
    image = args.os_image or os.environ.get("VJOB_OS") or script_image(env) or TINY_IMAGE
    if args.memory is not None and args.memory < 72:
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
    return _run_real(args, cfg, env, job_id, node, name, image)


def _sizes(args: argparse.Namespace, prov: ProvisioningConfig, node: str, nodes: list[str]) -> dict[str, VMSize]:
    """The VM of this `node` and of each of `nodes`, from what the RMS allocated there
    (pilot.sizing; refused when one cannot fit)."""
    allocs = job_allocations(args.rms, os.environ, node)
    return {
        n: choose(
            allocs.get(n),
            node=n,
            asked_cpus=args.cpus,
            asked_memory=args.memory,
            overhead_mib=prov.vm_overhead_mib,
            floor_mib=REAL_MIN_MEMORY_MIB,
            default_mib=REAL_MIN_MEMORY_MIB,
        )
        for n in dict.fromkeys([node, *nodes])
    }


def _run_real(
    args: argparse.Namespace, cfg: Config, env: JobEnvironment, job_id: str, node: str, name: str, image: str
) -> int:
    """A catalogue image running the job's unchanged script: one VM, or one per node."""
    # Whether the RMS's output file is fresh or truncated by a requeue (the pilot then copies
    # the guest's output again, pilot.pilot): looked at before the sizing's log lines reach it.
    replay = empty_file(sys.stdout)
    prov = user_provisioning(cfg.provisioning, node)
    nodes = job_nodes(args.rms, args.nodes, node)
    sizes = _sizes(args, prov, node, nodes)  # a job no VM can honour is refused first, before anything starts
    local = check_image(image, cfg, node)
    script = read_script(args.script, args.base64)
    workdir = Path.cwd()
    job = site_mounts.with_mounts(cfg, args.rms, job_id, job_description(script, script_args(args.args), node))
    if not job.in_place:  # a working directory on the site's filesystems is not staged (pilot.site_mounts)
        job_disk.measure(workdir, prov.stage_limit_mb * 2**20)  # refused before anything starts
    settings = PilotSettings(
        rms=args.rms,
        job_id=job_id,
        node=node,
        image=image,
        memory_mb=sizes[node].memory_mib,
        vcpus=sizes[node].vcpus,
        orphan_resume_s=args.orphan_resume,
        restart_count=restart_count(bool(args.job_id), env),
        workdir=workdir,
        partner_hold_s=partner_hold_s(cfg),
        config_path=getattr(args, "config", None) or "",  # for the processes it starts (pilot.pause_drain)
    )
    driver = open_driver(cfg, prov)
    if len(nodes) > 1:
        try:
            return _run_multinode(args, cfg, prov, driver, settings, job, local, nodes, sizes, replay)
        finally:
            driver.close()
    try:
        site = site_network.SiteLink(cfg, args.rms, job_id, node, [1])  # the one VM: vmID 1 on the job's /24

        def spec() -> Any:
            disk = driver.job_disk_path(name, node)
            safe_dirs.ensure_dir(disk.parent, 0o711)
            nic = site.nic(1)
            mine = dataclasses.replace(job, network=site_network.one_vm_network(nic, job.hostname)) if nic else job
            _build_disk(prov, workdir, mine, disk)
            own = real_spec(local, name, settings.memory_mb, disk, cpu_model=prov.cpu_model, vcpus=settings.vcpus)
            nics = site_network.domain_nics(nic) if nic else ()
            return dataclasses.replace(own, max_memory_mib=memory_ceiling(cfg, settings.memory_mb), nics=nics)

        vm = DriverVM(driver, name, node, spec, site)
        return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vm, replay=replay).run()
    finally:
        driver.close()


def _run_tiny(
    args: argparse.Namespace, cfg: Config, env: JobEnvironment, job_id: str, node: str, name: str, payload: str | None
) -> int:
    """The counter guest: one VM unless --nodes names several; a test device, not a user's job, so
    it keeps --memory (default 128) and one vCPU whatever the allocation (pilot.sizing is for
    real images)."""
    memory = args.memory or TINY_MEMORY_MIB
    settings = PilotSettings(
        rms=args.rms,
        job_id=job_id,
        node=node,
        image=TINY_IMAGE,
        memory_mb=memory,
        orphan_resume_s=args.orphan_resume,
        restart_count=restart_count(bool(args.job_id), env),
        partner_hold_s=partner_hold_s(cfg),
        config_path=getattr(args, "config", None) or "",  # for the processes it starts (pilot.pause_drain)
    )
    driver = open_driver(cfg, own_node(cfg.provisioning, node))
    qemu_user = cfg.provisioning.qemu_user
    try:
        # The counter guest is one VM unless --nodes names several (it has no network stack; a
        # multi-node counter job is how the test driver exercises pilot.multinode).
        nodes = job_nodes(args.rms, args.nodes, node) if args.nodes else [node]
        if len(nodes) > 1:
            subnet = network.pilot_subnet_id(args.rms, job_id)
            vms = JobVMs(
                driver,
                name,
                nodes,
                subnet,
                lambda _rank, vm, _node: guest_spec(TINY_IMAGE, vm, memory, payload, qemu_user=qemu_user),
            )
            return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vms).run()  # type: ignore[arg-type]
        vm = DriverVM(
            driver,
            name,
            node,
            lambda: dataclasses.replace(
                guest_spec(TINY_IMAGE, name, memory, payload, qemu_user=qemu_user),
                max_memory_mib=memory_ceiling(cfg, memory),
            ),
        )
        return Pilot(settings, PilotDir(pilot_root(cfg), args.rms, job_id), vm).run()
    finally:
        driver.close()


def _run_multinode(
    args: argparse.Namespace,
    cfg: Config,
    prov: ProvisioningConfig,
    driver: Any,
    settings: PilotSettings,
    job: job_disk.JobDescription,
    local: images.LocalImage,
    nodes: list[str],
    sizes: dict[str, VMSize],
    replay: bool,
) -> int:
    """One VM per node on the job's network (pilot.multinode); the first runs the script."""
    name = vm_name(args.rms, settings.job_id)
    names = vm_names(args.rms, settings.job_id, len(nodes))
    addresses = network.pilot_addresses(args.rms, settings.job_id, names)
    keys: list[tuple[str, str]] = []

    def key() -> tuple[str, str]:
        if not keys:  # one key for the job, made at its first boot only
            keys.append(network.job_ssh_key(f"vjob-{args.rms}-{settings.job_id}"))
        return keys[0]

    site = site_network.SiteLink(cfg, args.rms, settings.job_id, settings.node, [1])  # rank 0's VM, this node's

    def spec(rank: int, vm: str, node: str) -> Any:
        ssh = key()
        disk = driver.job_disk_path(vm, node)
        safe_dirs.ensure_dir(disk.parent, 0o711)
        nic = site.nic(1) if rank == 0 and node == settings.node else None
        net = network_of(addresses, rank, ssh)
        mine = dataclasses.replace(job, hostname=f"vm{rank}", network=site_network.with_site(net, nic) if nic else net)
        _build_disk(prov, settings.workdir or Path.cwd(), mine, disk)
        nics = (Nic(addresses[rank].mac, network.bridge_name(addresses[rank].subnet_id)),)
        nics = site_network.domain_nics(nic) if nic else nics
        size = sizes[node]
        own = real_spec(local, vm, size.memory_mib, disk, cpu_model=prov.cpu_model, vcpus=size.vcpus)
        return dataclasses.replace(own, nics=nics)

    pdir = PilotDir(pilot_root(cfg), args.rms, settings.job_id)
    check_user_network(os.geteuid(), site.enabled)  # before any member starts
    if pilots_mode(cfg.agent.multinode_pilots, os.geteuid()) == "leader":  # a user's job: per-node
        vms = JobVMs(driver, name, nodes, addresses[0].subnet_id, spec, site=site)
        return Pilot(settings, pdir, vms, replay=replay).run()  # type: ignore[arg-type]
    secret = launcher(args.rms).leader_secret(os.environ)  # refuses an RMS without a launcher

    def describe(rank: int) -> dict[str, Any]:
        """What member `rank` builds its VM from: never the script, which only rank 0 runs."""
        ssh = key()
        mine = dataclasses.replace(job, script=b"", hostname=f"vm{rank}", network=network_of(addresses, rank, ssh))
        fields = {k: v for k, v in mine.__dict__.items() if k not in ("script", "skipped")}
        size = sizes[nodes[rank]]
        return {"image": settings.image, "memory_mb": size.memory_mib, "vcpus": size.vcpus, "job": fields}

    members = Members(nodes[1:], host=cfg.agent.member_address, secret=secret)
    try:
        members.launch(args.rms, config=getattr(args, "config", None) or os.environ.get("VJOB_CONFIG"))
        members.join()
        op_timeout = prov.operation_timeout_for(max(s.memory_mib for s in sizes.values()))  # vjob.save_time
        remotes = members.vms(names[1:], addresses[0].subnet_id, driver, op_timeout)
        vms = JobVMs(driver, name, nodes, addresses[0].subnet_id, spec, remotes, describe, site=site)
        return Pilot(settings, pdir, vms, replay=replay).run()  # type: ignore[arg-type]
    finally:
        members.close()


def _run_member(cfg: Config, args: argparse.Namespace, node: str, job_id: str) -> int:
    """A member pilot: connect to its leader, learnt the way its RMS's launcher passes it
    (pilot.members.launch), then obey it (pilot.members.member); its VM's tap comes from its
    own node's node service where the site runs one (pilot.site_network)."""
    call = launcher(args.rms).calling(os.environ, node, leader=args.leader or "", nonce=args.nonce or "", stdin_fd=0)
    node = call.node
    os.environ.pop(TOKEN_ENV, None)  # nothing this process starts needs it
    prov = user_provisioning(cfg.provisioning, node)
    link = connect(call.leader, call.token, node)
    driver = open_driver(cfg, prov)

    def spec(msg: dict[str, Any], vm: str, rank: int, workdir: Path | None) -> Any:
        """`workdir` None: the leader built and sent the job disk (pilot.members.workdir)."""
        job = member_job(msg.get("job"))
        local = check_image(str(msg.get("image", "")), cfg, node)
        memory = msg.get("memory_mb")
        if (
            not isinstance(memory, int)
            or isinstance(memory, bool)
            or not REAL_MIN_MEMORY_MIB <= memory <= MAX_MEMORY_MIB
        ):
            raise InputError(f"memory_mb = {str(memory)[:20]!r}: must be MiB, at least {REAL_MIN_MEMORY_MIB}")
        vcpus = msg.get("vcpus", 1)  # a leader of before the sizing sends none: one vCPU, as it had
        if not isinstance(vcpus, int) or isinstance(vcpus, bool) or not 1 <= vcpus <= MAX_CPUS:
            raise InputError(f"vcpus = {str(vcpus)[:20]!r}: must be 1..{MAX_CPUS}")
        if local is None or job.network is None:
            raise InputError(f"image = {msg.get('image')!r}: a member pilot runs a real image on the job's network")
        nic = msg.get("site_nic")  # the member's own (pilot.members.member), never the leader's
        if isinstance(nic, site_network.SiteNic):
            job = dataclasses.replace(job, network=site_network.with_site(job.network, nic))
        nics = site_network.domain_nics(nic) if isinstance(nic, site_network.SiteNic) else None
        disk = driver.job_disk_path(vm, node)
        safe_dirs.ensure_dir(disk.parent, 0o711)
        if workdir is not None:
            _build_disk(prov, workdir, job, disk)
        nics = nics or (Nic(str(job.network["mac"]), str(msg["bridge"])),)
        own = real_spec(local, vm, memory, disk, cpu_model=prov.cpu_model, vcpus=vcpus)
        return dataclasses.replace(own, nics=nics)

    # the member's VM is measured on its node like a leader's (pilot.usage); its rank is not
    # known yet, so a root member's meter takes every member name of the job
    usage = for_pilot(PilotSettings(args.rms, job_id, node), network.MAX_VMS)
    try:

        def site(vm_id: int) -> site_network.SiteLink:
            return site_network.SiteLink(cfg, args.rms, job_id, node, [vm_id])

        usage.start()
        return Member(link, driver, node, spec, member_workdir.own_workdir(), site).serve()
    finally:
        usage.final()
        driver.close()
