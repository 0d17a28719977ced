"""`vjob besteffort submit|manager|list|show|cancel|output|stage`: the Saline wrapper's commands.

Users submit with `vjob besteffort submit [OAR options] -- COMMAND` and otherwise keep using
oarstat (their OAR job is named after the vjob key); the site runs `vjob besteffort manager`.

Why `submit`, `list`, `show` and `cancel` talk to the manager's socket (saline_bew.server)
instead of opening the store: the store's credentials are the operator's, and the manager
learns who the caller is from the kernel, so it can act for that user only. The options are
declared in saline_bew.cli_args, which imports this module only when an action runs.
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
from vjob import text_table
from vjob.cli import load_config
from vjob.config import ProvisioningConfig
from vjob.errors import InputError, UsageError
from vjob.sdnotify import Notifier
from vjob.store.db import open_store


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


def submit_cmd(args: argparse.Namespace) -> int:
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
    with _workdir_disk(request["command"], _stage_limit_mb(args)) as fd:
        return client.call(protocol.socket_path(args.socket), request, fd=fd)


def _stage_limit_mb(args: argparse.Namespace) -> int:
    """--stage-limit-mb, else the built-in [provisioning] stage_limit_mb (as the manager's own)."""
    return int(args.stage_limit_mb) if args.stage_limit_mb is not None else ProvisioningConfig().stage_limit_mb


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


def output_cmd(args: argparse.Namespace) -> int:
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


def stage_cmd(args: argparse.Namespace) -> int:
    """The holder's half of `oarsub` staging: the directory's job disk, built as the user;
    a directory that cannot be sent is declined with the reason (the manager goes on at once)."""
    path = protocol.socket_path(args.socket)
    try:
        with _workdir_disk(["-"], _stage_limit_mb(args)) as fd:
            client.call(path, {"op": "stage", "key": args.key}, fd=fd)
    except InputError as exc:  # too big, a file the user cannot read: said, and nothing waits for it
        client.call(path, {"op": "stage", "key": args.key, "declined": str(exc)[:1000]})
        raise
    print(f"vjob {args.key}: {Path.cwd()} sent to the first VM's /work", file=sys.stderr)
    return 0


def manager_cmd(args: argparse.Namespace) -> int:
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
            ports.metrics.serve(cfg.metrics_port, cfg.metrics_address, cfg.metrics_web_config)
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


def list_cmd(args: argparse.Namespace) -> int:
    rows = _call(args, {"op": "list"})
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    # Plain aligned columns (vjob.text_table, as `vjob status`): full headers in 80 columns (a row
    # becomes a block of `header: value` lines when they do not fit), no box drawing in a pipe.
    cells = []
    for j in rows:
        safe = (
            f"{j['snapshot_label']}@{j['snapshot_site']} "
            f"({time.strftime('%H:%M:%S', time.localtime(j['snapshot_at']))})"
            if (j["snapshot_label"] and j["snapshot_at"])
            else "none"
        )
        cells.append(
            [j["key"], j["user"], j["phase"], j["site"], j["oar_job_id"], j["kills"], j["restarts_from_scratch"], safe]
        )
    headers = ("key", "user", "phase", "site", "OAR job", "kills", "from scratch", "safe snapshot")
    sys.stdout.write(text_table.render("best-effort vjobs", headers, cells, text_table.terminal_width(sys.stdout)))
    return 0


def show_cmd(args: argparse.Namespace) -> int:
    json.dump(_call(args, {"op": "show", "key": args.key}), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cancel_cmd(args: argparse.Namespace) -> int:
    out = _call(args, {"op": "cancel", "key": args.key})
    if out["phase"] == Phase.CANCELLED:
        print(f"{out['key']} cancelled")
    else:
        print(f"{out['key']} cancel requested (the manager holding it carries it out within a pass)")
    return 0
