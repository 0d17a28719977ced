"""The commands the OpenPBS hook runs on a MoM to save and restore a job's VM — with or
without the state store.

    python3 -m plugins.pbs.hook_vm [--config FILE] save|restore VM --node NODE [--also VM@NODE ...]
    python3 -m plugins.pbs.hook_vm [--config FILE] flush

Why not `vjob vm save|restore`: those open the store first, so with the database down
`execjob_preresume` failed and every suspended job stayed suspended until it came back (issue
23 item 11), though all a restore needs is on the node: the memory state file and its
integrity manifest, written next to it by the save. Here the store is tried once (its
`connect_timeout_s`); when it is unreachable the VM is saved or restored from those local files
alone and what the store should have been told is written to a pending record in
`<data_dir>/pbs-pending/` (root's, 0700; each record 0600, created with O_EXCL|O_NOFOLLOW under
a random name, then renamed). The next save, restore or `flush` that reaches the store applies
the pending records first, oldest first, so the store catches up as soon as it is back.

A store that answers but refuses (schema too old or too new) is not an outage: the command
fails as `vjob vm restore` would, since writing through the wrong schema corrupts it.

A multi-node job's VMs (`vjob-pbs-<job id>-<rank>`, one per node, docs/multinode.md) are
saved and restored together by the mother superior's hook: `--also VM@NODE` names each other VM
and its node (reached through [provisioning.nodes]), and all of them go through
provisioning.coordinated: every VM paused before any is saved, all restored paused before any
runs. One pending record per VM when the store is down.

Exit status: 0 done; 1 the VM operation failed (the hook then refuses the resume with the last
line printed); 2 bad usage. The VM name and node name are checked (`re.fullmatch`) before
anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select

from plugins.pbs import names
from provisioning import coordinated
from provisioning.coordinated import Member
from provisioning.driver import Driver
from vjob import config as vconfig
from vjob.errors import InputError, SchemaOutdatedError, SchemaTooNewError, StoreError, VjobError
from vjob.model import VMState
from vjob.store.db import Store, now, open_store
from vjob.store.schema import SnapshotRecord, VMRecord

PENDING_DIR = "pbs-pending"
MAX_RECORD_BYTES = 1 << 16
VM_NAME_PREFIX = "vjob-pbs-"


def check_vm(value: str) -> str:
    """`vjob-pbs-<PBS job id>`, the name the pilot gives a PBS job's VM, or
    `vjob-pbs-<job id>-<rank>` for each VM of a multi-node job; nothing else."""
    if not value.startswith(VM_NAME_PREFIX):
        raise InputError(f"vm = {value[:80]!r}: not a PBS job's VM (vjob-pbs-<job id>)")
    rest = value[len(VM_NAME_PREFIX) :]
    ranked = re.fullmatch(r"(.+)-[0-9]{1,3}", rest)
    if ranked is not None and names.JOB_ID.fullmatch(ranked.group(1)):
        return value
    names.job_id(rest, field=f"vm = {value[:80]!r}: job id")
    return value


# -- pending records ---------------------------------------------------------------------------
def pending_dir(cfg: vconfig.Config) -> Path:
    """The root-owned directory of records not yet in the store (created 0700, checked)."""
    path = cfg.data_path / PENDING_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise VjobError(f"{path}: must be a directory owned by uid {os.geteuid()}, mode 0700")
    return path


def write_pending(cfg: vconfig.Config, record: dict[str, Any]) -> Path:
    """Keep `record` for the store; never follows a planted symlink, never overwrites."""
    directory = pending_dir(cfg)
    stem = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    temp = directory / f".{stem}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    final = directory / f"{stem}.json"
    os.rename(temp, final)
    return final


def _read_pending(path: Path) -> dict[str, Any]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise InputError(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise InputError(f"{path}: not JSON") from None
    if not isinstance(record, dict) or record.get("op") not in ("saved", "restored"):
        raise InputError(f"{path}: op = {record.get('op') if isinstance(record, dict) else record!r}: unknown")
    for key in ("vm", "node", "state_path"):
        if not isinstance(record.get(key), str):
            raise InputError(f"{path}: {key} missing or not a string")
    check_vm(record["vm"])
    names.node(record["node"], field=f"{path}: node")
    return record


def _apply(store: Store, record: dict[str, Any]) -> None:
    """Tell the store what the driver would have told it, had it been reachable."""
    with store.session() as s:
        vm = s.scalar(select(VMRecord).where(VMRecord.name == record["vm"]))
        if record["op"] == "restored":
            for snap in s.scalars(select(SnapshotRecord).where(SnapshotRecord.path == record["state_path"])):
                s.delete(snap)
            if vm is not None:
                vm.node, vm.state, vm.updated_at = record["node"], VMState.RUNNING.value, now()
                vm.overlay_path = str(record.get("overlay_path") or vm.overlay_path)
            return
        if vm is None:
            return  # a VM the store never knew: nothing to record it under
        vm.state, vm.updated_at = VMState.SAVED.value, now()
        snap = s.scalar(select(SnapshotRecord).where(SnapshotRecord.path == record["state_path"]))
        if snap is None:
            snap = SnapshotRecord(job_id=vm.job_id, vm_name=vm.name, path=record["state_path"], location_kind="node")
            s.add(snap)
        snap.kind, snap.location = "memory", record["node"]
        snap.size_bytes, snap.sha256 = int(record["size_bytes"]), str(record["sha256"])
        snap.created_at = float(record["created_at"])


def flush(cfg: vconfig.Config, store: Store) -> int:
    """Apply every pending record to `store`, oldest first; the number applied."""
    applied = 0
    for path in sorted(pending_dir(cfg).glob("*.json")):
        try:
            record = _read_pending(path)
        except InputError as exc:
            print(f"vjob: pending record skipped: {exc}", file=sys.stderr)
            path.rename(path.with_suffix(".bad"))
            continue
        _apply(store, record)
        path.unlink()
        applied += 1
    return applied


# -- the commands --------------------------------------------------------------------------------
def _store_or_none(cfg: vconfig.Config) -> Store | None:
    """The store, flushed; None when it is unreachable (an outage, not a refusal)."""
    try:
        store = open_store(cfg)
    except (SchemaOutdatedError, SchemaTooNewError):
        raise
    except StoreError as exc:
        print(f"vjob: store unavailable, working from the node's files: {exc}", file=sys.stderr)
        return None
    try:
        flush(cfg, store)
    except StoreError as exc:  # cut between the check and the flush: the records stay pending
        print(f"vjob: store unavailable, working from the node's files: {exc}", file=sys.stderr)
        store.close()
        return None
    return store


def parse_member(value: str) -> tuple[str, str]:
    """`--also VM@NODE`: another VM of the same multi-node job and the node it is on."""
    vm, sep, node = value.partition("@")
    if not sep:
        raise InputError(f"--also {value[:80]!r}: must be VM@NODE")
    return check_vm(vm), names.node(node, field=f"--also {value[:80]!r}: node")


def run(cfg: vconfig.Config, action: str, vm: str, node: str, also: Sequence[tuple[str, str]] = ()) -> str:
    """Save or restore `vm` on `node` (with the other VMs of its job, `also`, as one cut);
    what happened, in one line."""
    check_vm(vm)
    names.node(node, field="--node")
    members = [(vm, node), *also]
    if len({v for v, _n in members}) != len(members):
        raise InputError(f"--also: a VM is named twice: {[v for v, _n in members]}")
    store = _store_or_none(cfg)
    records: list[dict[str, Any]] = []
    try:
        with Driver(cfg.provisioning, data_dir=cfg.data_path, store=store) as driver:
            if action == "save" and also:
                cut = coordinated.checkpoint(driver, [Member(v, n) for v, n in members])
                snaps = [cut.snapshots[v] for v, _n in members]
            elif action == "save":
                snaps = [driver.save(vm, node)]
            elif also:
                coordinated.restore(driver, [Member(v, n) for v, n in members])
            else:
                driver.restore(vm, node)
            for i, (v, n) in enumerate(members):
                record: dict[str, Any] = {"vm": v, "node": n, "state_path": str(driver.state_path(v, n))}
                if action == "save":
                    snap = snaps[i]
                    record |= {"size_bytes": snap.size_bytes, "sha256": snap.sha256, "created_at": snap.created_at}
                else:
                    record["overlay_path"] = str(driver.overlay_path(v, n))
                records.append(record)
    finally:
        if store is not None:
            store.close()
    done = "saved" if action == "save" else "restored"
    what = f"VM {vm} {done} on {node}" if not also else f"{len(members)} VMs of the job {done} in one cut"
    if store is None:
        for record in records:
            write_pending(cfg, {"op": done, **record})
        return f"{what} (store unreachable: recorded once it is back)"
    return what


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m plugins.pbs.hook_vm",
        description="Save or restore a PBS job's VM for the OpenPBS hook, with or without the state store.",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="configuration file (default $VJOB_CONFIG, /etc/vjob/vjob.toml)"
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for action in ("save", "restore"):
        one = sub.add_parser(action, help=f"{action} vjob-pbs-<job id> on this node")
        one.add_argument("vm", help="the VM name, vjob-pbs-<PBS job id>")
        one.add_argument("--node", required=True, help="this MoM's node name, as in [provisioning.nodes]")
        one.add_argument(
            "--also",
            action="append",
            default=[],
            metavar="VM@NODE",
            help="another VM of the same multi-node job and its node (all go in one cut)",
        )
    sub.add_parser("flush", help="write the records kept while the store was unreachable")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        cfg = vconfig.load(args.config)
        if args.action == "flush":
            store = open_store(cfg)
            try:
                print(f"{flush(cfg, store)} pending record(s) written to the store")
            finally:
                store.close()
            return 0
        print(run(cfg, args.action, args.vm, args.node, [parse_member(m) for m in args.also]))
        return 0
    except VjobError as exc:
        print(f"vjob: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
