"""`vjob besteffort submit|manager|list|show|cancel|output|stage`: the Saline wrapper's commands.

Users submit with `vjob besteffort submit [OAR options] -- COMMAND` and otherwise keep using
oarstat (their OAR job is named after the vjob key); the site runs `vjob besteffort manager`.

Why `submit`, `list`, `show` and `cancel` talk to the manager's socket (saline_bew.server)
instead of opening the store: the store's credentials are the operator's, and the manager
learns who the caller is from the kernel, so it can act for that user only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from saline_bew import client, lease, protocol, server, sites, workdir
from saline_bew.events import Phase
from vjob.cli import load_config
from vjob.config import ProvisioningConfig
from vjob.errors import InputError, UsageError
from vjob.sdnotify import Notifier
from vjob.store.db import open_store


def register(sub: Any) -> None:
    """`vjob besteffort` and its actions, one function per action (in the order `--help` lists them)."""
    p = sub.add_parser(
        "besteffort",
        help="Saline: best-effort OAR jobs that survive being killed",
        description="Best-effort vjobs on OAR (Saline): snapshotted periodically and on OAR's checkpoint "
        "signal, resubmitted from their last snapshot at this site or another when OAR kills them. Users "
        "talk to the site's manager through its socket; the manager runs as root.",
        epilog="example: vjob besteffort submit --image debian12 --vms 2 -l 2:00:00 -- ./simulate.sh 42",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        help="the manager's socket path (default $VJOB_SALINE_SOCKET, else saline.socket for the manager, "
        "else /run/vjob/saline.sock)",
    )
    bsub = p.add_subparsers(dest="besteffort_command", metavar="ACTION", required=True)
    _add_submit(bsub)
    _add_manager(bsub)
    _add_queries(bsub)
    _add_output(bsub)
    _add_stage(bsub)


def _add_submit(bsub: Any) -> None:
    """submit: a user's vjob, their current directory going with it (saline_bew.workdir)."""
    s = bsub.add_parser(
        "submit",
        help="submit a best-effort vjob: vjob besteffort submit [options] -- COMMAND ...",
        description="Submit a best-effort vjob; prints its key (OAR's job is named after it).",
        epilog="example: vjob besteffort submit --image debian12 --memory 512 -- python3 fit.py --steps 1000",
    )
    s.add_argument("--image", metavar="IMAGE", required=True, help="OS image from the catalogue")
    s.add_argument("--vms", metavar="N", type=int, default=1, help="number of VMs (one OAR resource each)")
    s.add_argument("--vcpus", metavar="N", type=int, default=1, help="virtual CPUs per VM (default 1)")
    s.add_argument("--memory", metavar="MIB", type=int, default=128, help="MiB per VM")
    s.add_argument(
        "-l",
        "--walltime",
        metavar="H:MM:SS",
        dest="walltime",
        default=None,
        help="H:MM:SS (default saline.default_walltime)",
    )
    s.add_argument(
        "--site", metavar="SITE", default=None, help="site to start at (default: the first with free resources)"
    )
    s.add_argument(
        "--user", metavar="USER", default=None, help="submit for this user (root only, checked by the manager)"
    )
    s.add_argument(
        "--no-workdir",
        action="store_true",
        help="do not copy the current directory to the first VM's /work (by default it is, as on Slurm)",
    )
    s.add_argument(
        "--stage-limit-mb",
        metavar="MB",
        type=int,
        default=ProvisioningConfig().stage_limit_mb,
        help="refuse a current directory bigger than this (the manager enforces the site's own limit too)",
    )
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...], run inside the VMs")
    s.set_defaults(func=_submit)


def _add_manager(bsub: Any) -> None:
    """manager: the site master, run as root by its systemd unit."""
    m = bsub.add_parser(
        "manager",
        help="run the job manager (snapshots, kill detection, resubmission)",
        description="The site master: runs as root (systemd unit: vjob deploy install saline-unit), listens on "
        "the socket, snapshots, detects kills and resubmits.",
        epilog="example: vjob --config /etc/vjob/vjob.toml besteffort manager --socket-group vjobusers",
    )
    m.add_argument("--once", action="store_true", help="one pass, then exit (no socket)")
    m.add_argument(
        "--socket-group",
        metavar="GROUP",
        default=None,
        help="only this group (and root) may use the socket (mode 0660); default saline.socket_group, "
        "empty: everyone (0666)",
    )
    m.set_defaults(func=_manager)


def _add_queries(bsub: Any) -> None:
    """list, show, cancel: a user's look at (and hand on) their own vjobs."""
    ls = bsub.add_parser(
        "list",
        help="your best-effort vjobs and their state (root: everyone's)",
        description="Your best-effort vjobs (root: everyone's), one line each: key, state, site, kills.",
        epilog="example: vjob besteffort list --json",
    )
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.set_defaults(func=_list)

    sh = bsub.add_parser(
        "show",
        help="one of your vjobs with its journal",
        description="One of your vjobs with its journal: submissions, snapshots, kills, resumptions.",
        epilog="example: vjob besteffort show be0123456789",
    )
    sh.add_argument("key", help="the vjob's key, as submit printed it (be + 10 hex digits)")
    sh.set_defaults(func=_show)

    c = bsub.add_parser(
        "cancel",
        help="end one of your vjobs: delete its OAR job, VMs and snapshots",
        description="End one of your vjobs: the manager holding it deletes its OAR job, VMs and snapshots.",
        epilog="example: vjob besteffort cancel be0123456789",
    )
    c.add_argument("key", help="the vjob's key, as submit printed it (be + 10 hex digits)")
    c.set_defaults(func=_cancel)


def _add_output(bsub: Any) -> None:
    """output: what COMMAND printed, passed as a descriptor of root's copy (saline_bew.output)."""
    o = bsub.add_parser(
        "output",
        help="what COMMAND printed (its stdout, or --stderr)",
        description="What COMMAND printed in the first VM: up to the last snapshot while it runs, all of it once "
        "it ended (kept 7 days). Its exit status is in `show` (exit_code).",
        epilog="example: vjob besteffort output be0123456789 > result.txt",
    )
    o.add_argument("key", help="the vjob's key")
    o.add_argument("--stderr", action="store_true", help="its standard error instead")
    o.add_argument("--both", action="store_true", help="its stdout to stdout and its stderr to stderr")
    o.set_defaults(func=_output)


def _add_stage(bsub: Any) -> None:
    """stage: the holder's half of an oarsub vjob's directory (saline_bew.staging)."""
    st = bsub.add_parser(
        "stage",
        help="(run by the holder of an oarsub vjob) send the current directory to the first VM",
        description="Run by the OAR job of a vjob submitted with oarsub, as the user, in the submission directory: "
        "builds its job disk with the user's rights and passes it to the manager (as submit does).",
        epilog="example (holder.sh, as OAR runs it): vjob besteffort --socket /run/vjob/saline.sock stage be0123456789",
    )
    st.add_argument("key", help="the vjob's key")
    st.add_argument(
        "--stage-limit-mb",
        metavar="MB",
        type=int,
        default=ProvisioningConfig().stage_limit_mb,
        help="refuse a directory bigger than this",
    )
    st.set_defaults(func=_stage)


def build(args: argparse.Namespace) -> Any:
    """The manager of the configured sites (imports kept here: the driver loads libvirt, and
    `vjob --help` stays fast)."""
    from provisioning.driver import Driver  # heavy: libvirt
    from saline_bew.manager import Manager  # heavy: libvirt (through the driver)
    from saline_bew.vms import SalineVMs, nat_network  # heavy: libvirt (through the driver)

    config = load_config(args)
    store = open_store(config)
    driver = Driver(config.provisioning, data_dir=config.data_path, store=store)
    return Manager(
        config,
        store,
        sites.from_config(config),
        SalineVMs(driver, store, nat_network=nat_network(config.saline)),
        owner=lease.host_owner(),
    )


def _call(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    return client.call(protocol.socket_path(args.socket), request)


def _submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("vjob besteffort submit: missing COMMAND after --")
    request: dict[str, Any] = {
        "op": "submit",
        "image": args.image,
        "command": command,
        "vms": args.vms,
        "vcpus": args.vcpus,
        "memory": args.memory,
        "walltime": args.walltime,
        "site": args.site,
        "user": args.user,
    }
    if args.no_workdir:
        job = _call(args, request)
    else:
        job = _submit_with_workdir(args, request)
    print(f"{job['key']} oar_job={job['oar_job_id']} site={job['site']}")
    return 0


def _submit_with_workdir(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    """Build the working directory's disk as the user (saline_bew.workdir) and pass it open
    with the request: the manager (root) never opens a path of the user's."""
    with _workdir_disk(request["command"], args.stage_limit_mb) as fd:
        return client.call(protocol.socket_path(args.socket), request, fd=fd)


@contextlib.contextmanager
def _workdir_disk(command: list[str], limit_mb: int) -> Iterator[int]:
    """The current directory's job disk, built with the caller's rights, open for reading."""
    with tempfile.TemporaryDirectory(prefix="vjob-submit-") as tmp:
        disk = Path(tmp) / f"work{workdir.SUFFIX}"
        workdir.build_for_user(Path.cwd(), command, disk, limit_bytes=limit_mb * 2**20)
        fd = os.open(disk, os.O_RDONLY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)


def _output(args: argparse.Namespace) -> int:
    """Copy the descriptor the manager passed (its own copy of the output) to stdout (stderr)."""
    streams = ("stdout", "stderr") if args.both else ("stderr",) if args.stderr else ("stdout",)
    for stream in streams:
        request = {"op": "output", "key": args.key, "stream": stream}
        _result, fds = client.call_fd(protocol.socket_path(args.socket), request)
        if not fds:
            raise UsageError("vjob besteffort output: the manager sent no output descriptor")
        try:
            out = sys.stdout.buffer if stream == "stdout" or not args.both else sys.stderr.buffer
            while chunk := os.read(fds[0], 1 << 20):
                out.write(chunk)
            out.flush()
        finally:
            for fd in fds:
                os.close(fd)
    return 0


def _stage(args: argparse.Namespace) -> int:
    """The holder's half of `oarsub` staging: the directory's job disk, built as the user;
    a directory that cannot be sent is declined with the reason (the manager goes on at once)."""
    path = protocol.socket_path(args.socket)
    try:
        with _workdir_disk(["-"], args.stage_limit_mb) as fd:
            client.call(path, {"op": "stage", "key": args.key}, fd=fd)
    except InputError as exc:  # too big, a file the user cannot read: said, and nothing waits for it
        client.call(path, {"op": "stage", "key": args.key, "declined": str(exc)[:1000]})
        raise
    print(f"vjob {args.key}: {Path.cwd()} sent to the first VM's /work", file=sys.stderr)
    return 0


def _manager(args: argparse.Namespace) -> int:
    manager = build(args)
    ports = manager.ports
    _one_manager_per_host(ports.config.data_path)
    if args.once:
        try:
            manager.step()
        finally:
            lease.release_all(ports.store, ports.owner)
        return 0
    stopping: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        stopping.append(signum)  # finish the current pass, then leave: every step is journalled

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    cfg = ports.cfg
    path = protocol.socket_path(args.socket, configured=cfg.socket)
    with server.Server(
        manager,
        path,
        group=args.socket_group or cfg.socket_group or None,
        per_user=cfg.socket_connections_per_user,
        total=cfg.socket_connections,
        read_timeout_s=cfg.socket_read_timeout_s,
    ):
        if cfg.metrics_port:
            ports.metrics.serve(cfg.metrics_port, cfg.metrics_address)
        Notifier().ready("listening on the Saline socket")
        manager.run(stop=lambda: bool(stopping))
    return 0


def _one_manager_per_host(data_dir: Path) -> None:
    """Hold an exclusive lock for the life of the process: two managers on one host would
    share the host's lease owner name, and so would both act on the same vjobs."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / "saline-manager.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(
            f"another Saline manager runs on this host ({data_dir / 'saline-manager.lock'} is locked)"
        ) from None
    _HELD.append(fd)  # kept open (and locked) until the process ends


_HELD: list[int] = []


def _list(args: argparse.Namespace) -> int:
    rows = _call(args, {"op": "list"})
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "user", "phase", "site", "oar job", "kills", "from scratch", "safe snapshot")
    for j in rows:
        safe = (
            f"{j['snapshot_label']}@{j['snapshot_site']} "
            f"({time.strftime('%H:%M:%S', time.localtime(j['snapshot_at']))})"
            if (j["snapshot_label"] and j["snapshot_at"])
            else "none"
        )
        table.add_row(
            j["key"],
            j["user"],
            j["phase"],
            j["site"],
            j["oar_job_id"] or "-",
            str(j["kills"]),
            str(j["restarts_from_scratch"]),
            safe,
        )
    Console().print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    json.dump(_call(args, {"op": "show", "key": args.key}), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    out = _call(args, {"op": "cancel", "key": args.key})
    if out["phase"] == Phase.CANCELLED:
        print(f"{out['key']} cancelled")
    else:
        print(f"{out['key']} cancel requested (the manager holding it carries it out within a pass)")
    return 0
