"""`vjob uninstall`: remove what vjob put on this host, keep the store unless asked.

Why it refuses while vjobs run: their VMs are the jobs' work; removing them (and the units that
restore them) ends those jobs. `--force` drains first (vjob drain: checkpointed jobs released,
priorities the RMS's own again), then removes everything, the running vjobs' VMs included.

What goes, in this order: the VMs the store records for this RMS (through the VM driver) and
their rows; the units `vjob deploy install` recorded (stopped and disabled first, under systemd
on this host); every other file it recorded (hooks, man page, dashboards, rules, examples) —
a file edited since it was installed is kept and named, unless `--purge`; the node service's
socket; the files the agent writes beside slurm.conf (wake file, VM sizes, deadline threshold);
the pilot directories; everything else under `data_dir`. The store (the SQLite file, or the
PostgreSQL tables) stays, with its history, unless `--purge-store`. What lives in the RMS's own
configuration (slurm.conf's JobSubmitPlugins, the PBS hook imported with qmgr, torque.cfg's
SUBMITFILTER, OAR's admission rules) is printed as the next step: vjob does not edit the RMS's
configuration.
"""

from __future__ import annotations

import argparse
import json
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.drain_cmd import drain
from plugins import deploy_manifest, make_adapter
from vjob.cli import load_config
from vjob.errors import CommandError, StoreError, UsageError, VjobError

EPILOG = """\
examples:
  vjob uninstall                      refuses while vjobs run; else removes units, hooks, man page,
                                      VMs, runtime files; keeps the store and edited files
  vjob uninstall --force              drain first (vjob drain), then remove even running vjobs' VMs
  vjob uninstall --purge --purge-store   edited files and the store too: nothing of vjob left
  vjob uninstall --root /srv/stage    what `vjob deploy install --root /srv/stage` put there

Exit 0 when everything it removes is gone, 1 when vjobs run (without --force) or something
could not be removed (named on stderr), 2 on bad usage."""

SYSTEMD = Path("/run/systemd/system")
"""Present when this host runs systemd (sd_booted)."""
NEXT_STEPS = {
    "slurm-job-submit": "slurm.conf still names JobSubmitPlugins=lua: remove it (or keep a job_submit.lua of "
    "your own) and run `scontrol reconfigure`",
    "pbs-hook": "remove the hook from the PBS server: qmgr -c 'delete hook vjob'",
    "torque-filter": "remove the SUBMITFILTER line from $TORQUE_HOME/torque.cfg",
    "oar-admission-rule": "remove vjob's OAR admission rules: vjob oar uninstall-rules (before this command)",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "uninstall",
        help="remove what vjob deploy installed, the VMs and runtime files (the store is kept)",
        description="Remove vjob from this host: the VMs the store records, the units, hooks, man page and "
        "other files `vjob deploy install` recorded, the node service's socket, the pilot directories and "
        "data_dir. Refused while vjobs run, unless --force (which drains first).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rms", choices=("slurm", "pbs", "oar"), help="the resource manager (default: [agent] rms)")
    p.add_argument("--force", action="store_true", help="drain first, then remove even while vjobs run")
    p.add_argument("--purge", action="store_true", help="remove installed files edited since, too")
    p.add_argument("--purge-store", action="store_true", help="remove the state store as well")
    p.add_argument("--root", type=Path, metavar="DIR", help="what `vjob deploy install --root DIR` recorded")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=_uninstall)


@dataclass
class Removal:
    """What an uninstall did."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Files kept on purpose (edited since installed; the store)."""
    failed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _uninstall(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    rms = args.rms or cfg.agent.rms
    if rms == "sim":
        raise UsageError("vjob uninstall: --rms sim has no live resource manager")
    root = args.root.resolve() if args.root is not None else Path("/")
    from vjob.store.db import open_store  # heavy: sqlalchemy

    open_store(cfg).close()  # unreachable: stop here (its VMs could not be found), exit 1 naming it
    running, why = running_vjobs(cfg, rms)
    if (running or why) and not args.force:
        what = f"vjobs still run: {' '.join(running)}" if running else why
        raise VjobError(f"{what}: let them finish, or --force (drains first, then removes their VMs too)")
    out = Removal()
    if args.force:
        _drain_first(cfg, rms, out)
    uninstall(cfg, rms, root, out, purge=args.purge, purge_store=args.purge_store)
    if args.json:
        print(json.dumps(out.__dict__, sort_keys=True))
    else:
        for path in out.removed:
            print(f"removed   {path}")
        for path in out.kept:
            print(f"kept      {path}")
    for note in out.notes:
        print(f"vjob: note: {note}", file=sys.stderr)
    for failure in out.failed:
        print(f"vjob: error: {failure}", file=sys.stderr)
    return 1 if out.failed else 0


def running_vjobs(cfg: Any, rms: str) -> tuple[list[str], str]:
    """The jobs the RMS runs that have a pilot directory here; with no pilot directory, none
    (the RMS is not asked). ("", why) when it could not be told."""
    from vjob.pilot_files import all_dirs, pilot_root  # heavy: pydantic

    dirs = {d.job_id for d in all_dirs(pilot_root(cfg), rms)}
    if not dirs:
        return [], ""
    try:
        jobs = make_adapter(rms, cfg).jobs()
    except (CommandError, VjobError) as exc:
        return [], f"cannot tell whether the vjobs with pilot directories still run ({exc})"
    return sorted(j.id for j in jobs if j.id in dirs and j.state.value in ("running", "suspended")), ""


def _drain_first(cfg: Any, rms: str, out: Removal) -> None:
    try:
        done = drain(cfg, rms, wait=True, timeout_s=max(60.0, 3 * cfg.agent.interval_s))
        out.notes.append(f"drained first ({len(done.released)} checkpointed jobs released)")
    except VjobError as exc:
        out.notes.append(f"could not drain first, going on (--force): {exc}")


def uninstall(cfg: Any, rms: str, root: Path, out: Removal, *, purge: bool, purge_store: bool) -> None:
    """Everything but the refusal: see the module's docstring for the order."""
    _remove_vms(cfg, rms, out)
    recorded = deploy_manifest.entries(root)
    units = {p: e for p, e in recorded.items() if e.get("name", "").endswith("-unit")}
    under_systemd = root == Path("/") and SYSTEMD.is_dir()
    for path in units:
        if under_systemd:
            _systemctl(["disable", "--now", Path(path).name], out)
    gone: list[str] = []
    for path, entry in sorted(recorded.items()):
        if _remove_recorded(Path(path), entry, out, purge=purge):
            gone.append(path)
            if entry.get("name") in NEXT_STEPS:
                out.notes.append(NEXT_STEPS[entry["name"]])
    if units and under_systemd:
        _systemctl(["daemon-reload"], out)
    elif units:
        out.notes.append("not under systemd here (or --root): the unit files were removed, nothing was stopped")
    deploy_manifest.forget(root, gone)
    for path in _runtime_files(cfg, rms):
        _remove_path(path, out)
    _empty_data_dir(cfg, rms, out, keep_store=not purge_store)
    if purge_store:
        _purge_store(cfg, out)


def _remove_vms(cfg: Any, rms: str, out: Removal) -> None:
    """The VMs the store records for `rms`, deleted where they are, then their rows."""
    from sqlalchemy import select  # heavy: sqlalchemy

    from vjob.store import vms as store_vms  # heavy: sqlalchemy
    from vjob.store.db import open_store  # heavy: sqlalchemy
    from vjob.store.schema import JobRecord, VMRecord  # heavy: sqlalchemy

    try:
        store = open_store(cfg)
    except StoreError as exc:
        out.failed.append(f"state store: {exc}: the VMs it records could not be looked up")
        return
    try:
        with store.session() as s:
            rows = s.execute(
                select(JobRecord.rms_job_id, VMRecord.name, VMRecord.node)
                .join(JobRecord, VMRecord.job_id == JobRecord.id)
                .where(JobRecord.rms == rms)
            ).all()
        if not rows:
            return
        from provisioning.driver import Driver  # heavy: libvirt-python

        driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
        try:
            for job, vm, node in rows:
                try:
                    if node:
                        driver.delete(vm, node)
                    store_vms.forget(store, rms, job)
                    out.removed.append(f"VM {vm} on {node or '-'} (job {job})")
                except VjobError as exc:
                    out.failed.append(f"VM {vm} on {node}: {exc}")
        finally:
            driver.close()
    except ImportError as exc:
        out.failed.append(f"the store records VMs, but the VM driver cannot load ({exc}): pip install 'vjob[vm]'")
    finally:
        store.close()


def _systemctl(args: list[str], out: Removal) -> None:
    try:
        subprocess.run(["systemctl", *args], check=True, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        out.failed.append(f"systemctl {' '.join(args)}: {detail.strip()[:200]}")


def _remove_recorded(path: Path, entry: dict[str, Any], out: Removal, *, purge: bool) -> bool:
    """A file deploy recorded: removed unless edited since (then kept, unless `purge`)."""
    if not path.exists() and not path.is_symlink():
        return True
    if path.is_symlink() or not path.is_file():
        out.failed.append(f"{path}: no longer the regular file vjob installed: left alone")
        return False
    if not purge and deploy_manifest.digest(path) != entry["sha256"]:
        out.kept.append(f"{path} (edited since it was installed; --purge removes it)")
        return False
    if not _remove_path(path, out):
        return False
    for parent in path.parents:  # the directories deploy made for vjob (/etc/vjob, .../libexec/vjob)
        if "vjob" not in parent.name:
            break
        try:
            parent.rmdir()
        except OSError:
            break  # not empty: another file of vjob's (removed later) or the operator's
    return True


def _remove_path(path: Path, out: Removal) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            return True
    except OSError as exc:
        out.failed.append(f"{path}: {exc.strerror}")
        return False
    out.removed.append(str(path))
    return True


def _runtime_files(cfg: Any, rms: str) -> list[Path]:
    """What vjob's programs made outside data_dir: the node service's socket (if it is one) and,
    on Slurm, the files the agent writes beside slurm.conf for job_submit.lua — at the paths
    the configuration names (--root is only where deploy installed)."""
    found: list[Path] = []
    if cfg.node.socket:
        sock = Path(cfg.node.socket)
        try:
            if stat.S_ISSOCK(sock.lstat().st_mode):
                found.append(sock)
        except OSError:
            pass
    if rms == "slurm":
        from agent.deadline_threshold import threshold_path  # heavy: pydantic
        from plugins.slurm.environment import wake_file  # heavy: sqlalchemy
        from plugins.slurm.vm_sizes import sizes_file  # heavy: sqlalchemy

        conf = cfg.slurm.conf or "/etc/slurm/slurm.conf"
        beside = [wake_file(conf), sizes_file(conf), threshold_path(cfg, rms)]
        found += [Path(p) for p in beside if p is not None]
    return found


def _store_files(cfg: Any) -> set[Path]:
    url = str(cfg.database_url)
    if not url.startswith("sqlite:///"):
        return set()
    db = Path(url.removeprefix("sqlite:///").split("?")[0])
    return {db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), db.with_name(db.name + "-journal")}


def _empty_data_dir(cfg: Any, rms: str, out: Removal, *, keep_store: bool) -> None:
    """The pilot directories and everything under data_dir but the store (when kept)."""
    from vjob.pilot_files import pilot_root  # heavy: pydantic

    data = Path(cfg.data_path)
    if len(data.resolve().parts) < 3:
        out.failed.append(f"data_dir {data}: too close to / to empty it; remove vjob's files there by hand")
        return
    pilots = pilot_root(cfg)
    if pilots.is_dir() and not pilots.is_symlink() and data not in pilots.parents:
        _remove_path(pilots, out)
    if not data.is_dir():
        return
    store = _store_files(cfg) if keep_store else set()
    for item in sorted(data.iterdir()):
        if item in store or (item.name == deploy_manifest.MANIFEST.name and item.parent == data):
            if item in store and item.exists():
                out.kept.append(f"{item} (the state store; --purge-store removes it)")
            continue
        _remove_path(item, out)


def _purge_store(cfg: Any, out: Removal) -> None:
    for path in _store_files(cfg):
        if path.exists():
            _remove_path(path, out)
    if not str(cfg.database_url).startswith("sqlite"):
        out.notes.append("a PostgreSQL store is not dropped by vjob: `vjob db downgrade base` removes its tables")


__all__ = ["Removal", "register", "running_vjobs", "uninstall"]
