"""`vjob besteffort submit|manager|list|show|cancel`: the Saline wrapper's commands.

Users submit with `vjob besteffort submit [OAR options] -- COMMAND` and otherwise keep using
oarstat (their OAR job is named after the vjob key); the site runs `vjob besteffort manager`.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import sys
import time
from typing import Any

from vjob.errors import CommandError, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("besteffort", help="Saline: best-effort OAR jobs that survive being killed")
    bsub = p.add_subparsers(dest="besteffort_command", metavar="ACTION", required=True)

    s = bsub.add_parser("submit", help="submit a best-effort vjob: vjob besteffort submit [options] -- COMMAND ...")
    s.add_argument("--image", required=True, help="OS image from the catalogue")
    s.add_argument("--vms", type=int, default=1, help="number of VMs (one OAR resource each)")
    s.add_argument("--vcpus", type=int, default=1)
    s.add_argument("--memory", type=int, default=128, help="MiB per VM")
    s.add_argument("-l", "--walltime", dest="walltime", default=None, help="H:MM:SS (default saline.default_walltime)")
    s.add_argument("--site", default=None, help="site to start at (default: the first with free resources)")
    s.add_argument("--user", default=None, help="submit for this user (root only)")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...], run inside the VMs")
    s.set_defaults(func=_submit)

    m = bsub.add_parser("manager", help="run the job manager (snapshots, kill detection, resubmission)")
    m.add_argument("--once", action="store_true", help="one pass, then exit")
    m.set_defaults(func=_manager)

    ls = bsub.add_parser("list", help="best-effort vjobs and their state")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_list)

    sh = bsub.add_parser("show", help="one vjob with its journal")
    sh.add_argument("key")
    sh.set_defaults(func=_show)

    c = bsub.add_parser("cancel", help="end a vjob: delete its OAR job, VMs and snapshots")
    c.add_argument("key")
    c.set_defaults(func=_cancel)


def build(args: argparse.Namespace) -> Any:
    """The manager of the configured sites (imports kept here: `vjob --help` stays fast)."""
    from provisioning.driver import Driver
    from saline_bew import sites
    from saline_bew.manager import Manager
    from saline_bew.vms import SalineVMs
    from vjob.cli import load_config
    from vjob.store.db import open_store

    config = load_config(args)
    store = open_store(config)
    driver = Driver(config.provisioning, data_dir=config.data_path, store=store)
    return Manager(config, store, sites.from_config(config), SalineVMs(driver, store))


def _submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("vjob besteffort submit: missing COMMAND after --")
    me = pwd.getpwuid(os.getuid()).pw_name
    user = args.user or me
    if args.user and os.geteuid() != 0 and args.user != me:
        raise UsageError(f"--user {args.user}: only root may submit for another user")
    manager = build(args)
    try:
        job = manager.submit(
            user=user,
            image=args.image,
            command=command,
            vm_count=args.vms,
            vcpus=args.vcpus,
            memory_mb=args.memory,
            walltime=args.walltime,
            site=args.site,
        )
    except CommandError as exc:
        raise CommandError(
            exc.command, f"{exc} — the vjob is recorded and the manager will submit it when OAR answers"
        ) from None
    print(f"{job.key} oar_job={job.oar_job_id} site={job.site}")
    return 0


def _manager(args: argparse.Namespace) -> int:
    manager = build(args)
    if args.once:
        manager.step()
        return 0
    stopping: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        stopping.append(signum)  # finish the current pass, then leave: every step is journalled

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    manager.run(stop=lambda: bool(stopping))
    return 0


def _list(args: argparse.Namespace) -> int:
    from saline_bew import journal
    from vjob.cli import load_config
    from vjob.store.db import open_store

    store = open_store(load_config(args))
    rows = journal.all_jobs(store)
    if args.json:
        json.dump([_row(j) for j in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "user", "phase", "site", "oar job", "kills", "from scratch", "safe snapshot")
    for j in rows:
        safe = (
            f"{j.snapshot_label}@{j.snapshot_site} ({time.strftime('%H:%M:%S', time.localtime(j.snapshot_at))})"
            if (j.snapshot_label and j.snapshot_at)
            else "none"
        )
        table.add_row(
            j.key, j.user, j.phase, j.site, j.oar_job_id or "-", str(j.kills), str(j.restarts_from_scratch), safe
        )
    Console().print(table)
    return 0


def _row(j: Any) -> dict[str, Any]:
    return {
        "key": j.key,
        "user": j.user,
        "phase": j.phase,
        "site": j.site,
        "oar_job_id": j.oar_job_id,
        "hosts": list(j.hosts),
        "kills": j.kills,
        "restarts_from_scratch": j.restarts_from_scratch,
        "snapshot_label": j.snapshot_label,
        "snapshot_site": j.snapshot_site,
        "snapshot_at": j.snapshot_at,
        "error": j.error,
    }


def _show(args: argparse.Namespace) -> int:
    from saline_bew import journal
    from vjob.cli import load_config
    from vjob.store.db import open_store

    store = open_store(load_config(args))
    job = journal.get(store, args.key)
    out = _row(job)
    out["journal"] = [
        {"at": e.at, "kind": e.kind, "site": e.site, "oar_job_id": e.oar_job_id, **e.detail}
        for e in journal.events(store, args.key)
    ]
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    manager = build(args)
    job = manager.cancel(args.key)
    manager.step()  # cleans the snapshots and identities at once
    print(f"{job.key} cancelled")
    return 0
